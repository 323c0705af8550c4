"""Keep what a case measured: the JSON record on disk first, then the report files, then MLflow.

    record = run_recorded("lr_sweep", config, run_dir)      # train, write, (render,) track

The order is the point: the record is written into the run directory before anything talks to
a tracking store, so an unreachable server or a killed process never loses a measured figure
(``stability upload`` sends it later). The plots and the report are rendered here, not in
``stability.tracking``, and handed to it as artifact files.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from stability.record import write_record
from stability.rundir import ensure_run_dir


def report_artifacts(record: dict, directory: Path) -> list[tuple[Path, str]]:
    """Render the one-record report into ``directory``: (file, MLflow artifact directory) pairs."""
    from stability.report import write_report

    paths = write_report([record], directory / "report.html")
    return [(paths["html"], "report"), (paths["markdown"], "report")] + [(p, "plots") for p in paths["plots"]]


def keep(record: dict, run_dir: str | Path, tracking_uri: str | None = None, experiment: str | None = None,
         track: bool = True, plots: bool = True) -> dict:
    """Write ``record`` into ``run_dir``, then (``track``) log it to MLflow with the report as artifacts
    (``plots``). The record gains ``record_path``, ``tracking`` and ``timing.tracking_seconds``."""
    run_dir = ensure_run_dir(run_dir)
    path = write_record(record, run_dir)
    record["record_path"] = str(path)
    if track:
        from stability.tracking import log_to_mlflow

        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="stability-report-") as tmp:
            artifacts = report_artifacts(record, Path(tmp)) if plots else []
            record["tracking"] = log_to_mlflow(record, tracking_uri, experiment, artifacts)
        record.setdefault("timing", {})["tracking_seconds"] = time.perf_counter() - started
        write_record(record, run_dir)
    return record


def run_recorded(kind: str, config, run_dir: str | Path, tracking_uri: str | None = None,
                 experiment: str | None = None, track: bool = True, plots: bool = True) -> dict:
    """Run the stress case ``kind`` on ``config`` and keep its record (see ``keep``)."""
    from stability.stress import run_case

    return keep(run_case(kind, config), run_dir, tracking_uri, experiment, track, plots)
