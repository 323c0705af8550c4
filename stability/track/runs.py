"""The copy of a record in MLflow (the JSON record, written first by the caller, is the source of truth).

``log_to_mlflow`` sends a case record: one parent run per stress case, one child run per arm and
seed (as many arms as the record holds; each child carries its arm's definition as ``arm.*``
params), params flattened from the config, per-step metrics in batches, tags with the git commit and
versions, and whatever artifact files the caller made (the record itself, plots, the report; this
module renders nothing). A store that cannot be reached never loses anything: the JSON stays, the
failure is returned (and reported once by the caller), and ``stability upload`` can send the file
later. When the runs were created live during training (``stability.track.live``), it completes
those runs instead of creating new ones; of a run made in an earlier process (a resumed case) it
sends only the points of the per-step and probe series the store does not hold yet (``held_points``).

How it looks in the MLflow UI: one experiment per preset (``stability-<preset>``), typed as a
model-training experiment (tag ``mlflow.experimentKind`` = ``custom_model_development``); a parent
run per case, named after it (``standard``, ``lr_sweep``, ``shock-jump``...); child runs named by arm,
seed and, in sweeps, LR (``gated-seed1-lr0.03``); tags ``case``, ``arm``, ``variant``, ``seed`` and
``status`` to filter and group by; start and end times those of the training. ``runs_url`` gives
the link that opens the runs table (MLflow 3.17's UI otherwise opens on its GenAI view).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from stability.config import flatten
from stability.record import Status, case_key, case_name, write_json
from stability.track.store import open_client, sqlite_path, store_lock

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
STEP_METRICS = ("loss", "lr", "grad_norm", "update_norm", "loss_scale", "batch_size")
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"      # MLflow 3: what the UI shows for an experiment
EXPERIMENT_KIND = "custom_model_development"       # "Machine learning" (model training), not GenAI
FAILURE_COOLDOWN_S = 60.0          # after a store failure, skip that store for this long (no repeated waits)
CONNECT_TIMEOUT_S = 3.0            # TCP pre-check of an http(s) tracking server
LOCK_RETRIES = 12                  # attempts on "database is locked"


def resolve_tracking_uri(uri: str | None = None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else a local SQLite file ``mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def params_of(config: dict) -> dict[str, str]:
    """{"run": {"model": {"d_model": 64}}} -> {"run.model.d_model": "64"} (MLflow params are strings)."""
    return {key: str(value)[:500] for key, value in flatten(config).items()}


def _finite_metrics(figures: dict, prefix: str = "") -> dict[str, float]:
    return {f"{prefix}{k}": float(v) for k, v in figures.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)} | {
        f"{prefix}{k}": float(v) for k, v in figures.items() if isinstance(v, bool)}


def _log_batched(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    """log_batch in chunks within MLflow's limits (1000 metrics, 100 params, 100 tags per call)."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    for start in range(0, len(metrics), 1000):
        _retry(client.log_batch, run_id, metrics=metrics[start:start + 1000])
    for start in range(0, len(params), 100):
        _retry(client.log_batch, run_id, params=params[start:start + 100])
    for start in range(0, len(tags), 100):
        _retry(client.log_batch, run_id, tags=tags[start:start + 100])



# ----------------------------------------------------------------------------- store access
# (opening a store, a new one included, and the lock of a SQLite store: stability.track.store)

def _is_locked_error(error: BaseException) -> bool:
    text = str(error).lower()
    return "database is locked" in text or "database table is locked" in text


def _retry(fn, *args, **kwargs):
    """Call ``fn``, retrying with backoff while SQLite says "database is locked" (a reader elsewhere)."""
    for attempt in range(LOCK_RETRIES):
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if not _is_locked_error(error) or attempt == LOCK_RETRIES - 1:
                raise
            time.sleep(min(2.0, 0.05 * 2 ** attempt))


