"""Keep what a case measured: the JSON record on disk first, then the report files, then MLflow.

    record = run_recorded("lr_sweep", config, run_dir)      # train, write, (render,) track

The order is the point: the record is written into the run directory before anything talks to
a tracking store, so an unreachable server or a killed process never loses a measured figure
(``stability upload`` sends it later). The plots and the report are rendered here, not in
``stability.track.runs``, and handed to it as artifact files. While the case trains, a
``stability.session.session.Session`` keeps the record, per-step files and checkpoints on disk after every
run (and the live MLflow runs going); on Ctrl-C the partial record is kept the same way and
``Interrupted`` goes on up to the command.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from stability.record import (
    Status,
    add_tracking_seconds,
    mark_case_killed,
    set_record_path,
    set_tracking,
    write_record,
)
from stability.record.rundir import ensure_run_dir


def report_artifacts(record: dict, directory: Path) -> list[tuple[Path, str]]:
    """Render the one-record report into ``directory``: (file, MLflow artifact directory) pairs."""
    from stability.report.html import write_report

    paths = write_report([record], directory / "report.html")
    return [(paths["html"], "report"), (paths["markdown"], "report")] + [(p, "plots") for p in paths["plots"]]


def keep(record: dict, run_dir: str | Path, tracking_uri: str | None = None, experiment: str | None = None,
         track: bool = True, plots: bool = True, session=None) -> dict:
    """Write ``record`` into ``run_dir``, then (``track``) log it to MLflow with the report as artifacts
    (``plots``). The record gains ``record_path``, ``tracking`` and ``timing.tracking_seconds``.
    ``session``: its live MLflow runs are completed instead of new ones made; when its live tracking
    failed, the record stays "not tracked" (the failure was reported once). The MLflow run ids the record
    holds stay in it, on disk, until the result of tracking replaces them (a second Ctrl-C while it is
    sent leaves them there for the resume)."""
    run_dir = ensure_run_dir(run_dir)
    path = write_record(record, run_dir)
    set_record_path(record, str(path))
    tracker = getattr(session, "tracker", None)
    if track and tracker is not None and tracker.failed:
        set_tracking(record, {**(record.get("tracking") or {}), **tracker.status()})
        write_record(record, run_dir)
    elif track:
        from stability.track.runs import log_to_mlflow

        live = session.live_runs(record) if session is not None else None
        if tracker is not None and tracker.failed:
            set_tracking(record, {**(record.get("tracking") or {}), **tracker.status()})
        else:
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(prefix="stability-report-") as tmp:
                artifacts = report_artifacts(record, Path(tmp)) if plots else []
                set_tracking(record, log_to_mlflow(record, tracking_uri, experiment, artifacts, live=live))
            add_tracking_seconds(record, time.perf_counter() - started)
        write_record(record, run_dir)
    return record


def run_recorded(case: str, config, run_dir: str | Path, tracking_uri: str | None = None,
                 experiment: str | None = None, track: bool = True, plots: bool = True, session=None,
                 runner=None) -> dict:
    """Run the stress case ``case`` on ``config`` and keep its record (see ``keep``). ``runner``: who
    trains the runs (None: this process; ``stability.cases.ray_runner.RayRunner``: Ray tasks).

    Without a ``session``, one that keeps the record and per-step files in ``run_dir`` after every run
    (no live tracking, no lock: pytest-xdist workers share a run directory). On Ctrl-C the partial
    record is kept (and its MLflow runs marked killed) before ``Interrupted`` is raised again."""
    from stability.cases.experiment import Interrupted
    from stability.cases.stress import run_case
    from stability.session.session import Session

    session = session or Session(run_dir, label="cases")
    try:
        record = run_case(case, config, session=session, runner=runner)
    except KeyboardInterrupt as stop:
        record = stopped_record(stop, session)
        if record is None:
            raise
        keep(record, run_dir, tracking_uri, experiment, track, plots=False, session=session)
        raise Interrupted(record) from None
    return keep(record, run_dir, tracking_uri, experiment, track, plots, session=session)


def stopped_record(stop: KeyboardInterrupt, session) -> dict | None:
    """The case record a Ctrl-C stopped: the one ``Interrupted`` carries, else the session's case in flight
    (marked killed), else None (nothing was measured yet)."""
    record = getattr(stop, "record", None)
    if record is None and session is not None and session.current is not None \
            and session.current.get("status") == Status.RUNNING:
        record = session.current
        mark_case_killed(record)
    return record
