"""validation/noise_ranks.py on a constructed baseline and kept jobs: a rewrite far out of the replicates is
flagged, one more replicate drawn the same way is not, and a job identical to the unchanged code is left out."""

from __future__ import annotations

import pytest
from _stability_records import edited, pair_record, replicate, with_replicates

from stability.check import baseline as baselines
from validation import noise_ranks
from validation import regression_zoo as zoo
from validation.zoo import Entry

HELDOUT = ("smoke/standard", "gated", "heldout_loss")


@pytest.fixture(scope="module")
def made():
    record = pair_record()
    baseline = baselines.make_baseline(with_replicates(record, replicates=range(1, 10)), commit="abc123")
    return record, baseline, noise_ranks.baseline_rows(baseline)


def ranked(records, baseline, rows):
    return noise_ranks.entry_ps(noise_ranks.job_rows(records, baseline), rows)


def test_the_sum_of_ranks_has_its_exact_distribution():
    dist = noise_ranks.sum_distribution([5, 5, 5])
    assert sum(dist) == pytest.approx(1.0)
    assert noise_ranks.two_sided(dist, 15, 15) == pytest.approx(2 / 6 ** 3)   # every seed above every replicate
    assert noise_ranks.two_sided(dist, 0, 15) == 1.0                         # ties with every replicate
    assert noise_ranks.chance([5, 5, 5], 0.05) <= 0.05
    same = {seed: 1.0 for seed in "012"}
    assert noise_ranks.rank_p(same, {seed: [1.0] * 5 for seed in "012"}) == (1.0, [5, 5, 5])   # a row that never moves
    assert noise_ranks.rank_p(same, {seed: [0.5] * 5 for seed in "012"})[0] == pytest.approx(2 / 6 ** 3)


def test_a_rewrite_far_out_is_flagged_and_one_more_replicate_is_not(made):
    record, baseline, rows = made
    far = ranked([edited(record, "gated", "heldout_loss", factor=1.01)], baseline, rows)
    assert far[HELDOUT][0] == pytest.approx(2 / 11 ** 3)
    assert far[("smoke/standard", "gated-reference", "heldout_loss")][0] < 0.01
    assert far[("smoke/standard", "reference", "heldout_loss")][0] > 0.05   # the reference arm did not move
    flagged = sum(ranked([replicate(record, number)], baseline, rows)[HELDOUT][0] <= 0.05
                  for number in range(100, 140))
    assert flagged <= 6   # about 2 of 40 by chance


def test_the_replicates_left_one_out_look_like_chance(made):
    _, _, rows = made
    replicates = noise_ranks.leave_one_out(rows)
    assert sorted(replicates, key=int) == [str(n) for n in range(10)]
    outside = sum(p <= 0.05 for ps in replicates.values() for p, _ in ps.values())
    expected = sum(noise_ranks.chance(sizes, 0.05) for ps in replicates.values() for _, sizes in ps.values())
    assert 0 < expected and outside <= 3 * expected


def test_kept_jobs_ranked_and_a_bit_identical_one_left_out(made, tmp_path, monkeypatch):
    record, baseline, rows = made
    monkeypatch.setattr(zoo, "KEPT", tmp_path)
    entries = [Entry("far_out", False, "far out", ()), Entry("same_as_unchanged", False, "no change", ()),
               Entry("harmful_one", True, "harmful", ())]
    monkeypatch.setattr(zoo, "GROUPS", (("the code as it is", [zoo.UNCHANGED]), ("constructed", entries)))
    jobs = {"unchanged": record, "same_as_unchanged": record, "harmful_one": record,
            "far_out": edited(record, "gated", "heldout_loss", factor=1.01)}
    for name, job in jobs.items():
        zoo.keep("smoke", {"entry": name, "records": [job]})
    entries, notes = noise_ranks.harmless_entries("smoke", baseline, rows)
    assert list(entries) == ["far_out"]
    assert any("same_as_unchanged" in note and "bit-identical" in note for note in notes)
    text = noise_ranks.report("smoke", baseline, entries, noise_ranks.leave_one_out(rows), notes)
    assert "| smoke/standard | gated | heldout_loss | `far_out` | 0.0015 |" in text
    assert "| `far_out` |" in text and "| replicate 9 (leave-one-out) |" in text