def check_reachable(uri: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """For an http(s) store, a TCP connect first: a closed port fails in milliseconds, a silent host in
    ``timeout`` seconds, instead of MLflow's minutes of retries."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https"):
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            pass
    except OSError as error:
        raise ConnectionError(f"tracking server {parsed.hostname}:{port} is unreachable ({error})") from None


def _artifact_location(uri: str, name: str) -> str | None:
    """Artifacts of a SQLite store live next to the DB file (not in the current directory's ./mlruns)."""
    db = sqlite_path(uri)
    if db is None:
        return None
    return (db.resolve().parent / "mlartifacts" / name).as_uri()


_FAILED: dict[str, tuple[float, str]] = {}   # uri -> (time of failure, message): fail fast, report once
_REPORTED: set[str] = set()


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text[:300]}"


def report_failure(tracking: dict, record_file: Path | str | None = None, stream=None) -> bool:
    """Print a store failure once per store and process (one line, no traceback); True if printed."""
    if tracking.get("status") == "tracked":
        return False
    uri = tracking.get("uri", "")
    if uri in _REPORTED:
        return False
    _REPORTED.add(uri)
    later = f"; send it later with `stability upload {record_file}`" if record_file else \
        "; send the records later with `stability upload reports/runs/*.json`"
    print(f"mlflow: NOT TRACKED at {uri} ({tracking.get('error')}); the JSON record holds everything{later}",
          file=stream or sys.stderr, flush=True)
    return True


# ----------------------------------------------------------------------------- what is sent

def describe(record: dict) -> str:
    """One line saying what was stressed, for the MLflow run description."""
    config = record.get("config") or {}
    run = config.get("run") or {}
    model, optim, precision = run.get("model") or {}, run.get("optim") or {}, run.get("precision") or {}
    variants = dict.fromkeys(f"{a['arm']} ({a.get('variant')})" for a in record.get("arms") or [])
    fault = run.get("fault") or {}
    parts = [f"{record.get('preset')}/{record.get('name')}: schedule {record.get('schedule')}"
             + (f" ({record['description']})" if record.get("description") else ""),
             "arms " + (", ".join(variants) or ", ".join(a.get("name", "?") for a in config.get("arms") or [])),
             (f"{model.get('n_layers')}L d{model.get('d_model')}, {precision.get('dtype')}, "
              f"peak lr {optim.get('lr')}, {run.get('steps')} steps, seeds {config.get('seeds')}")]
    if fault.get("kind") not in (None, "none"):
        parts.append(f"fault {fault.get('kind')} at step {fault.get('step')}")
    return "; ".join(str(p) for p in parts).replace("\n", " ")


def run_name(record: dict) -> str:
    """The parent run's name: the case's schedule (which names the case and its variant, e.g. shock-jump),
    the config name when it is not the preset's, the purpose when it is not a regression run."""
    name = str(record.get("schedule") or case_name(record))
    if record.get("name") not in (None, record.get("preset")):
        name = f"{record['name']} {name}"
    if record.get("purpose", "regression") != "regression":
        name += f" ({record['purpose']})"
    return name


def child_name(arm: dict) -> str:
    """A child run's name: the one its training was given (arm, seed and the swept LR or precision), else
    ``<arm>-seed<seed>``."""
    return str(arm.get("run_name") or f"{arm['arm']}-seed{arm['seed']}")


def child_tags(record: dict, arm: dict, parent_id: str | None) -> dict[str, str]:
    """The tags of one arm's child run: what the UI filters and groups by, and where it belongs."""
    tags = {**_tags(record), "stability.level": "arm", "stability.arm": str(arm["arm"]),
            "stability.variant": str(arm.get("variant")), "stability.status": str(arm.get("status")),
            "stability.seed": str(arm["seed"]), "arm": str(arm["arm"]), "variant": str(arm.get("variant")),
            "seed": str(arm["seed"]), "status": str(arm.get("status")),
            "mlflow.note.content": f"{arm['arm']} arm ({arm.get('variant')}), seed {arm['seed']}: "
                                   f"{arm.get('status')}" + (f" - {arm['stop_reason']}" if arm.get("stop_reason")
                                                             else ""),
            **{f"precision.{key}": str(value) for key, value in (arm.get("precision") or {}).items()}}
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    return tags


def _ms(seconds) -> int | None:
    return int(seconds * 1000) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None


def arm_times(arm: dict) -> tuple[int | None, int | None]:
    """(start, end) of an arm's training in ms since the epoch, from its timing (None when unknown)."""
    timing = arm.get("timing") or {}
    return _ms(timing.get("started_at")), _ms(timing.get("ended_at"))


def case_times(record: dict) -> tuple[int | None, int | None]:
    """(start, end) of a case: its first arm's start and its last arm's end, in ms since the epoch."""
    times = [arm_times(a) for a in record.get("arms") or []] + [
        (_ms(r.get("started_at")), _ms(r.get("ended_at"))) for r in record.get("runs") or []]
    starts = [t for t, _ in times if t is not None]
    ends = [t for _, t in times if t is not None]
    return (min(starts) if starts else None), (max(ends) if ends else None)


def runs_url(ui: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI link of an experiment's runs table (or of one run), in the model-training view."""
    base = f"{ui.rstrip('/')}/#/experiments/{experiment_id}"
    return f"{base}/runs/{run_id}?workflowType=machine_learning" if run_id else \
        f"{base}/runs?workflowType=machine_learning"


LOCAL_UI = "http://127.0.0.1:5000"   # where `mlflow ui` serves by default


def ui_address(uri: str) -> str:
    """Where the MLflow UI of a store is: the server itself for an http(s) store, else `mlflow ui`'s default."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else LOCAL_UI


def where_to_look(uri: str, experiment_id: str) -> str:
    """Where an experiment's runs are watched while they train: its runs-table link and, for a store without a
    server (a SQLite file), the command that starts the UI on it."""
    link = f"runs table: {runs_url(ui_address(uri), experiment_id)}"
    if uri.startswith(("http://", "https://")):
        return link
    db = sqlite_path(uri)
    store = f"sqlite:///{db.resolve()}" if db is not None else uri
    return f"{link} (start the UI with `mlflow ui --backend-store-uri {store}`)"


def ensure_experiment(client, uri: str, name: str) -> str:
    """The id of experiment ``name`` (created when missing), typed as a model-training experiment."""
    found = _retry(client.get_experiment_by_name, name)
    experiment_id = found.experiment_id if found else _create_experiment(client, uri, name)
    if found is None or found.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        try:
            _retry(client.set_experiment_tag, experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        except Exception:  # another writer set it at the same moment (PostgreSQL: a unique-key violation)
            again = client.get_experiment_by_name(name)
            if again is None or again.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                raise
    return experiment_id


def experiment_name(record: dict, experiment: str | None = None) -> str:
    """``experiment``, else $STABILITY_EXPERIMENT, else ``stability-<preset>`` (one experiment per preset)."""
    return experiment or os.environ.get("STABILITY_EXPERIMENT") or f"stability-{record['preset']}"


def parent_tags(record: dict) -> dict[str, str]:
    return {**_tags(record), "case": case_name(record), "status": str(record.get("status"))}


def _tags(record: dict) -> dict[str, str]:
    git, env = record.get("git") or {}, record.get("env") or {}
    tags = {"stability.preset": str(record.get("preset")), "stability.schedule": str(record.get("schedule")),
            "stability.name": str(record.get("name")), "stability.case": case_key(record),
            "stability.purpose": str(record.get("purpose")), "stability.record_id": str(record.get("id", "")),
            "stability.status": str(record.get("status")), "stability.level": "pair",
            "case": case_name(record), "mlflow.note.content": describe(record)}
    tags.update({f"git.{k}": str(v) for k, v in git.items()})
    tags.update({f"env.{k}": str(v) for k, v in env.items()})
    model = ((record.get("config") or {}).get("run") or {}).get("model") or {}
    tags.update({"stability.model_source": "factory" if model.get("factory") else str(model.get("source", "harness")),
                 "stability.model_family": str(model.get("family", "llama")),
                 "stability.data.builtin": str((record.get("corpus") or {}).get("kind", ""))})
    if git.get("commit"):
        tags["mlflow.source.git.commit"] = git["commit"]
    if git.get("branch"):
        tags["mlflow.source.git.branch"] = git["branch"]
    return tags


def _numbers(mapping, prefix: str) -> dict[str, float]:
    """Flatten the finite numbers of a nested dict/list into metric names (for quant figures)."""
    out = {}
    if isinstance(mapping, dict):
        for key, value in mapping.items():
            out.update(_numbers(value, f"{prefix}.{key}"))
    elif isinstance(mapping, bool) or isinstance(mapping, (int, float)) and math.isfinite(mapping):
        out[prefix] = float(mapping)
    return out


def arm_definition(record: dict, name: str) -> dict[str, str]:
    """The arm's definition from the record's config, as params: {"arm.gate.position": "G1", ...}."""
    for arm in (record.get("config") or {}).get("arms") or []:
        if isinstance(arm, dict) and arm.get("name") == name:
            return {f"arm.{k}": v for k, v in params_of({k: v for k, v in arm.items() if k != "name"}).items()}
    return {}


def held_points(client, run_id: str) -> set[tuple[str, int]]:
    """The (metric, step) points of the per-step and probe series a run already holds in the store: what
    a run continued in another process (a resumed arm) must not send again."""
    keys = [key for key in _retry(client.get_run, run_id).data.metrics
            if key in STEP_METRICS or key.startswith("probe.")]
    return {(key, point.step) for key in keys for point in _retry(client.get_metric_history, run_id, key)}


def _arm_metrics(arm: dict, now: int, with_steps: bool = True, held: set | frozenset = frozenset()):
    """The metrics of one arm's child run; ``held``: (metric, step) points of the series already in the
    store, left out (summary figures are sent again: their latest value is the one shown)."""
    from mlflow.entities import Metric

    series = arm.get("series") or {}
    steps = series.get("step") or [] if with_steps else []
    metrics = [Metric(key, float(value), now, int(step))
               for key in STEP_METRICS for step, value in zip(steps, series.get(key) or [])
               if isinstance(value, (int, float)) and value is not None and math.isfinite(value)
               and (key, int(step)) not in held]
    for snapshot in arm.get("probes") or []:
        step = int(snapshot.get("step", 0))
        for index, layer in enumerate(snapshot.get("layers") or []):
            for key, value in layer.items():
                if isinstance(value, (int, float)) and math.isfinite(value) \
                        and (f"probe.{key}.layer{index}", step) not in held:
                    metrics.append(Metric(f"probe.{key}.layer{index}", float(value), now, step))
    metrics += [Metric(k, v, now, 0) for k, v in _finite_metrics(arm.get("final") or {}, "final.").items()]
    for point in (arm.get("extrapolation") or {}).get("points") or []:  # curves: step = sequence length
        for key in ("heldout_loss", "f_attn", "sink_rate"):
            value = point.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                metrics.append(Metric(f"extrap.{key}.{point['rope']}", float(value), now, int(point["length"])))
    quant = arm.get("quant") or {}  # quant.<scheme>.<figure> (and quant.full_precision.<figure>)
    metrics += [Metric(k, v, now, 0) for k, v in _numbers(
        {"full_precision": quant.get("full_precision"), **(quant.get("schemes") or {})}, "quant").items()]
    return metrics


MLFLOW_STATUS = {Status.KILLED: "KILLED", Status.RUNNING: "KILLED", Status.ERROR: "FAILED"}   # else FINISHED


def arm_status(arm: dict) -> str:
    return MLFLOW_STATUS.get(arm.get("status"), "FINISHED")


def record_status(record: dict) -> str:
    return MLFLOW_STATUS.get(record.get("status"), "FINISHED")


def log_to_mlflow(record: dict, tracking_uri: str | None = None, experiment: str | None = None,
                  artifacts=(), live: dict | None = None) -> dict:
    """Send a pair record to MLflow; returns {"status": "tracked", ids...} or {"status": "not tracked", "error"}.

    One experiment per preset (see ``experiment_name``); a parent run per stress case (named and tagged by
    its case), a child run per arm and seed. Artifacts of the parent: the JSON record (``record/``) and the
    caller's ``artifacts``, (path, artifact directory) pairs such as the plots and the report. ``live``: the
    runs made while training (``LiveTracker.runs_of``): they are completed (their per-step metrics are
    there already) rather than created again. A SQLite store is written under a file lock (parallel
    workers); an http store is probed first so a dead server fails in seconds. Never raises on a store
    failure."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    uri = resolve_tracking_uri(tracking_uri)
    failed = _FAILED.get(uri)
    if failed and time.monotonic() - failed[0] < FAILURE_COOLDOWN_S:
        return {"status": "not tracked", "uri": uri, "error": f"{failed[1]} (failed earlier; not retried for "
                                                               f"{FAILURE_COOLDOWN_S:.0f} s)"}
    live = live if live and live.get("uri") == uri and live.get("parent_run_id") else None
    parent_id = client = None
    try:
        check_reachable(uri)
        from mlflow.entities import Metric, Param, RunTag

        with tempfile.TemporaryDirectory(prefix="stability-artifacts-") as tmp:
            copy = write_json(Path(tmp) / "record" / f"{record['name']}-{record['schedule']}-{record.get('id')}.json",
                              {k: v for k, v in record.items() if not k.startswith("_")})
            files = [(copy, "record"), *((Path(p), d) for p, d in artifacts)]
            client = open_client(uri)
            with store_lock(uri):
                name = experiment_name(record, experiment)
                experiment_id = live["experiment_id"] if live else ensure_experiment(client, uri, name)
                start, end = case_times(record)
                tags = parent_tags(record)
                if live:
                    parent_id = live["parent_run_id"]
                    _log_batched(client, parent_id, tags=[RunTag(k, v) for k, v in tags.items()])
                else:
                    parent_id = _retry(client.create_run, experiment_id, start_time=start, tags=tags,
                                       run_name=run_name(record)).info.run_id
                now = int(time.time() * 1000)
                params = [] if live and live.get("params_logged") else \
                    [Param(k, v) for k, v in params_of(record["config"]).items()]
                paired = {f"paired.{arm}.{figure}.{key}": value
                          for arm, table in (record.get("paired") or {}).items()
                          for figure, summary in table.items() for key, value in summary.items()
                          if key in ("baseline", "treatment", "difference", "ci_low", "ci_high", "p_value")}
                _log_batched(client, parent_id, params=params,
                             metrics=[Metric(k, v, now, 0) for k, v in _finite_metrics(paired).items()])
                children = {}
                live_children = (live or {}).get("child_run_ids") or {}
                for arm in record["arms"]:
                    key = child_name(arm)
                    arm_start, arm_end = arm_times(arm)
                    child_id = live_children.get(key)
                    if child_id is None:
                        child_id = _retry(client.create_run, experiment_id, start_time=arm_start,
                                          tags=child_tags(record, arm, parent_id), run_name=key).info.run_id
                        arm_params = [Param("arm", arm["arm"]), Param("variant", str(arm.get("variant"))),
                                      Param("seed", str(arm["seed"]))] + [
                            Param(k, v) for k, v in arm_definition(record, arm["arm"]).items()]
                    else:
                        _log_batched(client, child_id, tags=[RunTag(k, v) for k, v in
                                                             child_tags(record, arm, parent_id).items()])
                        arm_params = []
                    with_steps = key not in ((live or {}).get("complete_children") or ())
                    # a child run made in an earlier process (a resumed case) already holds part of its series
                    held = held_points(client, child_id) if key in live_children and with_steps else frozenset()
                    _log_batched(client, child_id, metrics=_arm_metrics(arm, now, with_steps, held), params=arm_params)
                    _retry(client.set_terminated, child_id, status=arm_status(arm), end_time=arm_end)
                    children[key] = child_id
                for path, artifact_dir in files:
                    _retry(client.log_artifact, parent_id, str(path), artifact_dir or None)
                _retry(client.set_terminated, parent_id, status=record_status(record), end_time=end)
        _FAILED.pop(uri, None)
        return {"status": "tracked", "uri": uri, "experiment": name, "experiment_id": experiment_id,
                "parent_run_id": parent_id, "child_run_ids": {**live_children, **children}}
    except KeyboardInterrupt:
        if parent_id is not None and client is not None:
            with contextlib.suppress(Exception):
                client.set_terminated(parent_id, status="KILLED")
        raise
    except Exception as error:  # noqa: BLE001  (any store failure: keep going, the JSON record holds everything)
        message = _one_line(error)
        _FAILED[uri] = (time.monotonic(), message)
        if parent_id is not None and client is not None:
            with contextlib.suppress(Exception):
                client.set_terminated(parent_id, status="FAILED")
        return {"status": "not tracked", "uri": uri, "error": message, "parent_run_id": parent_id}


def _create_experiment(client, uri: str, name: str) -> str:
    try:
        return _retry(client.create_experiment, name, artifact_location=_artifact_location(uri, name))
    except Exception:  # created meanwhile by another writer (server stores: no shared lock)
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


# ----------------------------------------------------------------------------- reading back

def fetch_records(branch: str, tracking_uri: str | None = None, preset: str | None = None,
                  max_results: int = 500) -> list[dict]:
    """The JSON records of the latest parent run per case (name + schedule) and rounding draw
    (``run.replicate``) tagged git.branch=BRANCH: a baseline's reference runs and their replicates."""
    from mlflow.entities import ViewType

    from stability.record import read_record

    uri = resolve_tracking_uri(tracking_uri)
    check_reachable(uri)
    client = open_client(uri)
    experiments = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    if not experiments:
        return []
    query = f"tags.`git.branch` = '{branch}' AND tags.`stability.level` = 'pair' AND attributes.status = 'FINISHED'"
    if preset:
        query += f" AND tags.`stability.preset` = '{preset}'"
    runs = client.search_runs(experiments, query, max_results=max_results, order_by=["attributes.start_time DESC"])
    latest: dict[tuple, object] = {}
    for run in runs:
        key = (run.data.tags.get("stability.name"), run.data.tags.get("stability.schedule"),
               run.data.params.get("run.replicate", "0"))
        latest.setdefault(key, run)
    records = []
    with tempfile.TemporaryDirectory(prefix="stability-fetch-") as tmp:
        for run in latest.values():
            files = [f.path for f in client.list_artifacts(run.info.run_id, "record") if f.path.endswith(".json")]
            if not files:
                continue
            local = client.download_artifacts(run.info.run_id, files[0], tmp)
            record = read_record(local)
            record["_path"] = f"mlflow run {run.info.run_id} ({files[0]})"
            records.append(record)
    return records
