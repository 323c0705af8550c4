"""The copy of a record in MLflow (the JSON record, written first by the caller, is the source of truth).

``log_to_mlflow`` sends a case record: one parent run per stress case, one child run per arm and
seed (as many arms as the record holds; each child carries its arm's definition as ``arm.*``
params), params flattened from the config, per-step metrics in batches, tags with the git commit and
versions, and whatever artifact files the caller made (the record itself, plots, the report; this
module renders nothing). A store that cannot be reached never loses anything: the JSON stays, the
failure is returned (and reported once by the caller), and ``stability upload`` can send the file
later. A record is its runs: when the runs were created live during training
(``stability.track.live``), or by an earlier process (a stopped and resumed case, an earlier upload),
it completes those runs instead of creating new ones (``reopen``: the ids the record names, else the
runs tagged with its record id), and sends only the points the store does not hold yet
(``held_points``), so a step, a final figure or a parameter is in MLflow once however often the
record was stopped, resumed or sent. A run a dead process left RUNNING is ended as KILLED then.

How it looks in the MLflow UI: one experiment per preset (``stability-<preset>``), tagged
``mlflow.experimentKind`` = ``custom_model_development`` (MLflow 3's kind for model training; the
3.17 UI shows it on the experiment but does not open the runs table for it); a parent run per case,
named after it (``standard``, ``lr_sweep``, ``shock-jump``...); child runs named by arm, seed and, in
sweeps, LR (``gated-seed1-lr0.03``); tags ``case``, ``arm``, ``variant``, ``seed`` and ``status`` to
filter and group by; start and end times those of the training. ``runs_url`` gives the link that
opens the runs table: its ``?workflowType=machine_learning`` chooses the model-training view (without
it MLflow 3.17's UI opens a new browser on its GenAI overview, whatever the tag).
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
from stability.record import USABLE, Status, case_key, case_name, record_replicate, write_json
from stability.record.machine import machine_key
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
    parts = [f"{record.get('preset')}/{record.get('name')}: case {record.get('case_label')}"
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
    name = str(record.get("case_label") or case_name(record))
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
    tags = {**_tags(record), "stability.level": "arm", "arm": str(arm["arm"]), "variant": str(arm.get("variant")),
            "seed": str(arm["seed"]), "status": str(arm.get("status")),
            "mlflow.note.content": f"{arm['arm']} arm ({arm.get('variant')}), seed {arm['seed']}: "
                                   f"{arm.get('status')}" + (f" - {arm['stop_reason']}" if arm.get("stop_reason")
                                                             else ""),
            **{f"precision.{key}": str(value) for key, value in (arm.get("precision") or {}).items()}}
    if arm.get("run_key"):   # the run's one identifier: its record entry, per-step file and checkpoint say it too
        tags["stability.run_key"] = str(arm["run_key"])
    tags["stability.replicate"] = str(record_replicate(record))
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
    return {**_tags(record), "status": str(record.get("status"))}


def _tags(record: dict) -> dict[str, str]:
    """The tags a parent run and its children share, one per meaning: the case's name (``case``), its label
    (``stability.case_label``: "batch_ramp-sqrt") and its key (``stability.case_key``: "smoke/batch_ramp-sqrt"),
    the config's name and preset, the purpose, the record's id, git and the environment."""
    git, env = record.get("git") or {}, record.get("env") or {}
    tags = {"stability.preset": str(record.get("preset")), "stability.case_label": str(record.get("case_label")),
            "stability.name": str(record.get("name")), "stability.case_key": case_key(record),
            "stability.purpose": str(record.get("purpose")), "stability.record_id": str(record.get("id", "")),
            "stability.level": "pair", "case": case_name(record), "mlflow.note.content": describe(record)}
    tags.update({f"git.{k}": str(v) for k, v in git.items()})
    tags.update({f"env.{k}": str(v) for k, v in env.items()})
    if isinstance(env.get("machine"), dict):   # the machine's label, not its whole description
        tags["env.machine"] = machine_key(env["machine"])
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


def child_params(record: dict, arm: dict) -> dict[str, str]:
    """The params of an arm's child run, whoever sends them (live or at upload): arm, variant, seed and the
    arm's definition."""
    return {"arm": str(arm["arm"]), "variant": str(arm.get("variant")), "seed": str(arm["seed"]),
            **arm_definition(record, arm["arm"])}


