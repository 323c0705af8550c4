"""The permutation test of validation/pooled_rows.py: its arrangements are the check's rows."""

from __future__ import annotations

import pytest
from _stability_records import edited, pair_record, replicate, with_replicates

from stability.check import regression as reg
from stability.check.baseline import make_baseline
from validation import pooled_rows

RECORD = pair_record(seeds=(0, 1, 2))   # a smoke pair of three seeds; its baseline: it and 4 replicates


@pytest.fixture(scope="module")
def record():
    return RECORD


@pytest.fixture(scope="module")
def baseline():
    return make_baseline(with_replicates(RECORD))


def test_the_job_playing_the_change_gives_the_checks_own_rows(record, baseline):
    job = edited(record, "gated", "heldout_loss", add=0.01)
    cases = pooled_rows.pooled_cases(baseline, [job])
    ps = pooled_rows.judged_p(cases, {s: pooled_rows.JOB for s in ("0", "1", "2")})
    assert ps == [row.p for row in reg.check([job], baseline).rows if row.p is not None]


def test_a_baseline_replicate_playing_the_change_is_judged_against_the_job_and_the_others(record, baseline):
    job = edited(record, "gated", "heldout_loss", add=0.5)
    kept, picked = pooled_rows.arrange(pooled_rows.pooled_cases(baseline, [job]), {"0": "2", "1": "2", "2": "job"})
    figures = kept["smoke/standard"]["arms"]["gated"]["figures"]["heldout_loss"]
    assert sorted(figures["0"]) == ["0", "1", "3", "4", "job"] and sorted(figures["2"]) == ["0", "1", "2", "3", "4"]
    chosen = picked["smoke/standard"]["arms"]["gated"]["figures"]["heldout_loss"]
    assert chosen == {"0": {"2": figures_of(baseline, "0", "2")}, "1": {"2": figures_of(baseline, "1", "2")},
                      "2": {"job": next(a for a in job["arms"] if a["arm"] == "gated" and a["seed"] == 2)["final"]
                            ["heldout_loss"]}}


def figures_of(baseline, seed, replicate):
    return baseline["cases"]["smoke/standard"]["arms"]["gated"]["figures"]["heldout_loss"][seed][replicate]


def test_a_clear_regression_ranks_first_of_all_arrangements(record, baseline):
    out = pooled_rows.permutation_test(baseline, [edited(record, "gated", "heldout_loss", add=0.5)])
    assert out["arrangements"] == 6 ** 3
    assert out["p"] == {"fisher": 1 / 216, "min p": 1 / 216}


def test_a_new_rounding_replicate_is_not_singled_out(record, baseline):
    out = pooled_rows.permutation_test(baseline, [replicate(record, 9)])
    assert min(out["p"].values()) > 0.05, out


def test_a_job_of_other_seeds_has_nothing_to_arrange(baseline):
    out = pooled_rows.permutation_test(baseline, [pair_record(seeds=(3, 4, 5))])
    assert out == {"arrangements": 0, "observed": None, "p": None}
