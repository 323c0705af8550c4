"""The record: the one JSON document per stress case that crosses from training to everything after it.

Tracking, the regression check and the report read records and nothing else, so this module holds
the contract: the schema version, the typed layout, the builders the trainer, the experiment and the
stress cases fill in, the paired summary, and reading, writing and validating. It imports neither
torch nor MLflow (``stability check``, ``baseline`` and ``report`` run without them).

A case record (``CaseRecord``)::

    schema_version, id, created_at, name, preset, schedule, stress, purpose, description, status,
    git {commit, branch, dirty}, env {python, torch, ..., device_name}, config (the resolved
    ExperimentConfig), corpus (what the tokens are: kind, size, provenance; ``stability.data``),
    arms [ArmRecord ...], paired {arm: {figure: PairedFigure}}, timing,
    and a key named after the stress case with its own results (record["lr_sweep"] ...).
    Written by a training command (``stability.cases.session``) also: runs (every run trained, in order:
    name, status, steps, start/end, final figures, its per-step file), replay_bundles, checkpoint_dir.

``purpose`` says what the record may be used for: "regression" (a stress case or a plain pair run;
the only kind the regression check and a baseline accept), "claim" (evidence for a paper claim,
kept apart), "fault" (a detector proven by injecting a fault) and "selfcheck" (the harness testing
itself, e.g. a determinism re-run).

An arm record (``ArmRecord``) is one arm at one seed: ``arm`` (its name, "baseline" is the
reference), ``variant``, ``seed``, ``status`` (completed, diverged, killed, error, running),
``diverged_at_step``, ``model`` (source, class, family: ``describe()`` of ``stability.model.build``),
``precision`` (the format's library, version and recipe), per-step ``series``, non-finite
``events``, heavy-probe snapshots in ``probes``, ``final`` figures (see ``stability.record.figures``),
``quant`` and ``timing`` (seconds, and ``started_at`` / ``ended_at`` in seconds since the epoch);
with a session also ``run_name`` (arm, seed and the swept LR or precision: the MLflow child run's
name) and ``run_key``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import uuid
from pathlib import Path
from typing import Any, TypedDict

from stability.config import BASELINE_ARM, flatten
from stability.record import figures as fig
from stability.record.stats import paired_difference

SCHEMA_VERSION = 2
PURPOSES = ("regression", "claim", "fault", "selfcheck")
ARM_STATUSES = ("running", "completed", "diverged", "killed", "error")
USABLE_STATUSES = ("completed", "diverged")
REFERENCE_ARM = BASELINE_ARM
SERIES_KEYS = ("step", "lr", "batch_size", "tokens", "loss", "grad_norm", "layer_grad_norm", "update_norm",
               "layer_update_norm", "loss_scale", "loss_spike", "grad_spike", "update_spike", "nonfinite", "skipped")


class RecordError(ValueError):
    """A record (or a set of records) cannot be used; the message says which and why. Exit code 2."""

    exit_code = 2


class PairedFigure(TypedDict):
    n: int
    baseline: float | None      # mean over the paired seeds
    treatment: float | None     # the arm's mean over the same seeds
    difference: float | None    # mean of (arm - baseline) per seed
    ci_low: float | None        # 95% t-interval of the difference
    ci_high: float | None
    p_value: float | None       # exact two-sided sign-flip p
    better: str | None
    seeds: list[int]


class ArmRecord(TypedDict, total=False):
    arm: str
    variant: str
    seed: int
    schedule: str
    status: str
    diverged_at_step: int | None
    stop_reason: str | None
    num_parameters: int
    gate_parameters: int
    layer_names: list[str]
    model: dict                 # what was trained: family, source, attention (stability.model.build)
    precision: dict             # the format: dtype, library, version, recipe, emulated (stability.precision)
    series: dict[str, list]
    events: list[dict]
    probes: list[dict]
    precision_stats: list[dict]
    final: dict[str, Any]
    quant: dict
    timing: dict[str, float]
    run_name: str
    run_key: str


class CaseRecord(TypedDict, total=False):
    schema_version: int
    id: str
    created_at: str
    name: str
    preset: str
    schedule: str
    stress: str
    purpose: str
    description: str
    status: str
    git: dict
    env: dict
    config: dict
    corpus: dict
    arms: list[ArmRecord]
    paired: dict[str, dict[str, PairedFigure]]
    timing: dict
    runs: list[dict]
    replay_bundles: list[dict]
    checkpoint_dir: str


# ----------------------------------------------------------------------------- builders

def git_info() -> dict:
    """Commit, branch and dirty flag of the working directory (None where git is unavailable)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": None if status is None else bool(status)}