def arm_definition(record: dict, name: str) -> dict[str, str]:
    """The arm's definition from the record's config, as params: {"arm.gate.position": "G1", ...}."""
    for arm in (record.get("config") or {}).get("arms") or []:
        if isinstance(arm, dict) and arm.get("name") == name:
            return {f"arm.{k}": v for k, v in params_of({k: v for k, v in arm.items() if k != "name"}).items()}
    return {}


def held_points(client, run_id: str) -> dict[tuple[str, int], set[float]]:
    """The points a run already holds in the store, (metric, step) -> the values there: what a run continued
    in another process (a resumed arm, a record sent again) must not send again."""
    held: dict[tuple[str, int], set[float]] = {}
    for key in _retry(client.get_run, run_id).data.metrics:
        for point in _retry(client.get_metric_history, run_id, key):
            held.setdefault((key, int(point.step)), set()).add(point.value)
    return held


def is_series(key: str) -> bool:
    """Whether a metric is a per-step series (per-step metrics, probes): one point per step, whatever the
    value; else a summary figure (final, quantization, extrapolation, paired), sent again only when its
    value at that step changed."""
    return key in STEP_METRICS or key.startswith("probe.")


def new_points(metrics, held: dict) -> list:
    """The ``Metric`` objects the store does not hold yet (``held``: ``held_points``), see ``is_series``."""
    return [m for m in metrics if (m.key, m.step) not in held
            or (not is_series(m.key) and m.value not in held[(m.key, m.step)])]


def final_step(arm: dict) -> int:
    """The step an arm's final figures are logged at: for an arm that ended (completed or diverged) the
    step after its last, for a stopped one (killed, an error) its figures so far at its last step. So a
    resumed arm's final figures are a later point of the same series, not a second value at one step,
    even when it was stopped after its last step and before its end (its last probe, its evaluation)."""
    steps = (arm.get("series") or {}).get("step") or []
    last = int(steps[-1]) if steps else -1
    return last + 1 if arm.get("status") in USABLE else max(last, 0)


def _arm_metrics(arm: dict, now: int, with_steps: bool = True, held: dict | None = None):
    """The metrics of one arm's child run, less the points the store holds (``held``: ``held_points``)."""
    from mlflow.entities import Metric

    series = arm.get("series") or {}
    steps = series.get("step") or [] if with_steps else []
    metrics = [Metric(key, float(value), now, int(step))
               for key in STEP_METRICS for step, value in zip(steps, series.get(key) or [])
               if isinstance(value, (int, float)) and value is not None and math.isfinite(value)]
    for snapshot in arm.get("probes") or []:
        step = int(snapshot.get("step", 0))
        for index, layer in enumerate(snapshot.get("layers") or []):
            for key, value in layer.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    metrics.append(Metric(f"probe.{key}.layer{index}", float(value), now, step))
    last = final_step(arm)
    metrics += [Metric(k, v, now, last) for k, v in _finite_metrics(arm.get("final") or {}, "final.").items()]
    for point in (arm.get("extrapolation") or {}).get("points") or []:  # curves: step = sequence length
        for key in ("heldout_loss", "f_attn", "sink_rate"):
            value = point.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                metrics.append(Metric(f"extrap.{key}.{point['rope']}", float(value), now, int(point["length"])))
    quant = arm.get("quant") or {}  # quant.<scheme>.<figure> (and quant.full_precision.<figure>)
    metrics += [Metric(k, v, now, 0) for k, v in _numbers(
        {"full_precision": quant.get("full_precision"), **(quant.get("schemes") or {})}, "quant").items()]
    return new_points(metrics, held or {})


