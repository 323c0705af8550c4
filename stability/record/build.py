"""The one place that writes into records: every change to a case record or an arm record is a call here.

    record = new_case_record(config, "standard")           # a case, status "running"
    arm = new_arm_record("gated", "G1-elementwise", 0, "standard")
    append_step(arm, row); add_probes(arm, snapshot, step); mark_completed(arm); add_figures(arm, figures)
    add_arm(record, arm); finish_case(record, run_timings, wall_seconds)

Plain functions over the plain dicts of ``stability.record.schema`` (whose types say what each key
holds): the trainer, the stress cases, the session, the pipeline and the Ray runner call them
instead of assigning keys, so what a record can hold is written down once. A status is stored as
its plain string (``Status.X.value``): a record stays plain JSON in memory too (checkpoints load it
with ``weights_only``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import subprocess
import uuid
from collections.abc import Iterable

from stability.config import extensions
from stability.record.cases import result_type
from stability.record.identity import STANDARD
from stability.record.machine import describe as describe_machine
from stability.record.schema import (
    PURPOSES,
    SCHEMA_VERSION,
    SERIES_KEYS,
    ArmRecord,
    CaseRecord,
    RecordError,
    Status,
)
from stability.record.summary import paired_summary

# ----------------------------------------------------------------------------- where a record comes from


def git_info(where: str | os.PathLike | None = None) -> dict:
    """Commit, branch and dirty flag of the checkout at ``where`` (default: the working directory; None where
    git is unavailable or it is no checkout)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10,
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
    """Versions, device name and the machine (``stability.record.machine.describe``), for the record and the
    MLflow tags (imports torch: trainer side only)."""
    import torch

    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") \
        and torch.cuda.is_available() else platform.processor() or platform.machine()
    return {"python": platform.python_version(), "torch": str(torch.__version__), "triton": library_version("triton"),
            "bitsandbytes": library_version("bitsandbytes"), "mlflow": library_version("mlflow"),
            "transformers": library_version("transformers"), "torchao": library_version("torchao"), "device": device,
            "device_name": name, "threads": torch.get_num_threads(),
            "extensions": [extension.describe() for extension in extensions.loaded()],
            "machine": describe_machine(device)}


def _new_id() -> str:
    return uuid.uuid4().hex[:8]


def ensure_id(record: CaseRecord) -> str:
    """The record's id, set once (8 hex digits) when it has none."""
    return record.setdefault("id", _new_id())


# ----------------------------------------------------------------------------- an arm (stability.train)

def new_arm_record(arm: str, variant: str, seed: int, schedule: str) -> ArmRecord:
    """An arm record before its first step (the trainer fills it in)."""
    return {"arm": arm, "variant": variant, "seed": seed, "schedule": schedule, "status": Status.RUNNING.value,
            "diverged_at_step": None, "stop_reason": None, "series": {key: [] for key in SERIES_KEYS},
            "events": [], "probes": [], "precision_stats": [], "final": {}, "timing": {}}


def describe_arm(arm: ArmRecord, num_parameters: int, gate_parameters: int, layer_names: list[str], model: dict,
                 precision: dict, distributed: dict | None = None) -> None:
    """What the arm trains: its parameter counts, layer groups, model, format and (torchrun) processes."""
    arm.update(num_parameters=num_parameters, gate_parameters=gate_parameters, layer_names=layer_names,
               model=model, precision=precision)
    if distributed is not None:
        arm["distributed"] = distributed


def start_timing(arm: ArmRecord, started_at: float, wall_seconds: float) -> None:
    """The arm's clock at the start of a training call (``wall_seconds``: of the calls it resumes)."""
    arm["timing"] = {"started_at": started_at, "wall_seconds": wall_seconds}


def note_wall_seconds(arm: ArmRecord, wall_seconds: float) -> None:
    """The wall seconds so far (kept in a checkpoint, so a resumed arm counts them)."""
    arm["timing"]["wall_seconds"] = wall_seconds


def mark_running(arm: ArmRecord) -> None:
    """A resumed arm trains again."""
    arm.update(status=Status.RUNNING.value, stop_reason=None)


def append_step(arm: ArmRecord, row: dict) -> None:
    """One step's values (the keys of ``SERIES_KEYS``) at the end of the series."""
    for key, value in row.items():
        arm["series"][key].append(value)


