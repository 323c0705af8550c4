"""The false-alarm rate of the merge check, measured on a baseline's own replicates.

    curve = calibrate(baseline)        # every arrangement judged; the curve and the margin
    baseline["calibration"] = curve    # with the rule it measured (the primary family, the dof rule)

Under a harmless change the job's run of seed s is one more rounding replicate of that seed, exchangeable
with the baseline's replicates of s. So every way of choosing one replicate per seed to play "the change",
judged by the check's own code against the remaining replicates, is a harmless job: with D replicates and S
seeds there are D^S such arrangements (20^3 = 8000 for a baseline of 20 runs per seed; ``MAX_ARRANGEMENTS`` of
them drawn at random, the same every time, when there are more), and the fraction of them that fail is the
check's false-alarm rate on this baseline, measured (each one judged against one replicate fewer than a real
job has, so slightly pessimistic). A per-seed outcome of the chosen replicate is judged against the seed's
other replicates: an arrangement whose replicate flipped an outcome that none of the others did fails, as a
real job would (``stability.check.outcomes.OUTCOME_RULE``). ``calibrate`` gives the fraction that fails at
each alpha of ``ALPHAS``, the *margin* of the closest arrangement (H x its smallest primary p / alpha, with H the
hypotheses Holm judges: how far below the Holm threshold it stayed; 0 when a per-seed outcome failed it), and
which row came closest.

Out of sample: a rule chosen by looking at some replicates (which rows are judged by their floor only, which
are primary) is measured on the others: ``playing`` names the replicates that may play the change (the
others are only ever judged against), and the curve says which they were.

``acceptable(curve)`` is the rule a new baseline must pass (``stability baseline make``): the curve at or
under the diagonal (at most alpha of the arrangements fail at each alpha). The margin is reported, not
required: with replicates that perturb every step and a thousand arrangements, a rule whose rate sits at
0.5% has arrangements that fail, so the closest one always stays under 1. A curve measures one rule: it
names the primary family and the degrees-of-freedom rule it judged with, and a check whose rule differs
says its calibration is stale (``stability baseline calibrate --write`` measures it again; no training).

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import itertools
import math
import random

from stability.check import DEFAULT_ALPHA, DOF_RULE, CheckResult, decide, judge_cases, resolve_tolerances
from stability.check.baseline_schema import validate_baseline
from stability.record import figures as fig

ALPHAS = (0.01, 0.02, 0.05, 0.10)
MAX_ARRANGEMENTS = 2000   # drawn at random (seed 0) when a baseline has more


def split_runs(cases: dict, chosen) -> tuple[dict, dict]:
    """(the cases without the chosen runs, the chosen runs as a case set of one replicate per seed):
    ``chosen(seed)`` is the replicate (a string key) that plays the change at that seed."""
    kept_cases, picked_cases = {}, {}
    for key, case in cases.items():
        kept_arms, picked_arms = {}, {}
        for arm, entry in case["arms"].items():
            def split(per_seed):
                kept = {s: {r: v for r, v in runs.items() if r != chosen(s)} for s, runs in per_seed.items()}
                picked = {s: {chosen(s): runs[chosen(s)]} for s, runs in per_seed.items() if chosen(s) in runs}
                return kept, picked
            status_kept, status_picked = split(entry["status"])
            step_kept, step_picked = split(entry["diverged_at_step"])
            figures = {name: split(values) for name, values in entry["figures"].items()}
            kept_arms[arm] = {"status": status_kept, "diverged_at_step": step_kept,
                              "figures": {n: k for n, (k, _) in figures.items()}}
            picked_arms[arm] = {"status": status_picked, "diverged_at_step": step_picked,
                                "figures": {n: p for n, (_, p) in figures.items() if p}}
        kept_cases[key] = {**case, "arms": kept_arms}
        picked_cases[key] = {**case, "arms": picked_arms}
    return kept_cases, picked_cases


def seeds_and_replicates(baseline: dict) -> tuple[list[str], list[str]]:
    """The seeds (every case's) and the replicates of a baseline, as the JSON keys."""
    seeds = sorted({s for case in baseline["cases"].values() for arm in case["arms"].values()
                    for s in arm["status"]}, key=int)
    return seeds, [str(r) for r in baseline.get("replicates") or []]


def arrangements(baseline: dict, playing: list[str] | None = None, limit: int = MAX_ARRANGEMENTS):
    """Choices {seed: replicate} of one replicate per seed, each replicate among ``playing`` (None: every
    replicate of the baseline): all of them, or ``limit`` drawn at random without repetition (the same draw
    every time) when there are more."""
    seeds, replicates = seeds_and_replicates(baseline)
    players = [r for r in replicates if playing is None or r in playing]
    total = len(players) ** len(seeds)
    if total <= limit:
        for combo in itertools.product(players, repeat=len(seeds)):
            yield dict(zip(seeds, combo))
        return
    for index in sorted(random.Random(0).sample(range(total), limit)):
        combo = []
        for _ in seeds:
            index, digit = divmod(index, len(players))
            combo.append(players[digit])
        yield dict(zip(seeds, combo))


def judge_arrangement(baseline: dict, chosen: dict, alpha: float = DEFAULT_ALPHA, tolerances: dict | None = None,
                      dof_rule: str = DOF_RULE, advisory: bool = False) -> CheckResult:
    """The check of the arrangement ``chosen`` ({seed: replicate}): the chosen replicates judged as a job
    against the other replicates. ``advisory``: also the advisory rows (the verdict never needs them)."""
    kept, picked = split_runs(baseline["cases"], lambda seed: chosen.get(seed))
    replicates = [r for r in baseline.get("replicates") or [] if str(r) not in set(chosen.values())]
    result = CheckResult(alpha=alpha, baseline_commit=baseline.get("commit"), preset=baseline["preset"],
                         device=baseline["device"], replicates=replicates)
    judge_cases(result, picked, kept, resolve_tolerances(tolerances), dof_rule, advisory=advisory, held_out=1)
    decide(result)
    return result


def margin(result: CheckResult) -> float:
    """H x the smallest p of the primary rows' hypotheses / alpha (how many times over the Holm threshold the
    closest row stayed; below 1 the job failed); 0 for a job failed by an outcome or an error; infinite with no
    primary row."""
    if result.outcomes or result.errors:
        return 0.0
    rows = result.primary
    if not rows:
        return math.inf
    return result.hypotheses * min(r.p_judged for r in rows) / result.alpha


def calibrate(baseline: dict, alphas=ALPHAS, tolerances: dict | None = None, dof_rule: str = DOF_RULE,
              playing: list[str] | None = None) -> dict:
    """Judge the arrangements of ``baseline`` (see the module docstring; ``playing``: the replicates that may
    play the change, None: all): per alpha the count and the fraction that fail, the margin at ``alphas[0]``
    and the arrangement and row closest to failing."""
    validate_baseline(baseline, "baseline")
    seeds, replicates = seeds_and_replicates(baseline)
    failed = {a: 0 for a in alphas}
    count, closest = 0, None
    for chosen in arrangements(baseline, playing):
        result = judge_arrangement(baseline, chosen, alphas[0], tolerances, dof_rule)
        count += 1
        smallest = min(result.primary, key=lambda r: r.p_judged, default=None)
        for a in alphas:   # Holm rejects some hypothesis exactly when the smallest p is at most alpha / H
            failed[a] += bool(result.outcomes or result.errors) or (
                smallest is not None and smallest.p_judged <= a / result.hypotheses)
        here = margin(result)
        if closest is None or here < closest["margin"]:
            closest = {"margin": here, "arrangement": chosen,
                       "reason": (result.errors + [o.reason for o in result.outcomes])[:1] or
                       ([(f"{smallest.case_key} {smallest.arm} {smallest.figure}: p {smallest.p_judged:.3g} of "
                          f"{result.hypotheses} hypotheses")] if smallest else [])}
    players = [r for r in replicates if playing is None or r in playing]
    return {"arrangements": count, "seeds": len(seeds), "replicates": len(replicates),
            "playing": [int(r) for r in players], "dof_rule": dof_rule,
            "alphas": list(alphas), "failed": [failed[a] for a in alphas],
            "rate": [failed[a] / count if count else None for a in alphas],
            "margin": closest["margin"] if closest else None,
            "closest": {k: v for k, v in (closest or {}).items() if k != "margin"},
            "primary_family": fig.primary_family()}


def acceptable(curve: dict) -> str | None:
    """None when the curve is at or under the diagonal at every alpha; else why not."""
    for alpha, rate, failed in zip(curve["alphas"], curve["rate"], curve["failed"]):
        if rate is not None and rate > alpha:
            return (f"{failed} of {curve['arrangements']} arrangements fail at alpha {alpha:g} ({rate:.1%}, above "
                    f"the diagonal)")
    return None


def stored(curve: dict, reason: str | None) -> dict:
    """The curve as a baseline keeps it: with whether it was written although it fails (``reason``, from
    ``acceptable``), so that every check using the baseline can say so."""
    return {**curve, "accepted_anyway": bool(reason), "reason": reason}


def null_job_evidence(jobs: int, failed: int, commit: str | None, replicates: list[int],
                      closest_margin: float | None, machines: dict[str, int] | None = None) -> dict:
    """What a baseline keeps of its null jobs (``baseline["null_jobs"]``): ``jobs`` harmless jobs of the code of
    ``commit`` (its own, or a later commit's that records the same figures; every run a fresh rounding replicate,
    ``replicates``) judged against it, ``failed`` of them failed, the
    margin of the closest, and the machines they ran on (``machines``: machine key -> jobs, those kept before
    jobs named their machine left out; None: not recorded, no key written); the check states the job's
    false-alarm rate from it, and whether the job's machine is among those."""
    evidence = {"jobs": jobs, "failed": failed, "commit": commit, "replicates": sorted(replicates),
                "closest_margin": closest_margin}
    if machines is not None:
        evidence["machines"] = dict(sorted(machines.items()))
    return evidence


def curve_lines(curve: dict) -> list[str]:
    """The calibration as text: one line per alpha, then the margin."""
    playing = curve.get("playing")
    players = len(playing) if playing is not None else curve["replicates"]
    drawn = "" if curve["arrangements"] == players ** curve["seeds"] else ", drawn at random"
    out_of = f" (of {curve['replicates']})" if players != curve["replicates"] else ""
    lines = [(f"calibration: {curve['arrangements']} arrangements ({players} replicates{out_of} ^ {curve['seeds']} "
              f"seeds{drawn}), each judged as a harmless job against the other replicates")]
    for alpha, failed, rate in zip(curve["alphas"], curve["failed"], curve["rate"]):
        mark = "at or under the diagonal" if rate is not None and rate <= alpha else "ABOVE the diagonal"
        lines.append(f"  alpha {alpha:<5g} {failed:4d} fail ({rate:.1%}; {mark})")
    reason = "; ".join(curve["closest"].get("reason") or [])
    lines.append(f"  margin {curve['margin']:.3g} (H x smallest primary p / alpha of the closest arrangement; "
                 f"under 1: it failed): {reason}")
    return lines
