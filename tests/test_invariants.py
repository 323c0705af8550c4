"""Model invariants of a test session (stability.record.invariants): written one line at a time by the suites'
``model_invariant`` fixture, one file per pytest-xdist worker, read back torch-free by ``stability baseline
make`` and the merge check."""

from __future__ import annotations

import json

import pytest

from stability.record import RecordError
from stability.record.invariants import (
    FIELDS,
    append_invariant,
    describe,
    failed,
    invariant_line,
    invariants_file,
    read_invariants,
)


def test_the_lines_of_every_worker_are_read_back_in_order(tmp_path):
    assert read_invariants(tmp_path / "not-made-yet") == []
    first = invariant_line("smoke/precision_ladder", "mean_loss_gap_fp16", "reference", None, False, 0.8159, 0.25,
                           "per seed\n[0.74, 0.79]", "suites/test_precision_ladder.py::test_gap")
    second = invariant_line("smoke/standard", "completed", "gated", 2, True, message=None)
    third = invariant_line("smoke/standard", "finite_heldout_loss", "reference", 0, False, float("nan"))
    append_invariant(invariants_file(tmp_path, "gw1"), second)
    append_invariant(invariants_file(tmp_path, "gw0"), first)
    append_invariant(invariants_file(tmp_path, "gw1"), third)
    found = read_invariants(tmp_path)
    assert found == [first, second, third]                        # gw0's file, then gw1's, each in line order
    assert set(found[0]) == set(FIELDS) and found[0]["seed"] is None and found[0]["message"] == "per seed [0.74, 0.79]"
    assert found[1]["message"] == "" and found[2]["value"] is None   # NaN is not JSON: None
    assert failed(found) == [first, third]
    assert describe(first) == ("smoke/precision_ladder reference: mean_loss_gap_fp16 (0.8159 against bound 0.25) - "
                               "per seed [0.74, 0.79]")
    assert describe(second) == "smoke/standard gated seed 2: completed"
    assert (tmp_path / "invariants-gw0.jsonl").read_text().count("\n") == 1


@pytest.mark.parametrize(("text", "said"), [
    ('{"case_key": "smoke/standard"\n', "invariants-main.jsonl:1 is not valid JSON"),
    ('\n{"case_key": "smoke/standard", "name": "completed"}\n', "invariants-main.jsonl:2 is not an invariant"),
    (json.dumps({name: None for name in FIELDS}) + "\n", "held true or false (found null)"),
    ("[1, 2]\n", "is not an invariant"),
])
def test_a_broken_line_is_an_error_naming_the_file_and_line(tmp_path, text, said):
    (tmp_path / "invariants-main.jsonl").write_text(text)
    with pytest.raises(RecordError, match="invariants-main.jsonl") as error:
        read_invariants(tmp_path)
    assert said in str(error.value)


def test_an_invariant_of_several_run_directories_held_only_where_it_held_in_each(tmp_path):
    """A baseline made of one job per replicate reads one invariants file per run directory: each invariant is
    one line, held where every directory found it held; one that failed in a single replicate is a failing line
    naming in how many of the directories it failed, so the check notes it and never fails a job on it."""
    from stability.check.baseline import run_invariants

    records = []
    for replicate, lr_held in enumerate([True, False, True]):
        folder = tmp_path / f"rep{replicate}"
        append_invariant(invariants_file(folder, "gw0"), invariant_line("ci/standard", "completed", "gated", 0, True))
        append_invariant(invariants_file(folder, "gw1"), invariant_line(
            "ci/shock-jump", "optimiser_lr_is_logged", "reference", 1, lr_held, 0.0 if lr_held else 0.5, 0.0,
            "" if lr_held else "step 7 off"))
        records.append({"_path": str(folder / "ci-standard-regression-0.json")})
    merged = run_invariants(records)
    assert [(line["name"], line["held"]) for line in merged] == [("completed", True), ("optimiser_lr_is_logged", False)]
    assert merged[1]["value"] == 0.5 and merged[1]["message"] == "step 7 off (failed in 1 of 3 run directories)"
    alone = run_invariants(records[1:2])      # one directory: its lines as they are
    assert alone == read_invariants(tmp_path / "rep1")
    assert run_invariants([{"_path": str(tmp_path / "none" / "r.json")}]) is None
