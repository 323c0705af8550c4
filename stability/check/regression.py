"""The merge check: the records of one job against a recorded baseline -> one verdict, an exit code.

A baseline (``stability.check.baseline``) holds, per stress case, arm, seed and judged figure, the values
of the seed's unperturbed run and of its rounding replicates; their spread is the noise a harmless change
has to be told from. ``check(records, baseline)`` judges the job in four parts:

1. **Fail closed.** What cannot be judged fails the job with exit 2 and the reason: a record left
   unfinished (status "running" or "killed"), a case, arm or seed the baseline judged and the job lacks
   (``cases`` narrows the baseline's cases on purpose, and the verdict says so), a job of other seeds
   than the baseline's (each seed is paired with its own baseline runs), another preset or device, runs
   that cannot be compared (part 4), a figure value that is not a number.
2. **Outcomes, seed by seed** (``stability.check.outcomes``). A run of the job that diverged, met a
   non-finite value its precision recipe did not handle, or did not apply what its case says it applies
   fails the job where every baseline run of its seed was clean; where some were not, a note gives its rank
   p. A figure finite in every baseline run of a seed that is non-finite or absent now fails the job too.
3. **Rows.** Every other judged figure of every case and arm, and the paired difference ``<arm> -
   reference`` of each treatment arm, is a row (its statistics: ``stability.check.rows``). Each row of the
   *primary family* (``stability.check.family``) is two hypotheses, *regressed* (worse by more than its
   floor) and *changed* (moved at all), all of them judged together by Holm's step-down procedure at
   ``alpha`` (``stability.check.verdict.decide``); every other row is *advisory*, never failing the job. A
   row whose runs are the same runs as an earlier row's (identical values in the baseline and in the job)
   is judged once (``mark_duplicates``).
4. **Settings.** A case whose config differs from the baseline's in a setting (the optimiser, the precision
   recipe, the gate, a stress schedule's knobs: ``stability.record.setting_changes``) is judged like any
   other, its settings listed, and the job is CHANGED at least (REGRESSED where a row or outcome is); a case
   whose runs cannot be compared (another model shape, data, run length or set of runs) is unusable input.

Besides the records, the model invariants the job's suites recorded are judged like outcomes
(``judge_invariants``), and the tests that failed (``stability.check.junit``) fail the job. The verdict, its
exit code (0 pass, 1 regressed, 3 changed, 2 unusable input) and the job's false-alarm rate are
``stability.check.verdict.CheckResult``.

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import json
import math

from stability.check.baseline import case_values, default_baseline_path, regression_records
from stability.check.baseline_schema import validate_baseline
from stability.check.coverage import reported, stale
from stability.check.family import advisory_here, in_primary_family
from stability.check.outcomes import mixed_status_notes, outcomes_of_arm
from stability.check.rows import DOF_RULE, FP32_RESOLUTION, Row, judge
from stability.check.tolerances import resolve_tolerances
from stability.check.verdict import DEFAULT_ALPHA, CheckResult, Outcome, decide
from stability.record import (
    REFERENCE_ARM,
    RecordError,
    arm_names,
    case_key,
    config_diff,
    config_fingerprint,
    record_device,
    setting_changes,
    where,
)
from stability.record import figures as fig
from stability.record.machine import machines_of
from stability.report.tables import fmt


def paired_arm(arm: str) -> str:
    """The name of the paired-difference rows of a treatment arm."""
    return f"{arm}-{REFERENCE_ARM}"


def single_replicate(case: dict, key: str) -> dict:
    """The job's values, seed -> value: one replicate per arm and seed (a check judges one job)."""
    arms = {}
    for arm, entry in case["arms"].items():
        for seed, runs in entry["status"].items():
            if len(runs) > 1:
                raise RecordError(f"case {key} arm {arm} seed {seed}: the records hold {len(runs)} runs "
                                  f"(replicates {sorted(runs, key=int)}): a check judges one job's records; pass "
                                  f"the run directory of one job")
        arms[arm] = {"status": {s: next(iter(d.values())) for s, d in entry["status"].items()},
                     "diverged_at_step": {s: next(iter(d.values())) for s, d in entry["diverged_at_step"].items()},
                     "figures": {name: {s: next(iter(d.values())) for s, d in values.items()}
                                 for name, values in entry["figures"].items()}}
    return arms


