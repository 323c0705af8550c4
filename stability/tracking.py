"""The local JSON record (written first, the source of truth) and its copy in MLflow.

``write_record`` writes a pair record atomically under ``reports/runs/``; non-finite
numbers become ``null`` so the file is strict JSON. ``log_to_mlflow`` then sends it:
one parent run per pair, one child run per arm and seed, params flattened from the
config, per-step metrics in batches, tags with the git commit and versions. A store that
cannot be reached never loses anything: the JSON stays, the failure is returned (and
reported once by the caller), and ``stability upload`` can send the file later.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_RECORD_DIR = Path("reports") / "runs"
STEP_METRICS = ("loss", "lr", "grad_norm", "loss_scale", "batch_size")


def clean(value):
    """Recursively replace NaN / Inf floats with None so the record is strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def record_path(record: dict, directory: Path | str = DEFAULT_RECORD_DIR) -> Path:
    """Stable path of a record: <dir>/<created>-<name>-<schedule>-<id>.json (the id is set once)."""
    record.setdefault("id", uuid.uuid4().hex[:8])
    stamp = record["created_at"].replace(":", "").replace("-", "").replace("+0000", "Z")[:15]
    return Path(directory) / f"{stamp}-{record['name']}-{record['schedule']}-{record['id']}.json"


def write_record(record: dict, directory: Path | str = DEFAULT_RECORD_DIR) -> Path:
    """Write the record as strict JSON, atomically (a killed writer leaves the previous version)."""
    path = record_path(record, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(clean(record), indent=1, allow_nan=False))
    os.replace(tmp, path)
    return path


def read_record(path: Path | str) -> dict:
    """Load a record, with a clear error for unreadable files and unknown schema versions."""
    from stability.experiment import SCHEMA_VERSION

    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"record {str(path)!r} cannot be read as JSON: {error}") from None
    version = record.get("schema_version") if isinstance(record, dict) else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"record {str(path)!r} has schema_version={version!r}: this version of stability reads "
                         f"schema_version={SCHEMA_VERSION}")
    return record


def resolve_tracking_uri(uri: str | None = None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else a local SQLite file ``mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def flatten(mapping: dict, prefix: str = "") -> dict[str, str]:
    """{"run": {"model": {"d_model": 64}}} -> {"run.model.d_model": "64"}."""
    out = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)[:500]
    return out


def _tags(record: dict) -> dict[str, str]:
    git, env = record.get("git") or {}, record.get("env") or {}
    tags = {"stability.preset": record["preset"], "stability.schedule": record["schedule"],
            "stability.record_id": record.get("id", ""), "mlflow.note.content": record.get("description", "")}
    tags.update({f"git.{k}": str(v) for k, v in git.items()})
    tags.update({f"env.{k}": str(v) for k, v in env.items()})
    if git.get("commit"):
        tags["mlflow.source.git.commit"] = git["commit"]
    return tags


def _finite_metrics(figures: dict, prefix: str = "") -> dict[str, float]:
    return {f"{prefix}{k}": float(v) for k, v in figures.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)} | {
        f"{prefix}{k}": float(v) for k, v in figures.items() if isinstance(v, bool)}


def _log_batched(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    """log_batch in chunks within MLflow's limits (1000 metrics, 100 params, 100 tags per call)."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start:start + 100])
    for start in range(0, len(tags), 100):
        client.log_batch(run_id, tags=tags[start:start + 100])


def arm_status(arm: dict) -> str:
    return {"killed": "KILLED", "error": "FAILED"}.get(arm["status"], "FINISHED")


def log_to_mlflow(record: dict, tracking_uri: str | None = None, experiment: str | None = None,
                  artifacts: list[Path] = ()) -> dict:
    """Send a pair record to MLflow; returns {"status": "tracked", ids...} or {"status": "not tracked", "error"}."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    uri = resolve_tracking_uri(tracking_uri)
    try:
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        name = experiment or f"stability-{record['name']}"
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else client.create_experiment(name)
        tags = _tags(record)
        parent = client.create_run(experiment_id, run_name=f"{record['name']}-{record['schedule']}", tags=tags)
        parent_id = parent.info.run_id
        now = int(time.time() * 1000)
        params = [Param(k, v) for k, v in flatten(record["config"]).items()]
        paired = {f"paired.{figure}.{key}": value for figure, summary in record.get("paired", {}).items()
                  for key, value in summary.items() if key in ("baseline", "gated", "difference", "ci_low",
                                                               "ci_high", "p_value")}
        _log_batched(client, parent_id, params=params,
                     metrics=[Metric(k, v, now, 0) for k, v in _finite_metrics(paired).items()])
        children = {}
        for arm in record["arms"]:
            child = client.create_run(experiment_id, run_name=f"{arm['arm']}-seed{arm['seed']}",
                                      tags={**tags, "mlflow.parentRunId": parent_id, "stability.arm": arm["arm"],
                                            "stability.variant": arm["variant"], "stability.status": arm["status"],
                                            "stability.seed": str(arm["seed"])})
            series = arm["series"]
            metrics = [Metric(key, float(value), now, int(step))
                       for key in STEP_METRICS for step, value in zip(series["step"], series[key])
                       if value is not None and math.isfinite(value)]
            metrics += [Metric(k, v, now, 0) for k, v in _finite_metrics(arm["final"], "final.").items()]
            _log_batched(client, child.info.run_id, metrics=metrics,
                         params=[Param("arm", arm["arm"]), Param("variant", arm["variant"]),
                                 Param("seed", str(arm["seed"]))])
            client.set_terminated(child.info.run_id, status=arm_status(arm))
            children[f"{arm['arm']}-seed{arm['seed']}"] = child.info.run_id
        for path in artifacts:
            client.log_artifact(parent_id, str(path))
        status = "KILLED" if record.get("status") == "killed" else "FINISHED"
        client.set_terminated(parent_id, status=status)
        return {"status": "tracked", "uri": uri, "experiment": name, "experiment_id": experiment_id,
                "parent_run_id": parent_id, "child_run_ids": children}
    except Exception as error:  # any store failure: keep going, the JSON record already holds everything
        return {"status": "not tracked", "uri": uri, "error": f"{type(error).__name__}: {error}"}
