"""A regression baseline: every seed's unperturbed run and rounding replicates of the stress cases.

    baseline = make_baseline(records)          # from the records of one run directory (one preset, device)
    write_baseline(baseline, path); load_baseline(path)

A baseline (``reports/baselines/<preset>-<device>.json``) holds, per stress case (its key
``stability.record.case_key``: "smoke/batch_ramp-sqrt"), arm, seed and judged figure, the value of the seed's unperturbed run
(replicate 0) and of its *replicates*: runs of the same code, config and seed whose initial parameters and
every step's gradients differ by one rounding step (``run.replicate``; ``stability.model.rounding``). Training
is chaotic, so a harmless change of rounding moves a figure about as much as the replicates differ: their
spread is the noise of the check (``stability.check.regression``). Besides the values it records the commit
it was made from (a tree with uncommitted changes is refused unless ``allow_dirty``: nobody could say which
code it describes), the kind of noise its replicates are (``NOISE``), once judged its calibration
(``stability.check.calibration``) and, once measured, its null jobs (``null_jobs``: harmless jobs of its code,
every run a fresh replicate, judged against it; the job's measured false-alarm rate).

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path

from stability.check.coverage import covers, merged
from stability.record import (
    REFERENCE_ARM,
    USABLE,
    RecordError,
    Status,
    case_key,
    case_name,
    case_steps,
    comparable_config,
    config_diff,
    config_fingerprint,
    device_kind,
    record_device,
    record_replicate,
    validate_record,
    where,
    write_json,
)
from stability.record import figures as fig
from stability.record.io import read_json

BASELINE_SCHEMA_VERSION = 6   # 6: replicates perturb every step (5: the initial weights only; 4: the arm "baseline")
NOISE = ("rounding: every initial parameter x (1 + u 2^-23), u in {-1, 0, 1}; every step's gradients "
         "+ e 2^-23 rms(gradient), e ~ N(0, 1)")
MIN_SEEDS = 3
MIN_REPLICATES = 3     # per arm and seed: the reference and at least two replicates


def default_baseline_path(preset: str, device: str, directory: str | Path = "reports/baselines") -> Path:
    return Path(directory) / f"{preset}-{device_kind(device)}.json"


# ----------------------------------------------------------------------------- records -> cases

def regression_records(records: list[dict]) -> tuple[list[dict], list[str], list[str]]:
    """(the records a check or a baseline may use: purpose "regression"; notes on the records of other
    purposes, which are never compared; errors: records a crash or a stop left unfinished, which cannot
    be judged)."""
    used, notes, errors = [], [], []
    left: dict[str, int] = {}
    for index, record in enumerate(records):
        purpose = record.get("purpose", "regression")
        if purpose != "regression":
            left[purpose] = left.get(purpose, 0) + 1
        elif record.get("status") in (Status.RUNNING, Status.KILLED):
            errors.append(f"{where(record, index)}: the case is {record.get('status')!r} (interrupted, or its "
                          f"process died): its figures cannot be judged; finish it with `stability stress "
                          f"--resume` or run the job again")
        else:
            used.append(record)
    notes += [f"left out {n} {purpose} record(s): only purpose 'regression' is compared"
              for purpose, n in sorted(left.items())]
    return used, notes, errors


def _check_usable(record: dict, index: int) -> None:
    validate_record(record, where(record, index))
    for arm in record["arms"]:
        if arm["status"] not in USABLE:
            reason = f" ({arm.get('stop_reason')})" if arm.get("stop_reason") else ""
            raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} has status "
                              f"{arm['status']!r}{reason}: only completed or diverged arms can be compared; "
                              f"rerun the case")


def figure_value(record: dict, index: int, arm: dict, name: str) -> float | None:
    """A final figure as a float (None: non-finite, written as null); RecordError for a value that is not
    a number or a figure the table does not know (unusable input, never a regression)."""
    value = arm["final"][name]
    if fig.figure(name) is None:
        raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} holds figure {name!r}, "
                          f"which the figure table (stability.record.figures) does not know: expected a figure "
                          f"of the table, or an entry for it there")
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise RecordError(f"{where(record, index)}: arm {arm['arm']}/seed {arm['seed']} figure {name}={value!r} "
                          f"is not a number ({type(value).__name__}): expected a number, true/false or null")
    return float(value) if math.isfinite(value) else None


def case_values(records: list[dict]) -> dict[str, dict]:
    """{case key: {"name", "schedule", "stress", "steps", "fingerprint", "config", "records",
                   "arms": {arm: {"status": {seed: {replicate: status}}, "diverged_at_step": {seed: {replicate: step}},
                                  "figures": {figure: {seed: {replicate: value or None}}}}}}}.

    Seeds and replicates are strings (JSON keys). A judged figure is held for every run that reports it; an
    evaluation or peak figure (``Figure.needs_completed_arm``) of a run that did not complete is not (it
    describes a broken model or the size of its explosion). None is a figure that is non-finite."""
    cases: dict[str, dict] = {}
    for index, record in enumerate(records):
        _check_usable(record, index)
        key = case_key(record)
        fingerprint = config_fingerprint(record["config"])
        steps = case_steps(record)   # the run length its case declared (stability.record.cases)
        case = cases.setdefault(key, {"name": record["name"], "schedule": record["schedule"],
                                      "stress": case_name(record), "steps": steps, "fingerprint": fingerprint,
                                      "config": comparable_config(record["config"]), "records": [], "arms": {}})
        if case["fingerprint"] != fingerprint:
            raise RecordError(f"{where(record, index)}: case {key} appears with two different configs among the "
                              f"records ({config_diff(case['config'], comparable_config(record['config']))})")
        case["records"].append(record.get("id"))
        replicate = str(record_replicate(record))
        for arm in record["arms"]:
            entry = case["arms"].setdefault(arm["arm"], {"status": {}, "diverged_at_step": {}, "figures": {}})
            seed = str(arm["seed"])
            if replicate in entry["status"].setdefault(seed, {}):
                raise RecordError(f"{where(record, index)}: case {key} arm {arm['arm']} seed {seed} replicate "
                                  f"{replicate} appears twice among the records (pass one run directory, or records "
                                  f"of distinct seeds)")
            entry["status"][seed][replicate] = arm["status"]
            entry["diverged_at_step"].setdefault(seed, {})[replicate] = arm.get("diverged_at_step")
            for name in arm.get("final") or {}:
                if fig.figure(name) is None:
                    continue   # a figure of an extension this process has not loaded (validate_record kept it)
                value = figure_value(record, index, arm, name)
                table_entry = fig.figure(name)
                if table_entry.better is None:
                    continue
                if table_entry.needs_completed_arm and arm["status"] != Status.COMPLETED:
                    continue
                entry["figures"].setdefault(name, {}).setdefault(seed, {})[replicate] = value
    return cases


# ----------------------------------------------------------------------------- the document

def make_baseline(records: list[dict], commit: str | None = None, min_seeds: int = MIN_SEEDS,
                  min_replicates: int = MIN_REPLICATES, allow_dirty: bool = False,
                  invariants: list[dict] | None = None) -> dict:
    """A baseline document from the regression records of one preset and device, holding every seed's
    unperturbed run and replicates, and the commit that trained them (``commit`` overrides it); RecordError
    otherwise (too few seeds or replicates, records of several commits, of a tree with uncommitted changes
    unless ``allow_dirty``, unfinished records). ``invariants``: the model invariants the suites recorded in
    the baseline's run (``stability.record.invariants``), kept with it: which held for this model (None: the
    run recorded none, no suites ran)."""
    records, _, errors = regression_records(records)
    if errors:
        raise RecordError(errors[0])
    if not records:
        raise RecordError("no regression records to make a baseline from (fault, self-check and claim records "
                          "are never used)")
    presets = {r.get("preset") for r in records}
    if len(presets) > 1:
        raise RecordError(f"the records come from several presets {sorted(map(str, presets))}: a baseline holds "
                          f"one preset; pass the records of one preset")
    devices = {record_device(r) for r in records}
    if len(devices) > 1:
        raise RecordError(f"the records come from several devices {sorted(devices)}: a baseline holds one")
    commits = sorted({str((r.get("git") or {}).get("commit")) for r in records})
    if len(commits) > 1 and commit is None:
        raise RecordError(f"the records were trained from several commits ({', '.join(c[:12] for c in commits)}): a "
                          f"baseline describes one code; make it from the records of one run")
    dirty = sorted({(r.get("git") or {}).get("commit") or "unknown" for r in records
                    if (r.get("git") or {}).get("dirty")})
    if dirty and not allow_dirty:
        raise RecordError(f"the records were trained from a tree with uncommitted changes (commit "
                          f"{', '.join(c[:12] for c in dirty)}, dirty): nobody could say which code the baseline "
                          f"describes; commit the changes and make it again, or pass --allow-dirty")
    cases = case_values(records)
    for key, case in cases.items():
        for arm, entry in case["arms"].items():
            if len(entry["status"]) < min_seeds:
                raise RecordError(f"case {key} arm {arm} has {len(entry['status'])} seed(s) "
                                  f"({sorted(entry['status'])}): a baseline needs at least {min_seeds} seeds per "
                                  f"case; run with --set seeds=0,1,2")
            for seed, runs in entry["status"].items():
                if len(runs) < min_replicates:
                    raise RecordError(f"case {key} arm {arm} seed {seed} has {len(runs)} run(s) (replicates "
                                      f"{sorted(runs, key=int)}): a baseline needs the reference and at least "
                                      f"{min_replicates - 1} replicates to know its noise; make it with `stability "
                                      f"baseline make` or run the suites with --replicates N")
    replicates = sorted({int(r) for case in cases.values() for arm in case["arms"].values()
                         for per_seed in arm["status"].values() for r in per_seed})
    git = records[-1].get("git") or {}
    return {
        "schema_version": BASELINE_SCHEMA_VERSION, "kind": "stability-baseline",
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "preset": presets.pop(), "device": devices.pop(), "min_seeds": min_seeds, "replicates": replicates,
        "commit": commit if commit is not None else git.get("commit"), "branch": git.get("branch"),
        "dirty": bool(dirty), "noise": NOISE, "cases": dict(sorted(cases.items())),
        "invariants": None if invariants is None else list(invariants),
        "covers": covers(records, invariants),
    }


def merge_cases(old: dict, new: dict, stress: list[str]) -> dict:
    """``old`` with the cases of the stress cases ``stress`` taken from ``new`` (a baseline made of those cases'
    runs only: a baseline remade case by case). The two must be of one preset, device and set of replicates; each
    case keeps the commit that trained it (``case["commit"]``), the document's ``commit`` becomes ``new``'s and
    ``cases_remade`` names what was remade. The invariants of the remade cases are ``new``'s. RecordError when
    ``new`` lacks one of the cases or holds another."""
    for key in ("preset", "device", "replicates"):
        if old.get(key) != new.get(key):
            raise RecordError(f"the cases remade differ from the baseline's in {key}: {new.get(key)!r} against "
                              f"{old.get(key)!r}: expected the baseline's (remake it whole)")
    made = {c["stress"] for c in new["cases"].values()}
    if made != set(stress):
        raise RecordError(f"the runs remade hold the cases {sorted(made)}: expected exactly {sorted(stress)}")
    cases = {key: {**case, "commit": case.get("commit") or old.get("commit")}
             for key, case in old["cases"].items() if case["stress"] not in stress}
    cases.update({key: {**case, "commit": new.get("commit")} for key, case in new["cases"].items()})
    invariants = None
    if old.get("invariants") is not None or new.get("invariants") is not None:
        keys = set(new["cases"])
        invariants = [line for line in old.get("invariants") or [] if line["case"] not in keys] \
            + list(new.get("invariants") or [])
    return {**old, "created_at": new["created_at"], "commit": new.get("commit"), "branch": new.get("branch"),
            "dirty": bool(old.get("dirty") or new.get("dirty")), "cases": dict(sorted(cases.items())),
            "invariants": invariants, "covers": merged(old, new, set(new["cases"]), cases, invariants), "cases_remade": sorted(stress),
            "calibration": None}


def run_invariants(records: list[dict]) -> list[dict] | None:
    """The model invariants recorded in the run directories the records came from (their ``_path``); None
    when none of them holds an invariants file (the suites did not run there)."""
    from stability.record.invariants import PATTERN, read_invariants

    folders = sorted({str(Path(r["_path"]).parent) for r in records if r.get("_path")})
    if not any(any(Path(folder).glob(PATTERN)) for folder in folders):
        return None
    return [line for folder in folders for line in read_invariants(folder)]


# ----------------------------------------------------------------------------- reading one back

TOP_KEYS = ("schema_version", "kind", "created_at", "preset", "device", "min_seeds", "replicates", "commit", "branch",
            "dirty", "noise", "cases", "invariants", "calibration", "null_jobs", "cases_remade", "covers")
REQUIRED_TOP_KEYS = ("preset", "device", "min_seeds", "replicates", "cases")
CASE_KEYS = ("name", "schedule", "stress", "steps", "fingerprint", "config", "records", "arms", "commit")
ARM_KEYS = ("status", "diverged_at_step", "figures")
CALIBRATION_KEYS = ("arrangements", "seeds", "replicates", "playing", "dof_rule", "alphas", "failed", "rate", "margin",
                    "closest", "primary_family", "accepted_anyway", "reason")
NULL_JOB_KEYS = ("jobs", "failed", "commit", "replicates", "closest_margin")
# the config fields the check computes a figure's resolution from (stability.record.figures.quantum)
RESOLUTION_FIELDS = ("run.data.batch_size", "run.model.context", "run.probes.eval_batches", "run.model.n_heads",
                     "run.model.n_layers")
# figures of kind "run" that every completed run reports as a finite number (the arm's own trajectory)
EVERY_COMPLETED_RUN = ("steps_completed", "nonfinite_events", "nonfinite_unhandled", "skipped_steps", "diverged",
                       "divergence_step", "early_loss", "early_grad_norm")


def _type_name(value) -> str:
    return "null" if value is None else type(value).__name__


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _object(value, what: str, where_: str) -> dict:
    if not isinstance(value, dict):
        raise RecordError(f"{where_}: {what} = {_short(value)}: expected an object, got {_type_name(value)}")
    return value


def _known_keys(value: dict, keys: tuple[str, ...], what: str, where_: str) -> None:
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise RecordError(f"{where_}: {what} holds {unknown[0]!r}, which a baseline does not have: expected "
                          f"only {', '.join(keys)}")


def null_allowed(name: str, status: str) -> bool:
    """Whether a baseline may hold null (a value that was not finite) for figure ``name`` of a run of ``status``.

    A run that did not complete may lack any figure. A completed run may lack only what it can leave
    undefined: a member of a family, measured on a run of its own (``loss_gap_fp16`` when the fp16 rung
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
        raise RecordError(f"{where_}: config.arms = {_short(arms)}: expected the arm names, e.g. 'reference,gated'")
    if not names:
        raise RecordError(f"{where_}: config.arms = {_short(arms)}: expected at least one arm name")
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
            raise RecordError(f"{where_}: figure {name} = {_short(value)}: expected a number (true/false only for a "
                              f"figure that is a seed's outcome, such as diverged)")
    elif value is None or (isinstance(value, float) and not math.isfinite(value)):
        if not null_allowed(name, status):
            raise RecordError(f"{where_}: figure {name} = null in a completed run: expected a finite number (a completed "
                              f"run's {entry.kind} figure is never non-finite; null only where the run did not "
                              f"complete)")
    elif not _is_number(value):
        raise RecordError(f"{where_}: figure {name} = {_short(value)}: expected a number, got {_type_name(value)}")


def _check_arm(case_key_: str, arm: str, entry, seeds: list[str], replicates: list[str], config: dict,
               where_: str) -> None:
    here = f"{where_}: case {case_key_} arm {arm}"
    entry = _object(entry, "arms." + arm, f"{where_}: case {case_key_}")
    _known_keys(entry, ARM_KEYS, f"arm {arm}", f"{where_}: case {case_key_}")
    for key in ARM_KEYS:
        if key not in entry:
            raise RecordError(f"{here} has no {key!r} field")
        _object(entry[key], key, here)
    status = entry["status"]
    if sorted(status, key=str) != sorted(seeds, key=str):
        raise RecordError(f"{here}: status holds seeds {sorted(status)}, the case's other arms {sorted(seeds)}: "
                          f"expected the same seeds in every arm")
    for seed in seeds:
        per_replicate = _object(status[seed], f"status.{seed}", here)
        if sorted(per_replicate) != sorted(replicates):
            raise RecordError(f"{here} seed {seed}: status holds replicates {sorted(per_replicate)}: expected the "
                              f"baseline's replicates {sorted(replicates)}")
        for replicate, value in per_replicate.items():
            if value not in tuple(USABLE):
                raise RecordError(f"{here} seed {seed} replicate {replicate}: status = {_short(value)}: expected "
                                  f"one of {sorted(USABLE)}")
    steps = entry["diverged_at_step"]
    for seed, per_replicate in steps.items():
        if seed not in status:
            raise RecordError(f"{here}: diverged_at_step holds seed {seed!r}, which status does not: expected the "
                              f"arm's seeds {sorted(seeds)}")
        for replicate, value in _object(per_replicate, f"diverged_at_step.{seed}", here).items():
            if replicate not in status[seed]:
                raise RecordError(f"{here} seed {seed}: diverged_at_step holds replicate {replicate!r}: expected "
                                  f"the baseline's replicates {sorted(replicates)}")
            if value is not None and not (_is_whole(value) and value >= 0):
                raise RecordError(f"{here} seed {seed} replicate {replicate}: diverged_at_step = {_short(value)}: "
                                  f"expected a step (a whole number >= 0) or null")
    for name, per_seed in entry["figures"].items():
        table_entry = fig.figure(name)
        if table_entry is None:
            raise unknown_figure(name, config, here)
        if table_entry.better is None:
            raise RecordError(f"{here}: figure {name!r} is never judged (the figure table gives it no "
                              f"direction): expected only judged figures")
        for seed, per_replicate in _object(per_seed, f"figures.{name}", here).items():
            if seed not in status:
                raise RecordError(f"{here} figure {name}: seed {seed!r} is not one of the arm's seeds "
                                  f"{sorted(seeds)}")
            for replicate, value in _object(per_replicate, f"figures.{name}.{seed}", here).items():
                if replicate not in status[seed]:
                    raise RecordError(f"{here} seed {seed} figure {name}: replicate {replicate!r} is not one of "
                                      f"the baseline's replicates {sorted(replicates)}")
                run_status = status[seed][replicate]
                if table_entry.needs_completed_arm and run_status != Status.COMPLETED:
                    raise RecordError(f"{here} seed {seed} replicate {replicate}: figure {name} is held for a run that "
                                      f"{run_status}: an evaluation or peak figure is kept for completed runs only")
                _check_figure_value(name, value, run_status, f"{here} seed {seed} replicate {replicate}")


def _check_case(key: str, case, replicates: list[str], min_seeds: int, where_: str) -> None:
    here = f"{where_}: case {key}"
    case = _object(case, f"cases.{key}", where_)
    _known_keys(case, CASE_KEYS, f"case {key}", where_)
    for field in CASE_KEYS:
        if field not in case and field not in ("records", "commit"):
            raise RecordError(f"{here} has no {field!r} field (truncated?)")
    for field in ("name", "schedule", "stress", "fingerprint"):
        if not isinstance(case[field], str):
            raise RecordError(f"{here}: {field} = {_short(case[field])}: expected a string")
    if case.get("commit") is not None and not isinstance(case["commit"], str):
        raise RecordError(f"{here}: commit = {_short(case['commit'])}: expected the commit that trained it or null")
    if not (_is_whole(case["steps"]) and case["steps"] >= 1):
        raise RecordError(f"{here}: steps = {_short(case['steps'])}: expected a whole number of steps >= 1")
    records = case.get("records", [])
    if not isinstance(records, list) or not all(r is None or isinstance(r, str) for r in records):
        raise RecordError(f"{here}: records = {_short(records)}: expected a list of record ids")
    config = _object(case["config"], "config", here)
    for field in RESOLUTION_FIELDS:
        if field in config and not (_is_whole(config[field]) and config[field] >= 1):
            raise RecordError(f"{here}: config.{field} = {_short(config[field])}: expected a whole number >= 1")
    plugins = config.get("plugins") or []
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise RecordError(f"{here}: config.plugins = {_short(plugins)}: expected a list of extension names")
    arms = _object(case["arms"], "arms", here)
    wanted = case_arm_names(config, here)
    missing = [arm for arm in wanted if arm not in arms]
    if missing:
        raise RecordError(f"{here} has no arm {missing[0]!r}: expected every arm its config trains "
                          f"({', '.join(wanted)})")
    first = arms[wanted[0]]
    seeds = list(first.get("status") or {}) if isinstance(first, dict) and isinstance(first.get("status"), dict) \
        else []
    if len(seeds) < min_seeds:
        raise RecordError(f"{here} arm {wanted[0]}: {len(seeds)} seed(s) {sorted(seeds)}: expected at least "
                          f"min_seeds={min_seeds}")
    for arm, entry in arms.items():
        _check_arm(key, arm, entry, seeds, replicates, config, where_)


def _check_calibration(calibration, where_: str) -> None:
    """null, or the object ``stability.check.calibration.stored`` writes."""
    if calibration is None:
        return
    here = f"{where_}: calibration"
    _object(calibration, "calibration", where_)
    _known_keys(calibration, CALIBRATION_KEYS, "calibration", where_)
    for key in CALIBRATION_KEYS:
        if key not in calibration:
            raise RecordError(f"{here} has no {key!r} field: expected what `stability baseline calibrate --write` "
                              f"stores")
    playing = calibration["playing"]
    if not isinstance(playing, list) or not all(_is_whole(r) and r >= 0 for r in playing):
        raise RecordError(f"{here}.playing = {_short(playing)}: expected the replicates that played the change")
    for key in ("arrangements", "seeds", "replicates"):
        if not (_is_whole(calibration[key]) and calibration[key] >= 0):
            raise RecordError(f"{here}.{key} = {_short(calibration[key])}: expected a whole number >= 0")
    alphas, failed, rate = calibration["alphas"], calibration["failed"], calibration["rate"]
    if not isinstance(alphas, list) or not alphas or not all(_is_number(a) and 0 < a < 1 for a in alphas):
        raise RecordError(f"{here}.alphas = {_short(alphas)}: expected a list of rates in (0, 1)")
    if not isinstance(failed, list) or len(failed) != len(alphas) or not all(_is_whole(n) and n >= 0 for n in failed):
        raise RecordError(f"{here}.failed = {_short(failed)}: expected a count >= 0 per alpha")
    if not isinstance(rate, list) or len(rate) != len(alphas) or \
            not all(r is None or (_is_number(r) and 0 <= r <= 1) for r in rate):
        raise RecordError(f"{here}.rate = {_short(rate)}: expected a fraction (or null) per alpha")
    if calibration["margin"] is not None and not (_is_number(calibration["margin"]) and calibration["margin"] >= 0):
        raise RecordError(f"{here}.margin = {_short(calibration['margin'])}: expected a number >= 0 or null")
    if not isinstance(calibration["dof_rule"], str):
        raise RecordError(f"{here}.dof_rule = {_short(calibration['dof_rule'])}: expected a string")
    closest = _object(calibration["closest"], "calibration.closest", where_)
    reason = closest.get("reason", [])
    if not isinstance(reason, list) or not all(isinstance(r, str) for r in reason):
        raise RecordError(f"{here}.closest.reason = {_short(reason)}: expected a list of strings")
    family = calibration["primary_family"]
    if not isinstance(family, list) or not all(isinstance(row, dict) for row in family):
        raise RecordError(f"{here}.primary_family = {_short(family)}: expected a list of objects")
    if not isinstance(calibration["accepted_anyway"], bool):
        raise RecordError(f"{here}.accepted_anyway = {_short(calibration['accepted_anyway'])}: expected true/false")
    if calibration["reason"] is not None and not isinstance(calibration["reason"], str):
        raise RecordError(f"{here}.reason = {_short(calibration['reason'])}: expected a string or null")


def validate_baseline(baseline, where_: str) -> dict:
    """``baseline`` itself when the whole document can be judged against: every field of its type and
    domain, every case holding every arm its config trains, every arm every seed and replicate, every figure
    one of the table and its values numbers where the run completed (``null_allowed``); RecordError,
    one line naming ``where_``, the case, arm, seed and figure, otherwise. Nothing is judged before it."""
    if not isinstance(baseline, dict) or baseline.get("kind") != "stability-baseline":
        raise RecordError(f"{where_} is not a stability baseline (no kind='stability-baseline'); make one "
                          f"with `stability baseline make`")
    version = baseline.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise RecordError(f"{where_} has schema_version={version!r}: this version of stability reads baseline "
                          f"schema_version={BASELINE_SCHEMA_VERSION} (the unperturbed runs and their rounding "
                          f"replicates, which perturb every step, the calibration, the reference arm named "
                          f"{REFERENCE_ARM!r}); make it again with `stability baseline make`")
    for key in REQUIRED_TOP_KEYS:
        if key not in baseline:
            raise RecordError(f"{where_} has no {key!r} field (truncated?)")
    _known_keys(baseline, TOP_KEYS, "the baseline", where_)
    for key in ("preset", "device"):
        if not isinstance(baseline[key], str) or not baseline[key]:
            raise RecordError(f"{where_}: {key} = {_short(baseline[key])}: expected a name (a string)")
    for key in ("commit", "branch", "created_at"):
        if baseline.get(key) is not None and not isinstance(baseline[key], str):
            raise RecordError(f"{where_}: {key} = {_short(baseline[key])}: expected a string or null")
    if not isinstance(baseline.get("dirty", False), bool):
        raise RecordError(f"{where_}: dirty = {_short(baseline['dirty'])}: expected true or false")
    min_seeds = baseline["min_seeds"]
    if not (_is_whole(min_seeds) and min_seeds >= 1):
        raise RecordError(f"{where_}: min_seeds = {_short(min_seeds)}: expected a whole number >= 1")
    replicates = baseline["replicates"]
    if not isinstance(replicates, list) or not replicates or not all(_is_whole(r) and r >= 0 for r in replicates) \
            or len(set(replicates)) != len(replicates):
        raise RecordError(f"{where_}: replicates = {_short(replicates)}: expected a non-empty list of distinct whole "
                          f"numbers >= 0 (0 the unperturbed runs)")
    remade = baseline.get("cases_remade", [])
    if not isinstance(remade, list) or not all(isinstance(name, str) for name in remade):
        raise RecordError(f"{where_}: cases_remade = {_short(remade)}: expected a list of stress case names")
    cases = baseline["cases"]
    if not isinstance(cases, dict) or not cases:
        raise RecordError(f"{where_}: cases = {_short(cases)}: expected a non-empty object (case key -> its runs)")
    for key, case in cases.items():
        _check_case(key, case, [str(r) for r in replicates], min_seeds, where_)
    invariants = baseline.get("invariants")
    if invariants is not None:
        from stability.record.invariants import check_line

        if not isinstance(invariants, list):
            raise RecordError(f"{where_}: invariants = {_short(invariants)}: expected a list of invariants or null")
        for index, line in enumerate(invariants):
            check_line(line, f"{where_}: invariants[{index}]")
    if baseline.get("noise") is not None and not isinstance(baseline["noise"], str):
        raise RecordError(f"{where_}: noise = {_short(baseline['noise'])}: expected the kind of its replicates (text)")
    _check_calibration(baseline.get("calibration"), where_)
    _check_null_jobs(baseline.get("null_jobs"), where_)
    _check_covers(baseline.get("covers"), where_)
    if baseline.get("covers") is not None:
        from stability.check.coverage import invariant_names

        held = invariant_names(cases, invariants)
        if baseline["covers"].get("invariants") != held:
            raise RecordError(f"{where_}: covers.invariants = {_short(baseline['covers'].get('invariants'))} does "
                              f"not name the invariants the baseline holds ({_short(held)}): edited by hand? "
                              f"Remake it")
    return baseline


def _check_null_jobs(jobs, where_: str) -> None:
    """null, or what ``stability.check.calibration.null_job_evidence`` writes: how many null jobs were judged
    against the baseline and how many failed."""
    if jobs is None:
        return
    jobs = _object(jobs, "null_jobs", where_)
    _known_keys(jobs, NULL_JOB_KEYS, "null_jobs", where_)
    for key in ("jobs", "failed"):
        if not (_is_whole(jobs.get(key)) and jobs[key] >= 0):
            raise RecordError(f"{where_}: null_jobs.{key} = {_short(jobs.get(key))}: expected a whole number >= 0")
    if jobs["failed"] > jobs["jobs"]:
        raise RecordError(f"{where_}: null_jobs.failed = {jobs['failed']} is more than null_jobs.jobs = "
                          f"{jobs['jobs']}: expected at most as many failures as jobs")
    if jobs.get("commit") is not None and not isinstance(jobs["commit"], str):
        raise RecordError(f"{where_}: null_jobs.commit = {_short(jobs['commit'])}: expected a commit or null")
    replicates = jobs.get("replicates")
    if replicates is not None and not (isinstance(replicates, list) and all(_is_whole(r) for r in replicates)):
        raise RecordError(f"{where_}: null_jobs.replicates = {_short(replicates)}: expected a list of replicates")
    if jobs.get("closest_margin") is not None and not (_is_number(jobs["closest_margin"]) and
                                                       jobs["closest_margin"] >= 0):
        raise RecordError(f"{where_}: null_jobs.closest_margin = {_short(jobs['closest_margin'])}: expected a "
                          f"number >= 0 or null")


def _names_per_case(value, what: str, where_: str) -> None:
    if not isinstance(value, dict) or not all(isinstance(names, list) and all(isinstance(n, str) for n in names)
                                              for names in value.values()):
        raise RecordError(f"{where_}: covers.{what} = {_short(value)}: expected an object (case key -> a list of "
                          f"names)")


def _check_covers(covered, where_: str) -> None:
    """null (a baseline made before baselines stated it: the check calls it stale), or what
    ``stability.check.coverage.covers`` writes."""
    if covered is None:
        return
    covered = _object(covered, "covers", where_)
    _known_keys(covered, ("figures", "invariants", "primary_family", "resolutions"), "covers", where_)
    _names_per_case(covered.get("figures"), "figures", where_)
    if covered.get("invariants") is not None:
        _names_per_case(covered["invariants"], "invariants", where_)
    family = covered.get("primary_family")
    if not isinstance(family, list) or not all(isinstance(row, dict) for row in family):
        raise RecordError(f"{where_}: covers.primary_family = {_short(family)}: expected a list of primary rows")
    resolutions = covered.get("resolutions")
    if not isinstance(resolutions, dict) or not all(r is None or isinstance(r, str) for r in resolutions.values()):
        raise RecordError(f"{where_}: covers.resolutions = {_short(resolutions)}: expected an object (figure -> the "
                          f"kind of its resolution, or null)")


# Keys that baselines written before a rename hold, and their names today. A rounding replicate was once
# called a "draw": such a baseline says "draws" (top level and in its calibration) where one now says
# "replicates", and reads as the same baseline.
OLD_KEYS = {"draws": "replicates"}


def _current_keys(document):
    """``document`` (an object read from a baseline file) with every key of ``OLD_KEYS`` under its name of
    today, in the same place, at the top level and in the calibration. A document that holds both names of
    one key keeps the old one, which ``validate_baseline`` then refuses as a key a baseline does not have."""
    def renamed(value):
        if not isinstance(value, dict):
            return value
        return {OLD_KEYS[k] if k in OLD_KEYS and OLD_KEYS[k] not in value else k: v for k, v in value.items()}

    document = renamed(document)
    if isinstance(document, dict) and "calibration" in document:
        document["calibration"] = renamed(document["calibration"])
    return document


def load_baseline(path) -> dict:
    """Read and validate a baseline file (one written before a key's rename reads under the key's name of
    today: ``OLD_KEYS``); RecordError (exit 2) with a clear message otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"baseline {str(path)!r} does not exist; create it with `stability baseline make "
                          f"--out {path}`")
    return validate_baseline(_current_keys(read_json(path, "baseline")), f"baseline {str(path)!r}")


def write_baseline(baseline: dict, path: str | Path) -> Path:
    return write_json(Path(path), baseline)