def add_event(arm: ArmRecord, step: int, what: str, module: str | None, layer: int | None,
              grad_params: list[str], found: dict) -> None:
    """A non-finite step: what went non-finite, the first module whose output did (and its layer), the
    parameters with non-finite gradients; ``found``: under torchrun, the rank and every rank's module."""
    arm["events"].append({"step": step, "what": what, "skipped": False, "module": module, "layer": layer,
                          "grad_params": grad_params, **found})


def note_skipped(arm: ArmRecord, skipped: bool) -> None:
    """Whether the optimiser skipped the step of the last non-finite event."""
    arm["events"][-1]["skipped"] = skipped


def add_probes(arm: ArmRecord, snapshot: dict, step: int) -> None:
    """A heavy-probe snapshot (``stability.train.probes.heavy_probes``) taken after ``step``."""
    snapshot["step"] = step
    arm["probes"].append(snapshot)


OFF_KEPT = 20   # the steps (and snapshots) an "applied" list keeps of a stress or measurement not applied


def start_applied(arm: ArmRecord, linear_calls: dict) -> None:
    """The arm's ``applied`` entry before its first step: no LR off the log yet, and the Linears against the run's
    format (``runs_in``, ``linears``, ``high_precision``; ``stability.record.schema.LinearCalls``)."""
    arm["applied"] = {"lr_off_log_steps": 0, "lr_off_log": [],
                      "linear_calls": {**linear_calls, "calls": 0, "in_format": 0, "off_format": {}}}


def note_lr_off_log(arm: ArmRecord, step: int, logged: float, stepped: list[float] | None) -> None:
    """Step ``step``'s optimiser stepped with the LRs ``stepped`` (one per parameter group; None: it never
    stepped, though the step was not skipped) where the series logs ``logged``."""
    applied = arm["applied"]
    applied["lr_off_log_steps"] += 1
    if len(applied["lr_off_log"]) < OFF_KEPT:
        applied["lr_off_log"].append({"step": step, "logged": logged,
                                      "stepped": None if stepped is None else [float(v) for v in stepped]})


def note_linear_calls(arm: ArmRecord, step: int, calls: int, in_format: int, off: dict[str, tuple[int, str]]) -> None:
    """Step ``step``'s training forward made ``calls`` Linear calls, ``in_format`` of them in the run's format;
    ``off``: per Linear the format covers, (calls not in it, what the first ran in)."""
    entry = arm["applied"]["linear_calls"]
    entry["calls"] += calls
    entry["in_format"] += in_format
    for name, (count, ran_as) in off.items():
        seen = entry["off_format"].setdefault(name, {"calls": 0, "first_step": step, "ran_as": ran_as})
        seen["calls"] += count


def note_probe_modules_missed(arm: ArmRecord, step: int, modules: list[str]) -> None:
    """The heavy-probe snapshot of ``step`` did not hook ``modules`` of the model."""
    missed = arm["applied"].setdefault("probe_modules_missed", [])
    if len(missed) < OFF_KEPT:
        missed.append({"step": step, "modules": list(modules)})


def set_probe_steps_missed(arm: ArmRecord, steps: list[int]) -> None:
    """The steps the config names for the heavy probes that have no snapshot (once the arm stopped)."""
    arm["applied"]["probe_steps_missed"] = list(steps)


def add_precision_stats(arm: ArmRecord, step: int, stats: dict) -> None:
    """The low-precision format's overflow / underflow counts up to ``step``."""
    arm["precision_stats"].append({"step": step, **stats})


def mark_completed(arm: ArmRecord) -> None:
    arm["status"] = Status.COMPLETED.value


def mark_diverged(arm: ArmRecord, step: int, reason: str) -> None:
    arm.update(status=Status.DIVERGED.value, diverged_at_step=step, stop_reason=reason)


def mark_killed(arm: ArmRecord) -> None:
    """Ctrl-C stopped the arm."""
    arm.update(status=Status.KILLED.value, stop_reason="interrupted (Ctrl-C)")


def mark_error(arm: ArmRecord, error: BaseException, traceback: str) -> None:
    """An exception stopped the arm: its type and message, and where it came from."""
    arm.update(status=Status.ERROR.value, stop_reason=f"{type(error).__name__}: {error}", traceback=traceback)