def paired_values(arms: dict, arm: str, name: str, nested: bool) -> dict:
    """seed (-> replicate) -> (arm - baseline) of one figure, where both arms report it (None when either is
    None)."""
    ref = arms.get(REFERENCE_ARM, {}).get("figures", {}).get(name, {})
    own = arms.get(arm, {}).get("figures", {}).get(name, {})

    def minus(a, b):
        return a - b if a is not None and b is not None else None
    if not nested:
        return {s: minus(own[s], ref[s]) for s in own if s in ref}
    return {s: {d: minus(own[s][d], ref[s][d]) for d in own[s] if d in ref[s]} for s in own if s in ref}


def operand_resolution(arms: dict, arm: str, name: str) -> float:
    """One fp32 rounding step of a paired difference (arm - reference): each operand rounds at its own
    magnitude, so the difference of two runs that agree to the last bit of each arm moves by up to
    2^-23 x (|arm| + |reference|), however small the difference itself is."""
    def largest(which: str) -> float:
        values = [abs(v) for runs in arms.get(which, {}).get("figures", {}).get(name, {}).values()
                  for v in runs.values() if v is not None and math.isfinite(v)]
        return max(values, default=0.0)
    return FP32_RESOLUTION * (largest(arm) + largest(REFERENCE_ARM))


def rows_of_case(result: CheckResult, key: str, base: dict, case: dict, tolerances: dict,
                 dof_rule: str = DOF_RULE, advisory: bool = True, held_out: int = 0) -> None:
    """The outcomes, notes and rows of one case (its arms and seeds must match the baseline's); without
    ``advisory``, the primary rows only; ``held_out``: see ``stability.check.outcomes.outcome_p``."""
    current = single_replicate(case, key)
    config, steps = base.get("config") or case["config"], base.get("steps") or case["steps"]
    stress = base["case"]
    missing_arms = sorted(set(base["arms"]) - set(current))
    if missing_arms:
        result.errors.append(f"case {key}: arm(s) {', '.join(missing_arms)} of the baseline are not in the job's "
                             f"records: a job must train every arm the baseline judged")
        return
    for arm in arm_names([{"arm": a} for a in current]):
        if arm not in base["arms"]:
            result.notes.append(f"case {key}: arm {arm} is not in the baseline (new arm): not compared")
            continue
        base_arm, cur_arm = base["arms"][arm], current[arm]
        base_seeds, cur_seeds = set(base_arm["status"]), set(cur_arm["status"])
        if not base_seeds & cur_seeds:
            result.errors.append(f"case {key} arm {arm}: the job's seeds {_seeds(cur_seeds)} are not the baseline's "
                                 f"{_seeds(base_seeds)}: the check pairs each seed with its own baseline runs; "
                                 f"train the baseline's seeds, or make a baseline of these")
            return
        if base_seeds - cur_seeds:
            result.errors.append(f"case {key} arm {arm}: seed(s) {_seeds(base_seeds - cur_seeds)} of the baseline "
                                 f"are not in the job's records (it has {_seeds(cur_seeds)}): a job must train "
                                 f"every seed the baseline judged")
            return
        if cur_seeds - base_seeds:
            result.notes.append(f"case {key} arm {arm}: seed(s) {_seeds(cur_seeds - base_seeds)} are not in the "
                                f"baseline: left out")
        result.outcomes += outcomes_of_arm(key, arm, base_arm, cur_arm, result.notes, held_out, result.clean_cells)
        result.notes += mixed_status_notes(key, arm, base_arm, cur_arm)
    for arm in arm_names([{"arm": a} for a in base["arms"]]):
        base_arm, cur_arm = base["arms"][arm], current[arm]
        names = [n for n in fig.judged(set(base_arm["figures"]) | set(cur_arm["figures"]))
                 if not fig.figure(n).outcome]
        for name in names:
            if not advisory and not in_primary_family(stress, arm, name, result.preset):
                continue
            values = (base_arm["figures"].get(name, {}), cur_arm["figures"].get(name, {}))
            _add_row(result, key, stress, arm, name, *values, fig.quantum(name, config, steps), tolerances, dof_rule)
        if arm == REFERENCE_ARM:
            continue
        for name in names:
            if not advisory and not in_primary_family(stress, paired_arm(arm), name, result.preset):
                continue
            values = (paired_values(base["arms"], arm, name, True), paired_values(current, arm, name, False))
            if any(v is not None for runs in values[0].values() for v in runs.values()) \
                    or any(v is not None for v in values[1].values()):
                quantum = max(fig.quantum(name, config, steps), operand_resolution(base["arms"], arm, name))
                _add_row(result, key, stress, paired_arm(arm), name, *values, quantum, tolerances, dof_rule)


