"""The smallest move of each primary row that fails a job alone (stability.check.power): computed from the
baseline's noise, proven by injecting moves just above and just below it, and a row whose move is out of
its figure's reach is named."""

from __future__ import annotations

import pytest
from _stability_records import edited, pair_record, with_replicates

from stability.check import baseline as baselines
from stability.check import power
from stability.check import regression as reg
from stability.cli import main
from stability.record import figures as fig


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2))


@pytest.fixture(scope="module")
def baseline(record):
    return baselines.make_baseline(with_replicates(record, spread=2e-3), commit="abc123")


def _move(moves, arm, figure):
    return next(m for m in moves if m.arm == arm and m.figure == figure)


def test_every_primary_row_of_the_baseline_gets_its_smallest_failing_move(record, baseline):
    moves = power.smallest_failing_moves(baseline)
    rows = reg.check([record], baseline).primary
    assert {(m.case_key, m.arm, m.figure) for m in moves} == {(r.case_key, r.arm, r.figure) for r in rows}
    for move in moves:   # the first Holm step: alpha / m, stricter than alpha alone
        assert move.move == pytest.approx(move.floor + move.t * move.se) and move.move > move.floor
        assert move.t > power.critical_t(0.01, move.dof)


@pytest.mark.parametrize("figure", ["heldout_loss", "m_act_max"])
def test_a_move_just_above_the_smallest_fails_the_job_and_just_below_passes(record, baseline, figure):
    """The gated arm's figure moved up by 1.15x and 0.85x its computed smallest failing move (every seed):
    the first is REGRESSED on that row, the second passes."""
    move = _move(power.smallest_failing_moves(baseline), "gated", figure)
    above = reg.check([edited(record, "gated", figure, add=1.15 * move.move)], baseline)
    assert above.exit_code == 1 and any(r.arm == "gated" and r.figure == figure and r.verdict == "regressed"
                                        for r in above.rows)
    below = reg.check([edited(record, "gated", figure, add=0.85 * move.move)], baseline)
    assert not any(r.arm == "gated" and r.figure == figure and r.verdict == "regressed" for r in below.rows)


def test_a_row_whose_move_is_out_of_its_figures_reach_cannot_fail_alone(record, monkeypatch):
    """Accuracy (better higher, never negative) with replicate noise of its own size: the drop that would
    fail the job is larger than the accuracy itself, and the row is marked CANNOT."""
    noisy = baselines.make_baseline(with_replicates(record, spread=0.9), commit="abc123")
    monkeypatch.setattr(fig, "ADDED_PRIMARY", [*fig.ADDED_PRIMARY, fig.Primary("standard", "accuracy", arms="arms")])
    move = _move(power.smallest_failing_moves(noisy), "gated", "accuracy")
    assert move.better == "higher" and move.move > move.baseline and not move.can_fail_alone
    assert "CANNOT" in power.moves_table([move])
    assert _move(power.smallest_failing_moves(noisy), "gated", "heldout_loss").can_fail_alone


def test_baseline_calibrate_prints_the_moves(tmp_path, baseline, capsys):
    path = tmp_path / "b.json"
    baselines.write_baseline(baseline, path)
    capsys.readouterr()
    main(["baseline", "calibrate", str(path)])
    out = capsys.readouterr().out
    assert "smallest failing move" in out and "smoke/standard  gated" in out


def test_the_checks_json_carries_each_primary_rows_smallest_failing_move(record, baseline):
    """Every primary row of `stability check --json` says how far it must move to fail the job alone, the
    same move `stability baseline calibrate` prints; a move just above it in the JSON's own figure fails."""
    document = reg.check([record], baseline).to_dict()
    primary = [row for row in document["rows"] if row["tier"] == "primary"]
    moves = {(m.case_key, m.arm, m.figure): m for m in power.smallest_failing_moves(baseline)}
    assert primary and all("smallest_failing_move" not in row for row in document["rows"] if row["tier"] != "primary")
    for row in primary:
        move = moves[(row["case_key"], row["arm"], row["figure"])]
        assert row["smallest_failing_move"] == pytest.approx(move.move)
        assert row["smallest_change"] == pytest.approx(move.change)
        assert row["of_the_mean"] == pytest.approx(move.relative)
    row = next(r for r in primary if r["arm"] == "gated" and r["figure"] == "heldout_loss")
    assert reg.check([edited(record, "gated", "heldout_loss", add=1.15 * row["smallest_failing_move"])],
                     baseline).exit_code == 1
