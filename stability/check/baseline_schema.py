"""The layout of a baseline document, and reading one back: every field checked before anything is judged.

    baseline = load_baseline("reports/baselines/smoke-cpu.json")     # RecordError (exit 2) when it is not one

The layout is declared as TypedDicts (``Baseline`` and what it holds), checked by the same walk that checks
a record (``stability.record.check_layout``): every key one its entry declares, every value of its type, all
the way down. What a type cannot say is checked after it, by hand and only here: the ranges (a whole number
>= 1), every arm holding the same seeds and every seed the baseline's replicates, a run's status one a check
can compare, a figure one of the table and null only where its run may leave it undefined, and the
counts a calibration or the null jobs hold agreeing with each other.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Required, TypedDict

from stability.record import REFERENCE_ARM, USABLE, RecordError, Status, check_layout
from stability.record import figures as fig
from stability.record.io import read_json
from stability.record.upgrade import upgraded_baseline
from stability.record.validate import is_whole, shown

BASELINE_SCHEMA_VERSION = 7   # 7: a case's name and label under "case" and "case_label"; 6: replicates perturb
                              # every step (5: the initial weights only; 4: the arm "baseline")

RunsOf = dict[str, dict[str, Any]]   # seed -> replicate -> a run's value ("0" -> "3" -> 2.71)


class BaselineArm(TypedDict):
    """One arm of a case: per seed and replicate, its run's status, divergence step and judged figures."""
    status: dict[str, dict[str, str]]                   # seed -> replicate -> "completed" or "diverged"
    diverged_at_step: dict[str, dict[str, int | None]]  # seed -> replicate -> step, null where it did not
    figures: dict[str, RunsOf]                          # figure -> seed -> replicate -> number, true/false, null


class BaselineCase(TypedDict, total=False):
    """A stress case's runs (``stability.record.case_key``: "smoke/batch_ramp-sqrt")."""
    name: Required[str]
    case: Required[str]                # the stress case's name ("batch_ramp")
    case_label: Required[str]          # its name and qualifier ("batch_ramp-sqrt")
    steps: Required[int]               # the run length its case declared
    fingerprint: Required[str]
    config: Required[dict[str, Any]]   # the case's config, flattened ("run.data.batch_size": 8)
    arms: Required[dict[str, BaselineArm]]
    records: list[str | None]          # the ids of the records it was made from
    commit: str | None                 # the commit that trained it, where the case was remade alone


class ClosestArrangement(TypedDict, total=False):
    arrangement: dict[str, Any]        # seed -> the replicate that played the change
    reason: list[str]


class Calibration(TypedDict):
    """What ``stability baseline calibrate --write`` stores (``stability.check.calibration.stored``)."""
    arrangements: int
    seeds: int
    replicates: int
    playing: list[int]
    dof_rule: str
    alphas: list[float]
    failed: list[int]
    rate: list[float | None]
    margin: float | None
    closest: ClosestArrangement
    primary_family: list[dict[str, Any]]
    accepted_anyway: bool
    reason: str | None


class NullJobs(TypedDict, total=False):
    """What ``stability.check.calibration.null_job_evidence`` writes."""
    jobs: Required[int]
    failed: Required[int]
    commit: str | None
    replicates: list[int] | None
    closest_margin: float | None
    machines: dict[str, int] | None   # machine key (stability.record.machine) -> jobs run on it (jobs beyond
                                      # their sum: kept before jobs named their machine); absent: not recorded


class Covers(TypedDict, total=False):
    """What ``stability.check.coverage.covers`` writes: what the baseline judges, to tell when it is stale."""
    figures: Required[dict[str, list[str]]]         # case key -> figure names
    invariants: dict[str, list[str]] | None         # case key -> invariant names
    primary_family: Required[list[dict[str, Any]]]
    resolutions: Required[dict[str, str | None]]    # figure -> the kind of its resolution


class Baseline(TypedDict, total=False):
    schema_version: Required[int]
    kind: Required[Literal["stability-baseline"]]
    created_at: str | None
    preset: Required[str]
    device: Required[str]
    min_seeds: Required[int]
    replicates: Required[list[int]]    # 0: the unperturbed runs
    commit: str | None
    branch: str | None
    dirty: bool
    noise: str | None                  # the kind of noise its replicates are
    cases: Required[dict[str, BaselineCase]]
    invariants: list[Any] | None       # each checked by stability.record.invariants.check_line
    calibration: Calibration | None
    null_jobs: NullJobs | None
    cases_remade: list[str]
    covers: Covers | None


