"""Outcomes, seed by seed: a run of the job that diverged, met a non-finite value its precision recipe did not
handle, or did not apply what its case says it applies (a figure the table marks as an *outcome*:
``Figure.outcome``).

An outcome not clean in a run of the job is judged against the n baseline runs of that seed that report it:
k of them not clean (a run that diverged counts as not clean for every outcome: a non-finite value on the way
to a divergence is part of it). The run fails the job where k = 0, every baseline run of the seed clean, with
one line naming case, arm, seed, what happened (the divergence step), k and n; where k > 0 the replicates
already showed it, and a note says so with its rank p = (k + 1) / (n + 1), not failing the job
(``OUTCOME_RULE``). A figure finite in every baseline run of a seed that is non-finite or absent in the job's
run of that seed (when that run should report it) fails the same way: a NaN is a result, and the result is a
regression.

Seeds whose baseline runs did not all end the same way (some completed, some diverged) have their outcomes
judged by the rule above like any seed, and their other figures by an explicit rule, stated in the
verdict's notes (``mixed_status_notes``): the evaluation and peak figures of such a seed are judged against
its completed runs when the job's run completed, and left out when it diverged too.

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

from stability.check.verdict import Outcome
from stability.record import Status
from stability.record import figures as fig
from stability.report.tables import fmt

OUTCOME_RULE = "fails where every baseline run of the seed was clean (k = 0)"
"""The per-seed outcome rule. Under a harmless change the job's run of a seed is one more replicate of that seed,
exchangeable with its n baseline replicates; if k of them are not clean for an outcome figure, the chance that
one more replicate is not clean by rank is p = (k + 1) / (n + 1), exactly (a permutation p-value,
``outcome_p``). A run not clean fails the job only where k = 0: a flip that no replicate of the seed showed.
Where k > 0 the replicates already showed it: a note with its p. Its share of the job's false-alarm rate is the
chance that a harmless run flips a cell whose replicates never did, which the calibration (an arrangement
whose replicate flipped such a cell fails) and the null jobs (every run of a harmless job) measure; the
applied-stress and measurement outcomes (``lr_off_log_steps`` ...) are exact, and never flip by rounding."""


def reports(name: str, status: str) -> bool:
    """Whether a run of this status reports figure ``name`` (evaluation and peak figures: completed runs)."""
    entry = fig.figure(name)
    return status == Status.COMPLETED or not entry.needs_completed_arm


def outcome_p(k: int, n: int, held_out: int = 0) -> float:
    """The chance that one more replicate exchangeable with a seed's n baseline replicates, k of them not
    clean, is not clean by rank: (k + 1) / (n + 1) (a permutation p-value, printed beside a note).
    ``held_out``: replicates of the baseline left out of the n to play the job (the calibration: 1); the rank
    is then taken among all the baseline's replicates, (k + 1) / (n + held_out + 1)."""
    return (k + 1) / (n + held_out + 1)


def _not_clean(name: str) -> str:
    return "diverged" if fig.is_divergence(name) else f"diverged or had {name} not clean"


def outcomes_of_arm(key: str, arm: str, base: dict, cur: dict, notes: list[str] | None = None,
                    held_out: int = 0, tally: list[int] | None = None) -> list[Outcome]:
    """The per-seed failures of one arm. An outcome figure not clean in the job's run of a seed is judged
    against the seed's baseline runs that report the figure, n of them: k are not clean, a run that diverged
    counting as not clean for every outcome (a NaN on the way to a divergence, in the LR range test, is part
    of the divergence, judged by ``diverged``). k = 0 fails the job with a line naming case, arm, seed, what
    happened and n (``OUTCOME_RULE``); k > 0 goes to ``notes`` with its p = ``outcome_p(k, n, held_out)``,
    judged and not failing. A figure finite in every baseline run of the seed that is non-finite or absent now
    fails the job too. ``tally``: [cells, runs] to add the outcome cells whose baseline runs were all clean to
    (what the job's outcome rule rests on)."""
    found = []
    for seed, status in sorted(cur["status"].items()):
        base_status = base["status"].get(seed, {})
        for name, values in base["figures"].items():
            entry = fig.figure(name)
            baseline_runs = values.get(seed, {})
            if not baseline_runs or not reports(name, status):
                continue   # no baseline run of the seed reports the figure, or this run cannot report it
            value = cur["figures"].get(name, {}).get(seed, "absent")
            if entry.outcome:
                k = sum(v is None or not entry.clean(v) or base_status.get(r) != Status.COMPLETED
                        for r, v in baseline_runs.items())
                n = len(baseline_runs)
                if tally is not None and k == 0:
                    tally[0], tally[1] = tally[0] + 1, tally[1] + n
                if value == "absent" or value is None or entry.clean(value):
                    continue
                step = cur["diverged_at_step"].get(seed)
                shown = ("true" if value else "false") if entry.quantum == "seed" else fmt(value)
                what = f"{name} = {shown}" + (f" (diverged at step {step})" if step is not None else "")
                if k == 0:
                    found.append(Outcome(key, arm, seed, name, f"case {key} arm {arm} seed {seed}: {what}; every "
                                                               f"one of the {n} baseline runs of this seed was clean"))
                elif notes is not None:
                    notes.append(f"case {key} arm {arm} seed {seed}: {what}; {k} of the {n} baseline runs of this "
                                 f"seed {_not_clean(name)} (p {outcome_p(k, n, held_out):.3f} that one more replicate "
                                 f"would): judged, not failing the job ({OUTCOME_RULE})")
            elif len(baseline_runs) >= len(base_status) and all(v is not None for v in baseline_runs.values()) \
                    and (value == "absent" or value is None):
                found.append(Outcome(key, arm, seed, name, f"case {key} arm {arm} seed {seed}: {name} is "
                                                           f"{'absent' if value == 'absent' else 'non-finite'} "
                                                           f"now; finite in every one of the "
                                                           f"{len(baseline_runs)} baseline runs of this seed"))
    return found


def mixed_status_notes(key: str, arm: str, base: dict, cur: dict) -> list[str]:
    """The explicit rule for the evaluation and peak figures of seeds whose baseline runs did not all end the
    same way (their outcomes are judged by ``outcomes_of_arm``, whose note gives the divergence's p)."""
    notes = []
    for seed, status in sorted(cur["status"].items()):
        ends = list(base["status"].get(seed, {}).values())
        completed = sum(s == Status.COMPLETED for s in ends)
        if 0 < completed < len(ends):
            judged = (f"its evaluation and peak figures are judged against the {completed} completed ones"
                      if status == Status.COMPLETED else "this run diverged as they did: its evaluation and peak "
                                                         "figures are left out")
            notes.append(f"case {key} arm {arm} seed {seed}: {len(ends) - completed} of {len(ends)} baseline "
                         f"runs diverged; {judged}")
    return notes