def reopen(client, experiment_id: str, record: dict, known: dict | None = None) -> dict:
    """The runs of ``record`` the store holds already, {"parent_run_id", "child_run_ids"} ({} when none):
    those ``known`` names (ids an earlier process kept: the record's tracking entry, its ids file), else
    those tagged with the record's id (``stability.record_id``; children by run name, under that parent
    first), the earliest when there are several. Every run of the record left RUNNING (by a process that
    is gone: a run directory is trained by one process at a time) is ended as KILLED here."""
    from mlflow.entities import ViewType

    found = _retry(client.search_runs, [experiment_id], f"tags.`stability.record_id` = '{record['id']}'",
                   run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, order_by=["attributes.start_time ASC"])
    by_id = {run.info.run_id: run for run in found}
    known = known or {}
    parent = known.get("parent_run_id") if known.get("parent_run_id") in by_id else next(
        (run.info.run_id for run in found if run.data.tags.get("stability.level") == "pair"), None)
    children = {name: run_id for name, run_id in (known.get("child_run_ids") or {}).items() if run_id in by_id}
    arms = [run for run in found if run.data.tags.get("stability.level") == "arm"]
    arms.sort(key=lambda run: run.data.tags.get("mlflow.parentRunId") != parent)   # stable: earliest first
    for run in arms:
        children.setdefault(run.info.run_name, run.info.run_id)
    for run in found:
        if run.info.status == "RUNNING":
            _retry(client.set_terminated, run.info.run_id, status="KILLED")
    return {"parent_run_id": parent, "child_run_ids": children} if parent or children else {}


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
    runs made while training (``LiveTracker.runs_of``); without it, the runs the store holds of the record
    already (``reopen``: the ids of its ``tracking`` entry for this store, else its tags). Runs that exist
    are completed with the points they lack (``held_points``), never made again. A SQLite store is written
    under a file lock (parallel workers); an http store is probed first so a dead server fails in seconds.
    Never raises on a store failure (the ids known so far are in the failure's result)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    uri = resolve_tracking_uri(tracking_uri)
    live = live if live and live.get("uri") == uri and live.get("parent_run_id") else None
    known = live or (record.get("tracking") if (record.get("tracking") or {}).get("uri") == uri else None) or {}
    parent_id, children, client = known.get("parent_run_id"), dict(known.get("child_run_ids") or {}), None
    failed = _FAILED.get(uri)
    if failed and time.monotonic() - failed[0] < FAILURE_COOLDOWN_S:
        return _not_tracked(uri, f"{failed[1]} (failed earlier; not retried for {FAILURE_COOLDOWN_S:.0f} s)",
                            parent_id, children)
    try:
        check_reachable(uri)
        with tempfile.TemporaryDirectory(prefix="stability-artifacts-") as tmp:
            copy = write_json(Path(tmp) / "record" / f"{record['name']}-{record['case_label']}-{record.get('id')}.json",
                              {k: v for k, v in record.items() if not k.startswith("_")})
            files = [(copy, "record"), *((Path(p), d) for p, d in artifacts)]
            client = open_client(uri)
            with store_lock(uri):
                name = experiment_name(record, experiment)
                if live:      # made while training: the children whose arms ended hold their steps already
                    experiment_id, ids, sent_live = live["experiment_id"], live, set(live.get("complete_children") or ())
                else:         # uploaded now: the runs an earlier process made of this record, else new ones
                    experiment_id = ensure_experiment(client, uri, name)
                    ids, sent_live = reopen(client, experiment_id, record, known), set()
                parent_id, children = ids.get("parent_run_id"), dict(ids.get("child_run_ids") or {})
                now, (start, end) = int(time.time() * 1000), case_times(record)
                fresh = parent_id is None
                parent_id = parent_id or _retry(client.create_run, experiment_id, start_time=start,
                                                tags=parent_tags(record), run_name=run_name(record)).info.run_id
                _complete_parent(client, parent_id, record, now, fresh)
                for arm in record["arms"]:
                    key = child_name(arm)
                    children[key] = _complete_child(client, experiment_id, parent_id, children.get(key), record,
                                                    arm, now, with_steps=key not in sent_live)
                for path, artifact_dir in files:
                    _retry(client.log_artifact, parent_id, str(path), artifact_dir or None)
                _retry(client.set_terminated, parent_id, status=record_status(record), end_time=end)
        _FAILED.pop(uri, None)
        return {"status": "tracked", "uri": uri, "experiment": name, "experiment_id": experiment_id,
                "parent_run_id": parent_id, "child_run_ids": children}
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
        return _not_tracked(uri, message, parent_id, children)


def _complete_parent(client, parent_id: str, record: dict, now: int, fresh: bool) -> None:
    """The parent run's tags, config params and paired figures, less what it holds (nothing when ``fresh``)."""
    from mlflow.entities import Metric, Param, RunTag

    params_held, held = {}, {}
    if not fresh:
        _log_batched(client, parent_id, tags=[RunTag(k, v) for k, v in parent_tags(record).items()])
        params_held, held = _retry(client.get_run, parent_id).data.params, held_points(client, parent_id)
    paired = {f"paired.{arm}.{figure}.{key}": value
              for arm, table in (record.get("paired") or {}).items()
              for figure, summary in table.items() for key, value in summary.items()
              if key in ("reference", "treatment", "difference", "ci_low", "ci_high", "p_value")}
    _log_batched(client, parent_id,
                 params=[Param(k, v) for k, v in params_of(record["config"]).items() if k not in params_held],
                 metrics=new_points([Metric(k, v, now, 0) for k, v in _finite_metrics(paired).items()], held))


def _complete_child(client, experiment_id: str, parent_id: str, child_id: str | None, record: dict, arm: dict,
                    now: int, with_steps: bool) -> str:
    """Make (``child_id`` None) or complete one arm's child run and end it; returns its id. ``with_steps``:
    send its per-step points (False for a child made live whose steps all went while it trained)."""
    from mlflow.entities import Param, RunTag

    tags = child_tags(record, arm, parent_id)
    arm_start, arm_end = arm_times(arm)
    if child_id is None:
        child_id = _retry(client.create_run, experiment_id, start_time=arm_start, tags=tags,
                          run_name=child_name(arm)).info.run_id
        params_held, held = {}, {}
    else:
        _log_batched(client, child_id, tags=[RunTag(k, v) for k, v in tags.items()])
        run = _retry(client.get_run, child_id)
        params_held = run.data.params
        # a child made live holds its steps and, sent when its arm ended, its final figures
        held = held_points(client, child_id) if with_steps else {
            (k, final_step(arm)): {v} for k, v in run.data.metrics.items() if k.startswith("final.")}
    _log_batched(client, child_id, metrics=_arm_metrics(arm, now, with_steps, held),
                 params=[Param(k, v) for k, v in child_params(record, arm).items() if k not in params_held])
    _retry(client.set_terminated, child_id, status=arm_status(arm), end_time=arm_end)
    return child_id


def _not_tracked(uri: str, error: str, parent_id: str | None, children: dict) -> dict:
    """The result of a failed send: why, and the runs of the record known so far (a later send reopens them)."""
    return {"status": "not tracked", "uri": uri, "error": error, "parent_run_id": parent_id,
            **({"child_run_ids": children} if children else {})}


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
    """The JSON records of the latest parent run per case key and rounding replicate
    (``run.replicate``) tagged git.branch=BRANCH: a baseline's unperturbed runs and their replicates."""
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
        tags = run.data.tags   # a run logged before the case key had its tag kept it under "stability.case"
        key = (tags.get("stability.case_key") or tags.get("stability.case"), run.data.params.get("run.replicate", "0"))
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