def library_version(distribution: str) -> str | None:
    """The installed distribution's version from its metadata (importing the package costs seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def env_info(device: str) -> dict:
    """Versions and device name, for the record and the MLflow tags (imports torch: trainer side only)."""
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") \
        and torch.cuda.is_available() else platform.processor() or platform.machine()
    return {"python": platform.python_version(), "torch": str(torch.__version__), "triton": library_version("triton"),
            "bitsandbytes": library_version("bitsandbytes"), "mlflow": library_version("mlflow"),
            "transformers": library_version("transformers"), "torchao": library_version("torchao"), "device": device,
            "device_name": name, "threads": torch.get_num_threads()}


def new_case_record(config, schedule: str, description: str = "", stress: str = "pair",
                    purpose: str = "regression") -> CaseRecord:
    """An empty case record for an ``ExperimentConfig``: arms are appended as they finish."""
    if purpose not in PURPOSES:
        raise RecordError(f"purpose={purpose!r} is unknown: expected one of {PURPOSES}")
    return {
        "schema_version": SCHEMA_VERSION, "id": uuid.uuid4().hex[:8],
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "name": config.name, "preset": config.preset, "schedule": schedule, "stress": stress,
        "purpose": purpose, "description": description, "status": "running", "git": git_info(),
        "env": env_info(config.run.device), "config": dataclasses.asdict(config), "arms": [], "paired": {},
    }


def new_arm_record(arm: str, variant: str, seed: int, schedule: str) -> ArmRecord:
    """An arm record before its first step (the trainer fills it in)."""
    return {"arm": arm, "variant": variant, "seed": seed, "schedule": schedule, "status": "running",
            "diverged_at_step": None, "stop_reason": None, "series": {key: [] for key in SERIES_KEYS},
            "events": [], "probes": [], "precision_stats": [], "final": {}, "timing": {}}


def _finite_mean(values) -> float:
    finite = [v for v in values if v is not None and not isinstance(v, bool) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def spike_score(flags: list[bool]) -> float:
    """Percentage of steps flagged as spikes (0 for no steps)."""
    return 100.0 * sum(flags) / len(flags) if flags else 0.0


def final_figures(arm: ArmRecord, steps_planned: int) -> dict[str, Any]:
    """The trajectory figures of a finished (or stopped) arm, and the last probe snapshot's figures."""
    series = arm["series"]
    losses = series["loss"]
    finite_grads = [v for v in series["grad_norm"] if math.isfinite(v)]
    diverged = arm["status"] == "diverged"
    final = {
        "steps_completed": len(losses),
        "final_train_loss": _finite_mean(losses[-10:]),
        "min_train_loss": min((v for v in losses if math.isfinite(v)), default=float("nan")),
        "loss_spike_score": spike_score(series["loss_spike"]),
        "grad_spike_score": spike_score(series["grad_spike"]),
        "loss_spikes": sum(series["loss_spike"]),
        "grad_spikes": sum(series["grad_spike"]),
        "nonfinite_events": len(arm["events"]),
        "skipped_steps": sum(series["skipped"]),
        "max_grad_norm": max(finite_grads, default=float("nan")),
        "diverged": diverged,
        "divergence_step": arm["diverged_at_step"] if diverged else steps_planned,
    }
    if "update_norm" in series:  # records written before the update-norm probe have none
        finite_updates = [v for v in series["update_norm"] if v is not None and math.isfinite(v)]
        final.update({"update_spike_score": spike_score(series["update_spike"]),
                      "update_spikes": sum(series["update_spike"]),
                      "max_update_norm": max(finite_updates, default=float("nan"))})
    if arm["probes"]:
        last = arm["probes"][-1]
        final.update({key: value for key, value in last.items() if fig.figure(key) is not None})
    if arm["precision_stats"]:
        stats = arm["precision_stats"]
        final["overflow_fraction"] = _finite_mean([s.get("overflow_fraction") for s in stats])
        final["underflow_fraction"] = _finite_mean([s.get("underflow_fraction") for s in stats])
        final["loss_scale_drops"] = sum(s.get("scale_drops", 0) for s in stats)
    return final


