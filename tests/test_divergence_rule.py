"""The per-seed outcome rule of the merge check (stability/check/outcomes.py, ``outcomes_of_arm``): a run of
the job that is not clean is judged against the baseline replicates of its seed, k of n not clean: it fails the
job where k = 0 (``OUTCOME_RULE``), and is reported in a note with its rank p = (k + 1) / (n + 1) where the
replicates already showed it; in every seed, whatever its baseline replicates' status; and the calibration over a
baseline's arrangements judges the same."""

from __future__ import annotations

import copy

import pytest
from _stability_records import diverged_run, pair_record, with_replicates

from stability.check import baseline as baselines
from stability.check import calibration as cal
from stability.check import regression as reg
from stability.check.outcomes import OUTCOME_RULE, outcome_p


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2))



def _baseline(record, diverged: int, replicates: int = 4, seed: int = 1):
    """A baseline of the reference and ``replicates`` rounding replicates whose first ``diverged`` runs of
    the gated arm's ``seed`` diverged at step 12."""
    runs = with_replicates(record, replicates=tuple(range(1, replicates + 1)))
    runs[:diverged] = [diverged_run(r, "gated", seed, 12) for r in runs[:diverged]]
    return baselines.make_baseline(runs)


def _about(result, seed="1", figure="diverged"):
    """The failed outcomes and the notes of the gated arm's ``seed`` judging ``figure``."""
    who = f"arm gated seed {seed}: {figure} = "
    return [o for o in result.outcomes if who in o.reason], [n for n in result.notes if who in n]


def test_the_rank_p_counts_the_calibration_s_held_out_replicate():
    """The rank p of a note: (k + 1) / (n + 1); the calibration's held-out replicate is ranked among the
    baseline's full replicates."""
    assert outcome_p(0, 5) == pytest.approx(1 / 6) and outcome_p(1, 19) == pytest.approx(2 / 20)
    assert outcome_p(0, 4, held_out=1) == outcome_p(0, 5)


def test_a_divergence_where_no_baseline_replicate_diverged_fails_naming_n(record):
    """(a) 0 of 5: the job's divergence fails it, and the line states what happened and n."""
    result = reg.check([diverged_run(record, "gated", 1, 10)], _baseline(record, 0))
    failed, notes = _about(result)
    assert result.exit_code == 1 and len(failed) == 1 and not notes
    assert failed[0].reason == ("case smoke/standard arm gated seed 1: diverged = true (diverged at step 10); every "
                                "one of the 5 baseline runs of this seed was clean")


def test_a_divergence_one_of_five_baseline_replicates_showed_is_judged_and_does_not_fail(record):
    """(b) 1 of 5: the replicates showed it: judged, in a note with k, n and p, not failing the job; the
    explicit rule for the seed's evaluation figures is still stated, once, without the p."""
    result = reg.check([diverged_run(record, "gated", 1, 11)], _baseline(record, 1))
    failed, notes = _about(result)
    assert result.exit_code == 0 and not result.outcomes and not failed
    assert notes == [("case smoke/standard arm gated seed 1: diverged = true (diverged at step 11); 1 of the 5 "
                      "baseline runs of this seed diverged (p 0.333 that one more replicate would): judged, not "
                      f"failing the job ({OUTCOME_RULE})")]
    mixed = [n for n in result.notes if "seed 1: 1 of 5 baseline runs diverged" in n]
    assert len(mixed) == 1 and "this run diverged as they did" in mixed[0] and "p " not in mixed[0]
    assert "note: case smoke/standard arm gated seed 1: diverged = true" in result.table()


def test_with_more_replicates_a_divergence_one_of_them_showed_still_does_not_fail(record):
    """(b) 1 of 20 runs (the unperturbed run and 19 replicates): p = 2/21, a note, not a failure: a flip the
    replicates showed is rounding, however rare."""
    one = reg.check([diverged_run(record, "gated", 1, 11)], _baseline(record, 1, replicates=19))
    failed, notes = _about(one)
    assert one.exit_code == 0 and not failed and "1 of the 20 baseline runs of this seed diverged (p 0.095" in notes[0]