def _seeds(seeds) -> str:
    return ", ".join(sorted(seeds, key=int))


def _add_row(result: CheckResult, key: str, stress: str, arm: str, name: str, baseline: dict, current: dict,
             quantum: float, tolerances: dict, dof_rule: str) -> None:
    """One row before the family-wise decision (ok, new, or missing when the job has no value), with the
    signature of its values (empty for a row whose baseline runs all agree: a constant cannot be told
    apart from another)."""
    stats = judge(baseline, current, name, quantum, tolerances.get(name), dof_rule)
    verdict = "ok"
    if stats["baseline"] is None:
        verdict = "new" if stats["current"] is not None else "ok"
    elif stats["p"] is None:
        verdict, stats["note"] = "missing", "no finite value now (see the failed outcomes)"
    entry = in_primary_family(stress, arm, name, result.preset)
    row = Row(key, arm, name, fig.better(name), verdict=verdict, tier="primary" if entry else "advisory",
              floor_only=bool(entry and entry.floor_only), **stats)
    result.rows.append(row)
    spread = {v for runs in baseline.values() for v in runs.values()}
    result.signatures[id(row)] = json.dumps([baseline, current], sort_keys=True) if len(spread) > 1 else ""


def mark_duplicates(rows: list[Row], values: dict[int, str]) -> None:
    """A row whose values (every baseline run and the job's) repeat another row's of the same arm and
    figure is the same runs judged twice (the sweep's configured runs are the plain pair's): tier
    "duplicate", left out of the primary family; a primary row keeps the judgement. ``values``: id(row) -> a
    canonical text of its values, or "" for a row that cannot be told apart from a constant."""
    seen: dict[tuple[str, str, str], Row] = {}
    for row in sorted(rows, key=lambda r: r.tier != "primary"):
        if row.p is None or not values.get(id(row)):
            continue
        first = seen.setdefault((row.arm, row.figure, values[id(row)]), row)
        if first is not row:
            row.tier, row.verdict, row.note = "duplicate", "duplicate", f"the same runs as {first.case_key}"