# the config fields the check computes a figure's resolution from (stability.record.figures.quantum)
RESOLUTION_FIELDS = ("run.data.batch_size", "run.model.context", "run.probes.eval_batches", "run.model.n_heads",
                     "run.model.n_layers")
# figures of kind "run" that every completed run reports as a finite number (the arm's own trajectory)
EVERY_COMPLETED_RUN = ("steps_completed", "nonfinite_events", "nonfinite_unhandled", "skipped_steps", "diverged",
                       "divergence_step", "early_loss", "early_grad_norm")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _at_least(value, low, what: str, where_: str, kind: str = "a whole number") -> None:
    """RecordError unless ``value`` (a number or null, its layout already checked) is >= ``low``."""
    if value is not None and value < low:
        raise RecordError(f"{where_}: {what} = {shown(value)}: expected {kind} >= {low}")


def null_allowed(name: str, status: str) -> bool:
    """Whether a baseline may hold null (a value that was not finite) for figure ``name`` of a run of ``status``.

    A run that did not complete may lack any figure. A completed run may lack only what it can leave
    undefined: a figure of a pattern, measured on a run of its own (``loss_gap_fp16`` when the fp16 rung
    diverged while its arm completed), and a stress case's own figure of kind "run" (``shock_recovery_steps``
    when the loss never came back). The trained model's figures (kinds "eval" and "peak") and the
    trajectory figures every run reports (``EVERY_COMPLETED_RUN``) are finite in a completed run: a null
    there would silently leave the run out of its rows."""
    if status != Status.COMPLETED:
        return True
    entry = fig.figure(name)
    return entry.name != name or (entry.kind == "run" and name not in EVERY_COMPLETED_RUN)


def case_arm_names(config: dict, where_: str) -> list[str]:
    """The arms a case's stored (flattened) config trains: its ``arms`` field ("reference,gated"; a config
    flattened with its defaults always has it)."""
    arms = config.get("arms", f"{REFERENCE_ARM},gated")
    if isinstance(arms, str):
        names = [name.strip() for name in arms.split(",") if name.strip()]
    elif isinstance(arms, list) and all(isinstance(name, str) for name in arms):
        names = list(arms)
    else:
        raise RecordError(f"{where_}: config.arms = {shown(arms)}: expected the arm names, e.g. 'reference,gated'")
    if not names:
        raise RecordError(f"{where_}: config.arms = {shown(arms)}: expected at least one arm name")
    return names


def unknown_figure(name: str, config: dict, where_: str) -> RecordError:
    """The error for a figure this installation's table does not know, naming the extensions the baseline
    was made with (its case config's ``plugins``) when it names any."""
    plugins = config.get("plugins") or []
    if plugins:
        return RecordError(f"{where_}: figure {name!r} is not known to this installation: the baseline was made with "
                           f"extensions {plugins}; load them to read it: installed with an entry point, or named by "
                           f"plugins in [tool.stability] of the current directory")
    return RecordError(f"{where_}: figure {name!r} is not a figure of the table (stability.record.figures): "
                       f"expected one of its figures")


def _check_figure_value(name: str, value, status: str, where_: str) -> None:
    entry = fig.figure(name)
    if isinstance(value, bool):
        if entry.quantum != "seed":
            raise RecordError(f"{where_}: figure {name} = {shown(value)}: expected a number (true/false only for a "
                              f"figure that is a seed's outcome, such as diverged)")
    elif value is None or (isinstance(value, float) and not math.isfinite(value)):
        if not null_allowed(name, status):
            raise RecordError(f"{where_}: figure {name} = null in a completed run: expected a finite number (a completed "
                              f"run's {entry.kind} figure is never non-finite; null only where the run did not "
                              f"complete)")
    elif not _is_number(value):
        raise RecordError(f"{where_}: figure {name} = {shown(value)}: expected a number, got "
                          f"{type(value).__name__}")