def add_figures(arm: ArmRecord, figures: dict) -> None:
    """Figures of the table (``stability.record.figures``) into the arm's ``final``."""
    arm["final"].update(figures)


def set_arm_timing(arm: ArmRecord, wall_seconds: float, train_seconds: float, probe_seconds: float,
                   eval_seconds: float, tokens: int, started_at: float, ended_at: float,
                   resumed_at_step: int = 0) -> None:
    """The arm's timing once it stopped (``resumed_at_step``: the first step of a resumed call, 0: none)."""
    arm["timing"] = {"wall_seconds": wall_seconds, "train_seconds": train_seconds, "probe_seconds": probe_seconds,
                     "eval_seconds": eval_seconds, "tokens": tokens,
                     "tokens_per_second": tokens / train_seconds if train_seconds else 0.0,
                     "started_at": started_at, "ended_at": ended_at,
                     **({"resumed_at_step": resumed_at_step} if resumed_at_step else {})}


def set_quant(arm: ArmRecord, quant: dict, figures: dict) -> None:
    """The post-training quantization results (``stability.evaluate.quantize.evaluate_schemes``) and their figures."""
    arm["quant"] = quant
    add_figures(arm, figures)


def set_extrapolation(arm: ArmRecord, result: dict, figures: dict) -> None:
    """The length-extrapolation points (``stability.evaluate.extrapolation.evaluate_lengths``) and their figures."""
    arm["extrapolation"] = result
    add_figures(arm, figures)


def name_run(arm: ArmRecord, name: str, key: str) -> None:
    """The run's name (its MLflow child run) and key (its per-step file and checkpoint)."""
    arm["run_name"], arm["run_key"] = name, key


def set_unit(arm: ArmRecord, unit_id: str, name: str, attempt: int, pid: int) -> None:
    """The Ray task that trained the arm."""
    arm["unit"] = {"id": unit_id, "name": name, "attempt": attempt, "pid": pid}


# ----------------------------------------------------------------------------- a case (stability.cases)

def new_case_record(config, case_label: str, description: str = "", case: str = STANDARD,
                    purpose: str = "regression", run_steps: int | None = None) -> CaseRecord:
    """An empty case record for an ``ExperimentConfig`` of the case named ``case`` under its label
    ``case_label`` ("batch_ramp-sqrt"; ``stability.cases.case.StressCase.label``): arms are appended as they
    finish. ``run_steps``: the steps one run of the case trains (its case declares it; None: ``run.steps``)."""
    if purpose not in PURPOSES:
        raise RecordError(f"purpose={purpose!r} is unknown: expected one of {PURPOSES}")
    return {
        "schema_version": SCHEMA_VERSION, "id": _new_id(),
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "name": config.name, "preset": config.preset, "case": case, "case_label": case_label,
        "run_steps": config.run.steps if run_steps is None else run_steps,
        "purpose": purpose, "description": description, "status": Status.RUNNING.value, "git": git_info(),
        "env": env_info(config.run.device), "config": dataclasses.asdict(config), "arms": [], "paired": {},
    }


def set_corpus(record: CaseRecord, info: dict) -> None:
    """What the tokens are (``stability.data.Corpus.info``)."""
    record["corpus"] = info


def add_arm(record: CaseRecord, arm: ArmRecord) -> None:
    """A finished run into the case's arms (of a multi-run case: its configured run)."""
    record["arms"].append(arm)


def set_paired(record: CaseRecord) -> None:
    """The paired summary of the arms so far."""
    record["paired"] = paired_summary(record["arms"])


def set_case_result(record: CaseRecord, case: str, result: dict) -> None:
    """A stress case's own results: ``results[case]``, of the type the case declared (``stability.record.cases``)."""
    result_type(case)
    record.setdefault("results", {})[case] = result


def finish_status(record: CaseRecord, extra_statuses: Iterable[str] = ()) -> Status:
    """The case status from its arms' (and any extra runs') statuses: error > killed > completed."""
    statuses = [a.get("status") for a in record["arms"]] + list(extra_statuses)
    if Status.ERROR in statuses:
        return Status.ERROR
    return Status.KILLED if Status.KILLED in statuses or Status.RUNNING in statuses else Status.COMPLETED