def check(records: list[dict], baseline: dict, tolerances: dict | None = None, alpha: float = DEFAULT_ALPHA,
          cases: list[str] | None = None, dof_rule: str = DOF_RULE, invariants: list[dict] | None = None,
          baseline_path: str | None = None) -> CheckResult:
    """Judge one job's records against a baseline at family-wise false-alarm rate ``alpha``. ``cases``:
    the stress cases (names, e.g. "standard") of the baseline to judge; None: every case the baseline
    holds. ``invariants``: the model invariants the job's suites recorded (None: the suites did not run).
    A baseline that does not cover what the job's code judges (``stability.check.coverage``) is unusable
    input, named with the command that remakes it (``baseline_path`` its file), beside the rows judged on
    what it covers: a job whose rows regressed is still REGRESSED. Unusable inputs give exit_code 2 with ``errors`` (never a silent pass); an invalid tolerance table
    raises RecordError."""
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise RecordError(f"alpha={alpha!r} is invalid: expected a false-alarm rate in (0, 1), e.g. 0.01")
    tolerances = resolve_tolerances(tolerances)
    result = CheckResult(alpha=alpha)
    result.job_machines, result.job_machines_unrecorded = machines_of(records)   # the machines it ran on
    try:
        validate_baseline(baseline, "baseline")
    except RecordError as error:
        result.errors.append(str(error))
        return result
    result.baseline_commit, result.preset, result.device = baseline.get("commit"), baseline["preset"], \
        baseline["device"]
    result.replicates = list(baseline.get("replicates") or [])
    result.calibration, result.null_jobs = baseline.get("calibration"), baseline.get("null_jobs")
    result.warnings += calibration_warnings(baseline)
    records, notes, errors = regression_records(records)
    result.notes += notes
    result.errors += errors
    if not records and not errors:
        result.errors.append("no regression records to check")
    for index, record in enumerate(records):
        if record["preset"] != baseline["preset"]:
            result.errors.append(f"{where(record, index)}: preset differs: baseline preset {baseline['preset']!r}, "
                                 f"record preset {record['preset']!r}; compare with "
                                 f"{default_baseline_path(record['preset'], record_device(record))}")
        if record_device(record) != baseline["device"]:
            result.errors.append(f"{where(record, index)}: device differs: baseline device "
                                 f"{baseline['device']!r}, record device {record_device(record)!r}")
    if result.errors:
        return result
    base_cases = select_cases(baseline["cases"], cases, result)
    if result.errors:
        return result
    files: dict[str, list[str]] = {}   # case key -> its records, as messages name them (one config per case)
    for index, record in enumerate(records):
        files.setdefault(case_key(record), []).append(where(record, index))
    try:
        job_cases = case_values(records)
        judge_cases(result, job_cases, base_cases, tolerances, dof_rule, named=files)
    except RecordError as error:
        result.errors.append(str(error))
        return result
    result.errors += stale(baseline, job_cases, reported(records), invariants, set(base_cases), baseline_path, cases)
    judge_invariants(result, baseline.get("invariants"), invariants, set(base_cases))
    result.notes += advisory_here(baseline["preset"], {case["case"] for case in base_cases.values()})
    decide(result)
    return result


def judge_invariants(result: CheckResult, held_before: list[dict] | None, now: list[dict] | None,
                     cases: set[str]) -> None:
    """Model invariants judged like the model's figures: one that held in the baseline's run and does not
    now fails the job (a line naming case, arm, seed, value and bound); one the baseline already showed
    failing is noted, never failing the job again; one the baseline holds that the job's suites did not
    evaluate is unusable input. ``now`` None: the job ran no suites (a note). ``held_before`` None: the
    baseline's run recorded none (a job that recorded some finds it stale: ``stability.check.coverage``)."""
    def key(line):
        return line["case_key"], line["name"], line["arm"], line["seed"]
    if held_before is None:
        return   # a job's invariants the baseline lacks make it stale (stability.check.coverage)
    before = {key(line): line for line in held_before if line["case_key"] in cases}
    if now is None:
        if before:
            result.notes.append(f"the job recorded no model invariants (its suites did not run): the baseline's "
                                f"{len(before)} are not judged")
        return
    after = {key(line): line for line in now if line["case_key"] in cases}
    result.invariants_held += sum(line["held"] for line in before.values())
    for k, line in sorted(before.items(), key=lambda item: str(item[0])):
        who = f"case {line['case_key']} arm {line['arm']}" + (f" seed {line['seed']}" if line["seed"] is not None else "")
        current = after.get(k)
        if current is None:
            result.errors.append(f"{who}: the job's suites did not evaluate model invariant {line['name']}, which the "
                                 f"baseline holds: a job must evaluate what the baseline judged")
        elif line["held"] and not current["held"]:
            result.outcomes.append(Outcome(line["case_key"], str(line["arm"]), str(line["seed"]), line["name"],
                                           f"{who}: model invariant {line['name']} no longer holds "
                                           f"({_value(current)}); it held in the baseline ({_value(line)})"))
        elif not line["held"]:
            state = "holds now" if current["held"] else "still fails"
            result.notes.append(f"{who}: model invariant {line['name']} did not hold in the baseline ({_value(line)}) "
                                f"and {state} ({_value(current)}): not judged")


def _value(line: dict) -> str:
    return f"value {fmt(line['value'])} against bound {fmt(line['bound'])}" if line["value"] is not None \
        else ("held" if line["held"] else "failed")