def usable_value(arm: ArmRecord, name: str) -> float | None:
    """An arm's figure as a float for comparisons, or None: missing, non-finite, or an evaluation or
    peak figure of an arm that did not complete (a broken model, or the size of the explosion; see
    ``stability.record.figures``)."""
    value = (arm.get("final") or {}).get(name)
    entry = fig.figure(name)
    if entry is not None and entry.needs_completed_arm and arm.get("status") != "completed":
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def arm_names(arms: list[ArmRecord]) -> list[str]:
    """The arms of a record in order of first appearance, the reference arm first."""
    names = list(dict.fromkeys(a["arm"] for a in arms))
    return sorted(names, key=lambda n: n != REFERENCE_ARM)


def paired_summary(arms: list[ArmRecord], reference: str = REFERENCE_ARM) -> dict[str, dict[str, PairedFigure]]:
    """For each arm other than the baseline, per figure with a table entry: the paired difference
    arm - baseline over the seeds where both have a usable value (95% t-interval, sign-flip p).
    ``reference`` names another arm to compare with instead (e.g. the floored gate against the gate);
    the ``baseline`` field of each summary then holds that arm's mean."""
    by_seed: dict[int, dict[str, ArmRecord]] = {}
    for arm in arms:
        by_seed.setdefault(arm["seed"], {})[arm["arm"]] = arm
    names = [n for n in arm_names(arms) if n != reference]
    out: dict[str, dict[str, PairedFigure]] = {}
    for name in names:
        seeds = [s for s in sorted(by_seed) if reference in by_seed[s] and name in by_seed[s]]
        present = {k for s in seeds for side in (reference, name) for k in by_seed[s][side].get("final", {})}
        table = {}
        for figure in sorted(present):
            if fig.figure(figure) is None or fig.figure(figure).kind == "detail":
                continue
            pairs = [(s, usable_value(by_seed[s][reference], figure), usable_value(by_seed[s][name], figure))
                     for s in seeds]
            pairs = [(s, b, t) for s, b, t in pairs if b is not None and t is not None]
            if not pairs and all(by_seed[s][side].get("final", {}).get(figure) is None
                                 for s in seeds for side in (reference, name)):
                continue
            summary = paired_difference([b for _, b, _ in pairs], [t for _, _, t in pairs])
            table[figure] = {"n": summary["n"], "baseline": summary["baseline"], "treatment": summary["treatment"],
                             "difference": summary["difference"], "ci_low": summary["ci_low"],
                             "ci_high": summary["ci_high"], "p_value": summary["p_value"],
                             "better": fig.better(figure), "seeds": [s for s, _, _ in pairs]}
        out[name] = table
    return out


def finish_status(record: CaseRecord, extra_statuses=()) -> str:
    """The case status from its arms' (and any extra runs') statuses: error > killed > completed."""
    statuses = [a.get("status") for a in record["arms"]] + list(extra_statuses)
    return "error" if "error" in statuses else ("killed" if "killed" in statuses or "running" in statuses
                                                else "completed")


def case_timing(run_timings: list[dict], wall_seconds: float) -> dict:
    """A case's timing: ``wall_seconds`` of the whole case, the sums over its runs of ``train_seconds``,
    ``probe_seconds``, ``eval_seconds`` and ``tokens``, their wall time inside training
    (``run_wall_seconds``), and ``setup_seconds`` (record, corpus, analysis: the rest)."""
    sums = {key: sum(t.get(key, 0.0) for t in run_timings)
            for key in ("wall_seconds", "train_seconds", "probe_seconds", "eval_seconds", "tokens")}
    run_wall = sums.pop("wall_seconds")
    return {"wall_seconds": wall_seconds, "run_wall_seconds": run_wall, **sums, "runs": len(run_timings),
            "setup_seconds": wall_seconds - run_wall}


# ----------------------------------------------------------------------------- identity

def case_key(record: CaseRecord) -> str:
    """``<name>/<schedule>``: what the regression check compares record to baseline by."""
    return f"{record.get('name')}/{record.get('schedule')}"


IDENTITY_IGNORES = ("seeds", "run.seed", "run.device", "name", "preset", "run.replicate", "replicates")
IDENTITY_IGNORED_SECTIONS = ("run.checkpoint.",)   # how a run is kept, never what it measures


def _field_defaults() -> dict:
    """Every config field at its dataclass default, flattened (dotted keys)."""
    from stability.config import ExperimentConfig, to_dict

    return flatten(to_dict(ExperimentConfig()))