@pytest.mark.parametrize("diverged", range(6))
def test_the_rule_never_switches_off(record, diverged):
    """(c) Whatever k of the seed's 5 baseline replicates diverged, the job's divergence there is judged: a failed
    outcome where k = 0, else a note naming k, n and p; never neither, never both. A job whose run completes
    clean there gets neither (nothing to judge)."""
    base = _baseline(record, diverged)
    result = reg.check([diverged_run(record, "gated", 1, 11)], base)
    failed, notes = _about(result)
    assert len(failed) + len(notes) == 1
    assert bool(failed) == (diverged == 0) and result.exit_code == (1 if failed else 0)
    line = (failed[0].reason if failed else notes[0])
    counted = "every one of the 5 baseline runs of this seed was clean" if diverged == 0 else \
        f"{diverged} of the 5 baseline runs of this seed diverged (p {(diverged + 1) / 6:.3f} that one more replicate"
    assert counted in line
    clean = reg.check([record], base)
    assert _about(clean) == ([], []) and clean.exit_code == 0


def test_a_nan_on_the_way_to_a_divergence_is_part_of_it(record):
    """Every baseline replicate completed clean: a divergence through a NaN fails on both outcomes (k = 0
    each). Every baseline replicate diverged (the LR range test), one through a NaN: the job's NaN at its
    divergence is judged with the diverged replicates counted as not clean (5 of 5, p 1), a note, never a failure."""
    nan = {"nonfinite_unhandled": 1}
    runs = [copy.deepcopy(r) for r in with_replicates(record)]
    for r in runs:
        for arm in r["arms"]:
            arm["final"]["nonfinite_unhandled"] = 0
    clean = baselines.make_baseline(runs)
    job = diverged_run(runs[0], "gated", 1, 10, **nan)
    result = reg.check([job], clean)
    assert sorted(o.figure for o in result.outcomes) == ["diverged", "nonfinite_unhandled"]
    assert ("nonfinite_unhandled = 1 (diverged at step 10); every one of the 5 baseline runs of this seed was "
            "clean") in result.outcomes[1].reason
    ramp = [diverged_run(r, "gated", 1, 40, nonfinite_unhandled=int(n == 1)) for n, r in enumerate(runs)]
    result = reg.check([job], baselines.make_baseline(ramp))
    failed, notes = _about(result, figure="nonfinite_unhandled")
    assert result.exit_code == 0 and not result.outcomes and not failed
    assert "5 of the 5 baseline runs of this seed diverged or had nonfinite_unhandled not clean (p 1.000" in notes[0]


def test_the_calibration_of_a_baseline_with_a_mixed_seed_measures_the_rule(record):
    """(d) 1 of 5 replicates of seed 1 diverged: all 125 arrangements are judged; the 25 in which the
    diverged replicate plays the change fail (none of the 4 others diverged, as a job's would fail against a
    seed that never diverged), the others pass (their kept replicates hold the divergence: a completed run is clean); the
    curve crosses the diagonal and names the arrangement closest to failing."""
    base = _baseline(record, 1)
    curve = cal.calibrate(base)
    assert curve["arrangements"] == 125 and (curve["seeds"], curve["replicates"]) == (3, 5)
    assert curve["failed"] == [25, 25, 25, 25] and curve["margin"] == 0.0
    assert curve["closest"]["arrangement"]["1"] == "0"
    assert "seed 1: diverged = true (diverged at step 12); every one of the 4 baseline runs of this seed was " \
           "clean" in curve["closest"]["reason"][0]
    assert "25 of 125 arrangements fail at alpha 0.01" in cal.acceptable(curve)
    passing = cal.judge_arrangement(base, {"0": "1", "1": "2", "2": "3"})
    assert passing.exit_code == 0 and not passing.outcomes