def select_cases(base_cases: dict, names: list[str] | None, result: CheckResult) -> dict:
    """The baseline's cases to judge: all, or those of the stress cases ``names`` (an unknown name is an
    error; the others are noted as left out on purpose)."""
    if names is None:
        return base_cases
    known = sorted({c["case"] for c in base_cases.values()})
    unknown = [n for n in names if n not in known]
    if unknown:
        result.errors.append(f"--cases {','.join(names)}: {', '.join(unknown)} not in the baseline: expected stress "
                             f"cases among {', '.join(known)}")
        return {}
    chosen = {k: c for k, c in base_cases.items() if c["case"] in names}
    left = sorted(set(base_cases) - set(chosen))
    if left:
        result.notes.append(f"judging the baseline's cases {', '.join(sorted(chosen))} only (--cases); left out on "
                            f"purpose: {', '.join(left)}")
    return chosen


def judge_cases(result: CheckResult, cases: dict, base_cases: dict, tolerances: dict,
                dof_rule: str = DOF_RULE, advisory: bool = True, held_out: int = 0,
                named: dict[str, list[str]] | None = None) -> None:
    """The outcomes and rows of every case of ``base_cases``; errors for a case the job lacks or whose runs
    cannot be compared (naming the records of ``named[case key]``), the settings of a case that differ. ``held_out``: replicates of the baseline taken out of
    ``base_cases`` to play the job (the calibration: 1), counted in the rank of an outcome
    (``stability.check.outcomes.outcome_p``)."""
    for key, case in sorted(cases.items()):
        base = base_cases.get(key)
        if base is None:
            # the same case under another variant (the batch ramp's LR rule, the shock's kind): not comparable
            labels = sorted(c["case_label"] for c in base_cases.values()
                            if c["name"] == case["name"] and c["case"] == case["case"])
            if labels:
                result.errors.append(f"case {key}: qualifier differs: the baseline holds case {case['case']!r} "
                                     f"as {labels}, the job as {case['case_label']!r}")
            continue   # a new case: the baseline is stale (stability.check.coverage)
        # the stored fingerprint, or one recomputed from the stored config (fields added since count as defaults)
        if case["fingerprint"] not in (base["fingerprint"], config_fingerprint(base.get("config") or {})):
            runs, settings = setting_changes(base.get("config") or {}, case["config"])
            if runs or not settings:
                files = (named or {}).get(key)
                result.errors.append((f"{', '.join(files)}: " if files else "") + f"case {key}: its runs cannot be "
                                     f"compared with the baseline's (another model shape, data, run length or set "
                                     f"of runs): {'; '.join(runs) or config_diff(base.get('config', {}), case['config'])}")
                continue
            result.settings.append(f"case {key}: {len(settings)} setting(s) differ from the baseline's "
                                   f"({'; '.join(settings)}); its rows and outcomes are judged: a change of "
                                   f"settings is accepted deliberately, with its baseline in the same commit")
        rows_of_case(result, key, base, case, tolerances, dof_rule, advisory, held_out)
    missing = sorted(set(base_cases) - set(cases))
    if missing:
        result.errors.append(f"the job has no record of the baseline's case(s) {', '.join(missing)}: a job must "
                             f"train every case the baseline judged (stability check --cases NAMES judges fewer on "
                             f"purpose)")
    mark_duplicates(result.rows, result.signatures)

def calibration_warnings(baseline: dict) -> list[str]:
    """The warning every check with a baseline accepted over its calibration prints."""
    calibration = baseline.get("calibration") or {}
    if calibration.get("accepted_anyway"):
        return [(f"the baseline was written although its calibration failed ({calibration.get('reason')}): the "
                 f"stated false-alarm rate is not what it measured")]
    if not calibration:
        return [("the baseline holds no calibration: its false-alarm rate was not measured (stability baseline "
                 "calibrate --write)")]
    if not fig.same_family(calibration.get("primary_family"), fig.primary_family()) \
            or calibration.get("dof_rule") != DOF_RULE:
        return [("the baseline's calibration measured another rule than this check's (its primary family or "
                 "degrees-of-freedom rule differs): its false-alarm curve is stale (stability baseline calibrate "
                 "--write measures it again, without training)")]
    return []