def case_timing(run_timings: list[dict], wall_seconds: float) -> dict:
    """A case's timing: ``wall_seconds`` of the whole case, the sums over its runs of ``train_seconds``,
    ``probe_seconds``, ``eval_seconds`` and ``tokens``, their wall time inside training
    (``run_wall_seconds``), and ``setup_seconds`` (record, corpus, analysis: the rest)."""
    sums = {key: sum(t.get(key, 0.0) for t in run_timings)
            for key in ("wall_seconds", "train_seconds", "probe_seconds", "eval_seconds", "tokens")}
    run_wall = sums.pop("wall_seconds")
    return {"wall_seconds": wall_seconds, "run_wall_seconds": run_wall, **sums, "runs": len(run_timings),
            "setup_seconds": wall_seconds - run_wall}


def finish_case(record: CaseRecord, run_timings: list[dict], wall_seconds: float,
                extra_statuses: Iterable[str] = ()) -> None:
    """Once every run has trained: the paired summary, the case status (``finish_status``) and the timing."""
    set_paired(record)
    record["status"] = finish_status(record, extra_statuses).value
    record["timing"] = case_timing(run_timings, wall_seconds)


def stop_case(record: CaseRecord, arm: ArmRecord) -> None:
    """A run that ends the case (killed; under torchrun also an error): it joins the arms, the case is
    "killed" with the paired summary and timing of the arms so far."""
    add_arm(record, arm)
    set_paired(record)
    mark_case_killed(record)
    record["timing"] = case_timing([a["timing"] for a in record["arms"]],
                                   sum(a["timing"].get("wall_seconds", 0.0) for a in record["arms"]))


def mark_case_killed(record: CaseRecord) -> None:
    record["status"] = Status.KILLED.value


# ----------------------------------------------------------------------------- a command's session

def note_run(record: CaseRecord, arm: ArmRecord, steps_file: str) -> None:
    """A run a session trained (or took from disk), at the end of the case's ``runs``."""
    timing = arm.get("timing") or {}
    record.setdefault("runs", []).append({
        "run_key": arm.get("run_key"), "name": arm.get("run_name"), "arm": arm["arm"], "seed": arm["seed"],
        "status": arm["status"], "steps": len(arm["series"]["step"]), "started_at": timing.get("started_at"),
        "ended_at": timing.get("ended_at"), "final": arm.get("final"), "steps_file": steps_file})


def set_replay_bundles(record: CaseRecord, index: list[dict]) -> None:
    """The replay bundles kept so far (``stability.train.checkpoint.Bundles.index``)."""
    record["replay_bundles"] = index


def set_checkpoint_dir(record: CaseRecord, directory: str) -> None:
    record["checkpoint_dir"] = directory


def note_resumed(record: CaseRecord, old: CaseRecord) -> None:
    """The case continues the interrupted record ``old``: its id and creation time, and where it stood."""
    record.update(id=old["id"], created_at=old["created_at"])
    record["resumed_from"] = {"status": old.get("status"), "runs": len(old.get("runs") or [])}


def set_tracking(record: CaseRecord, tracking: dict) -> None:
    """Where the record went in MLflow (``stability.track``): live run ids, tracked, or not tracked and why."""
    record["tracking"] = tracking


def add_tracking_seconds(record: CaseRecord, seconds: float) -> None:
    record.setdefault("timing", {})["tracking_seconds"] = seconds


def set_record_path(record: CaseRecord, path: str) -> None:
    """Where the record was written."""
    record["record_path"] = path


def set_ray(record: CaseRecord, address: str, task_resources: dict, max_retries: int,
            units: list[tuple[str, str]]) -> None:
    """The Ray tasks of the case: where, with what resources, and per unit (id, name) its attempts (None
    until its result is back)."""
    record["ray"] = {"address": address, "task_resources": task_resources, "max_retries": max_retries,
                     "units": [{"id": unit_id, "name": name, "attempts": None} for unit_id, name in units],
                     "retries": 0}


def note_attempts(record: CaseRecord, index: int, attempts: int, retries: int) -> None:
    """Unit ``index`` came back after ``attempts`` attempts; ``retries``: the tasks rerun so far."""
    record["ray"]["units"][index]["attempts"] = attempts
    record["ray"]["retries"] = retries