def _check_arm(key: str, arm: str, entry: BaselineArm, seeds: list[str], replicates: list[str], config: dict,
               where_: str) -> None:
    """The runs of one arm: the case's seeds, the baseline's replicates, statuses a check can compare, and
    judged figures of the table held only for the runs that may report them."""
    here = f"{where_}: case {key} arm {arm}"
    status = entry["status"]
    if sorted(status) != sorted(seeds):
        raise RecordError(f"{here}: status holds seeds {sorted(status)}, the case's other arms {sorted(seeds)}: "
                          f"expected the same seeds in every arm")
    for seed in seeds:
        if sorted(status[seed]) != sorted(replicates):
            raise RecordError(f"{here} seed {seed}: status holds replicates {sorted(status[seed])}: expected the "
                              f"baseline's replicates {sorted(replicates)}")
        for replicate, value in status[seed].items():
            if value not in tuple(USABLE):
                raise RecordError(f"{here} seed {seed} replicate {replicate}: status = {shown(value)}: expected "
                                  f"one of {sorted(USABLE)}")
    for seed, per_replicate in entry["diverged_at_step"].items():
        for replicate, step in per_replicate.items():
            if replicate not in status.get(seed, {}):
                raise RecordError(f"{here}: diverged_at_step holds seed {seed!r} replicate {replicate!r}: expected "
                                  f"the arm's seeds {sorted(seeds)} and the baseline's replicates {sorted(replicates)}")
            _at_least(step, 0, f"diverged_at_step.{seed}.{replicate}", here)
    for name, per_seed in entry["figures"].items():
        table_entry = fig.figure(name)
        if table_entry is None:
            raise unknown_figure(name, config, here)
        if table_entry.better is None:
            raise RecordError(f"{here}: figure {name!r} is never judged (the figure table gives it no "
                              f"direction): expected only judged figures")
        for seed, per_replicate in per_seed.items():
            for replicate, value in per_replicate.items():
                if replicate not in status.get(seed, {}):
                    raise RecordError(f"{here} figure {name}: seed {seed!r} replicate {replicate!r}: expected the "
                                      f"arm's seeds {sorted(seeds)} and the baseline's replicates {sorted(replicates)}")
                run_status = status[seed][replicate]
                if table_entry.needs_completed_arm and run_status != Status.COMPLETED:
                    raise RecordError(f"{here} seed {seed} replicate {replicate}: figure {name} is held for a run that "
                                      f"{run_status}: an evaluation or peak figure is kept for completed runs only")
                _check_figure_value(name, value, run_status, f"{here} seed {seed} replicate {replicate}")


def _check_case(key: str, case: BaselineCase, replicates: list[str], min_seeds: int, where_: str) -> None:
    here = f"{where_}: case {key}"
    _at_least(case["steps"], 1, "steps", here)
    config = case["config"]
    for field in RESOLUTION_FIELDS:
        if field in config and not (is_whole(config[field]) and config[field] >= 1):
            raise RecordError(f"{here}: config.{field} = {shown(config[field])}: expected a whole number >= 1")
    plugins = config.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise RecordError(f"{here}: config.plugins = {shown(plugins)}: expected a list of extension names")
    arms = case["arms"]
    wanted = case_arm_names(config, here)
    missing = [arm for arm in wanted if arm not in arms]
    if missing:
        raise RecordError(f"{here} has no arm {missing[0]!r}: expected every arm its config trains "
                          f"({', '.join(wanted)})")
    seeds = list(arms[wanted[0]]["status"])
    if len(seeds) < min_seeds:
        raise RecordError(f"{here} arm {wanted[0]}: {len(seeds)} seed(s) {sorted(seeds)}: expected at least "
                          f"min_seeds={min_seeds}")
    for arm, entry in arms.items():
        _check_arm(key, arm, entry, seeds, replicates, config, where_)


def _check_calibration(calibration: Calibration, where_: str) -> None:
    here = f"{where_}: calibration"
    for key in ("arrangements", "seeds", "replicates"):
        _at_least(calibration[key], 0, key, here)
    if not all(r >= 0 for r in calibration["playing"]):
        raise RecordError(f"{here}.playing = {shown(calibration['playing'])}: expected the replicates (>= 0) that "
                          f"played the change")
    alphas, failed, rate = calibration["alphas"], calibration["failed"], calibration["rate"]
    if not alphas or not all(_is_number(a) and 0 < a < 1 for a in alphas):
        raise RecordError(f"{here}.alphas = {shown(alphas)}: expected a list of rates in (0, 1)")
    if len(failed) != len(alphas) or not all(n >= 0 for n in failed):
        raise RecordError(f"{here}.failed = {shown(failed)}: expected a count >= 0 per alpha")
    if len(rate) != len(alphas) or not all(r is None or 0 <= r <= 1 for r in rate):
        raise RecordError(f"{here}.rate = {shown(rate)}: expected a fraction (or null) per alpha")
    _at_least(calibration["margin"], 0, "margin", here, "a number")