def comparable_config(config: dict) -> dict:
    """The flattened config without the fields allowed to differ between comparable records.

    A field the config lacks (a record or baseline written before the field existed) counts as its
    default: new fields default to the behaviour the code had before them."""
    flat = {**_field_defaults(), **flatten(config or {})}
    flat = {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}
    return {k: v for k, v in sorted(flat.items())
            if k not in IDENTITY_IGNORES and not k.startswith(IDENTITY_IGNORED_SECTIONS)}


def config_fingerprint(config: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(comparable_config(config), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(expected: dict, actual: dict, limit: int = 4) -> str:
    """A readable list of the first fields that differ between two flattened configs."""
    keys = sorted(set(expected) | set(actual))
    diffs = [f"{k}: baseline {expected.get(k, '<absent>')!r}, record {actual.get(k, '<absent>')!r}"
             for k in keys if expected.get(k, "<absent>") != actual.get(k, "<absent>")]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more if diffs else "no field differs"


def record_draw(record: CaseRecord) -> int:
    """The rounding draw a record's runs were trained under: ``run.replicate`` (0: the reference runs)."""
    return int(((record.get("config") or {}).get("run") or {}).get("replicate", 0) or 0)


def device_kind(device: str | None) -> str:
    """"cuda:1" -> "cuda", None -> "cpu"."""
    return (device or "cpu").split(":")[0]


def record_device(record: CaseRecord) -> str:
    return device_kind(((record.get("config") or {}).get("run") or {}).get("device"))


# ----------------------------------------------------------------------------- reading and writing

def clean(value):
    """Recursively replace NaN / Inf floats with None (strict JSON); tuples become lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def record_filename(record: CaseRecord) -> str:
    """``<name>-<schedule>-<purpose>-<id>.json`` (the id is set once, so rewrites keep the name)."""
    record.setdefault("id", uuid.uuid4().hex[:8])
    return f"{record['name']}-{record['schedule']}-{record.get('purpose', 'regression')}-{record['id']}.json"


def write_json(path: Path, document) -> Path:
    """Write strict JSON atomically: a killed writer leaves the previous version, never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(clean(document), indent=1, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def write_record(record: CaseRecord, directory: str | Path) -> Path:
    """Write the record into ``directory`` (a run directory) as strict JSON, atomically; returns the path."""
    return write_json(Path(directory) / record_filename(record), {k: v for k, v in record.items()
                                                                  if not k.startswith("_")})


def validate_record(record, where: str) -> CaseRecord:
    """RecordError naming ``where`` and the problem unless ``record`` is a usable case record."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(f"{where}: schema_version={version!r} is unknown: this version of stability reads "
                          f"record schema_version={SCHEMA_VERSION}")
    for key in ("name", "preset", "schedule", "config", "arms"):
        if key not in record:
            raise RecordError(f"{where}: the record has no {key!r} field (truncated or not a record)")
    if record.get("purpose", "regression") not in PURPOSES:
        raise RecordError(f"{where}: purpose={record.get('purpose')!r} is unknown: expected one of {PURPOSES}")
    if not isinstance(record["config"], dict):
        raise RecordError(f"{where}: 'config' must be an object, got {type(record['config']).__name__}")
    arms = record["arms"]
    if not isinstance(arms, list) or not all(isinstance(a, dict) for a in arms):
        raise RecordError(f"{where}: 'arms' must be a list of arm objects, got "
                          f"{type(arms).__name__ if not isinstance(arms, list) else 'a list holding non-objects'}")
    for index, arm in enumerate(arms):
        for key in ("arm", "seed", "status"):
            if key not in arm:
                raise RecordError(f"{where}: arms[{index}] has no {key!r} field")
        if arm["status"] not in ARM_STATUSES:
            raise RecordError(f"{where}: arms[{index}].status={arm['status']!r} is unknown: expected one of "
                              f"{ARM_STATUSES}")
        if not isinstance(arm.get("final", {}), dict):
            raise RecordError(f"{where}: arms[{index}].final must be an object")
    return record


def read_record(path: str | Path) -> CaseRecord:
    """Load and validate a record file; RecordError (exit 2) when missing, corrupt or of another schema."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"record {str(path)!r} does not exist")
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RecordError(f"record {str(path)!r} is not valid JSON (corrupt or truncated?): {error}") from None
    validate_record(record, f"record {str(path)!r}")
    record["_path"] = str(path)
    return record


def where(record: CaseRecord, index: int = 0) -> str:
    """How to name a record in a message: its file, else its case and id."""
    return str(record.get("_path") or f"record #{index + 1} ({case_key(record)}, id {record.get('id')})")
