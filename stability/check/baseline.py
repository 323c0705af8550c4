"""A regression baseline: every seed's unperturbed run and rounding replicates of the stress cases.

    baseline = make_baseline(records)          # from the records of one run directory (one preset, device)
    write_baseline(baseline, path)             # read back by stability.check.baseline_schema.load_baseline

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

from stability.check.baseline_schema import BASELINE_SCHEMA_VERSION
from stability.check.coverage import covers, merged
from stability.record import (
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
    """{case key: {"name", "case", "case_label", "steps", "fingerprint", "config", "records",
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
        case = cases.setdefault(key, {"name": record["name"], "case": case_name(record),
                                      "case_label": record["case_label"], "steps": steps, "fingerprint": fingerprint,
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
    made = {c["case"] for c in new["cases"].values()}
    if made != set(stress):
        raise RecordError(f"the runs remade hold the cases {sorted(made)}: expected exactly {sorted(stress)}")
    cases = {key: {**case, "commit": case.get("commit") or old.get("commit")}
             for key, case in old["cases"].items() if case["case"] not in stress}
    cases.update({key: {**case, "commit": new.get("commit")} for key, case in new["cases"].items()})
    invariants = None
    if old.get("invariants") is not None or new.get("invariants") is not None:
        keys = set(new["cases"])
        invariants = [line for line in old.get("invariants") or [] if line["case_key"] not in keys] \
            + list(new.get("invariants") or [])
    return {**old, "created_at": new["created_at"], "commit": new.get("commit"), "branch": new.get("branch"),
            "dirty": bool(old.get("dirty") or new.get("dirty")), "cases": dict(sorted(cases.items())),
            "invariants": invariants, "covers": merged(old, new, set(new["cases"]), cases, invariants), "cases_remade": sorted(stress),
            "calibration": None}


def run_invariants(records: list[dict]) -> list[dict] | None:
    """The model invariants recorded in the run directories the records came from (their ``_path``), one line
    per invariant (case, name, arm, seed); None when none of them holds an invariants file (the suites did not
    run there). Where several directories evaluated one invariant (a baseline made of one job per replicate,
    ``stability stress ... --set replicate=N`` or the suites with ``--stability-replicate N``), it held only if
    it held in each: the line of the first directory where it failed, its message saying in how many."""
    from stability.record.invariants import PATTERN, read_invariants

    folders = sorted({str(Path(r["_path"]).parent) for r in records if r.get("_path")})
    if not any(any(Path(folder).glob(PATTERN)) for folder in folders):
        return None
    evaluated: dict[tuple, list[dict]] = {}
    for folder in folders:
        for line in read_invariants(folder):
            evaluated.setdefault((line["case_key"], line["name"], line["arm"], line["seed"]), []).append(line)
    return [lines[0] if all(line["held"] for line in lines) else failed_somewhere(lines)
            for lines in evaluated.values()]


def failed_somewhere(lines: list[dict]) -> dict:
    """One invariant evaluated in several run directories, failing in some: the first failing line, its
    message saying in how many of them it failed (a single directory's line is kept as it is)."""
    failing = [line for line in lines if not line["held"]]
    if len(lines) == 1:
        return failing[0]
    where = f"failed in {len(failing)} of {len(lines)} run directories"
    return {**failing[0], "message": f"{failing[0]['message']} ({where})" if failing[0]["message"] else where}


def write_baseline(baseline: dict, path: str | Path) -> Path:
    return write_json(Path(path), baseline)