def _check_null_jobs(jobs: NullJobs, where_: str) -> None:
    here = f"{where_}: null_jobs"
    for key in ("jobs", "failed"):
        _at_least(jobs[key], 0, key, here)
    _at_least(jobs.get("closest_margin"), 0, "closest_margin", here, "a number")
    if jobs["failed"] > jobs["jobs"]:
        raise RecordError(f"{here}.failed = {jobs['failed']} is more than null_jobs.jobs = {jobs['jobs']}: expected "
                          f"at most as many failures as jobs")
    machines = jobs.get("machines")
    if machines is not None:
        for key, count in machines.items():
            if not key.strip():
                raise RecordError(f"{here}.machines has an empty key: expected machine keys "
                                  f"(stability.record.machine.machine_key)")
            _at_least(count, 1, f"machines[{key!r}]", here)
        if sum(machines.values()) > jobs["jobs"]:
            raise RecordError(f"{here}.machines counts {sum(machines.values())} jobs, more than null_jobs.jobs = "
                              f"{jobs['jobs']}: expected at most as many jobs on the machines as jobs")


def validate_baseline(baseline, where_: str) -> dict:
    """``baseline`` itself when the whole document can be judged against: its layout (``Baseline``), every case
    holding every arm its config trains, every arm every seed and replicate, every figure one of the table
    and its values numbers where the run completed (``null_allowed``); RecordError, one line naming
    ``where_``, the case, arm, seed and figure, otherwise. Nothing is judged before it."""
    if not isinstance(baseline, dict) or baseline.get("kind") != "stability-baseline":
        raise RecordError(f"{where_} is not a stability baseline (no kind='stability-baseline'); make one "
                          f"with `stability baseline make`")
    version = baseline.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise RecordError(f"{where_} has schema_version={version!r}: this version of stability reads baseline "
                          f"schema_version={BASELINE_SCHEMA_VERSION} (the unperturbed runs and their rounding "
                          f"replicates, which perturb every step, the calibration, the reference arm named "
                          f"{REFERENCE_ARM!r}; schema 6 is read as 7, its cases' names renamed); make it again "
                          f"with `stability baseline make`")
    check_layout(baseline, Baseline, where_)
    for key in ("preset", "device"):
        if not baseline[key]:
            raise RecordError(f"{where_}: {key} = {shown(baseline[key])}: expected a name")
    min_seeds = baseline["min_seeds"]
    _at_least(min_seeds, 1, "min_seeds", where_)
    replicates = baseline["replicates"]
    if not replicates or min(replicates) < 0 or len(set(replicates)) != len(replicates):
        raise RecordError(f"{where_}: replicates = {shown(replicates)}: expected a non-empty list of distinct whole "
                          f"numbers >= 0 (0 the unperturbed runs)")
    cases = baseline["cases"]
    if not cases:
        raise RecordError(f"{where_}: cases = {{}}: expected a non-empty object (case key -> its runs)")
    for key, case in cases.items():
        _check_case(key, case, [str(r) for r in replicates], min_seeds, where_)
    invariants = baseline.get("invariants")
    if invariants is not None:
        from stability.record.invariants import check_line

        for index, line in enumerate(invariants):
            check_line(line, f"{where_}: invariants[{index}]")
    if baseline.get("calibration") is not None:
        _check_calibration(baseline["calibration"], where_)
    if baseline.get("null_jobs") is not None:
        _check_null_jobs(baseline["null_jobs"], where_)
    if baseline.get("covers") is not None:
        from stability.check.coverage import invariant_names

        held = invariant_names(cases, invariants)
        if baseline["covers"].get("invariants") != held:
            raise RecordError(f"{where_}: covers.invariants = {shown(baseline['covers'].get('invariants'))} does "
                              f"not name the invariants the baseline holds ({shown(held)}): edited by hand? "
                              f"Remake it")
    return baseline


# Keys that baselines written before a rename hold, and their names today. A rounding replicate was once
# called a "draw": such a baseline says "draws" (top level and in its calibration) where one now says
# "replicates", and reads as the same baseline.
def load_baseline(path) -> dict:
    """Read and validate a baseline file (one of the schema before, or written before a key's rename, read as
    this schema holds it: ``stability.record.upgrade.upgraded_baseline``); RecordError (exit 2) with a clear
    message otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"baseline {str(path)!r} does not exist; create it with `stability baseline make "
                          f"--out {path}`")
    return validate_baseline(upgraded_baseline(read_json(path, "baseline")), f"baseline {str(path)!r}")
