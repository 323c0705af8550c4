"""Properties of the merge check (stability/check/regression.py, `stability check`, `stability baseline update`)."""

from __future__ import annotations

import copy
import json
import math

import pytest
from _stability_records import edited, pair_record

from stability.check import regression as reg
from stability.cli import main
from stability.record import RecordError, paired_summary


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2))


@pytest.fixture(scope="module")
def baseline(record):
    return reg.make_baseline([record], commit="abc123")


def _write(path, record):
    path.write_text(json.dumps(record, allow_nan=False))
    return str(path)


def _verdicts(result, arm, figure):
    return [r.verdict for r in result.rows if r.arm == arm and r.figure == figure]


def _row(result, arm, figure):
    return next(r for r in result.rows if r.arm == arm and r.figure == figure)


def _set(record, arm, figure, values):
    """A copy of ``record`` whose ``arm`` arms (seed order) have ``figure`` = values."""
    out = copy.deepcopy(record)
    for entry, value in zip([a for a in out["arms"] if a["arm"] == arm], values):
        entry["final"][figure] = value
    out["paired"] = paired_summary(out["arms"])
    return out


def test_baseline_holds_schema_preset_device_fingerprint_commit_and_per_seed_values(record, baseline):
    assert baseline["schema_version"] == reg.BASELINE_SCHEMA_VERSION
    assert (baseline["preset"], baseline["device"], baseline["commit"]) == ("smoke", "cpu", "abc123")
    case = baseline["cases"]["smoke/standard"]
    values = {str(a["seed"]): a["final"]["m_act_mean"] for a in record["arms"] if a["arm"] == "gated"}
    assert case["arms"]["gated"]["figures"]["m_act_mean"] == values
    assert case["arms"]["gated"]["status"] == {"0": "completed", "1": "completed", "2": "completed"}


def test_a_baseline_needs_at_least_three_seeds():
    with pytest.raises(RecordError, match="at least 3 seeds"):
        reg.make_baseline([pair_record(seeds=(0, 1))])


def test_unchanged_records_pass_with_exit_code_0(record, baseline):
    result = reg.check([record], baseline)
    assert result.exit_code == 0, result.table()
    assert result.rows and all(r.verdict == "ok" for r in result.rows)


def test_the_band_is_computed_from_the_baseline_alone_by_hand():
    """held-out loss baseline seeds [3.2, 3.21, 3.19]: s = 0.01, paired n = 3, standard error
    0.01 * sqrt(2/3) = 0.008165; band = max(floor 0.02, 0.005 * 3.2 = 0.016, 3 * 0.008165 = 0.0245)."""
    base_record = _set(pair_record(), "baseline", "heldout_loss", [3.2, 3.21, 3.19])
    baseline = reg.make_baseline([base_record])
    current = _set(base_record, "baseline", "heldout_loss", [3.2, 3.2, 3.2])
    row = _row(reg.check([current], baseline), "baseline", "heldout_loss")
    assert row.band == pytest.approx(3 * 0.01 * math.sqrt(2 / 3))
    assert row.delta == pytest.approx((0 - 0.01 + 0.01) / 3)
    assert row.mode == "paired n=3" and row.verdict == "ok"


def test_one_bad_seed_is_caught_even_though_it_widens_the_current_spread():
    """The issue's example: [3.2, 3.21, 3.19] -> [3.2, 3.2, 4.5] passed the old band (k * current std)."""
    base_record = _set(pair_record(), "baseline", "heldout_loss", [3.2, 3.21, 3.19])
    current = _set(base_record, "baseline", "heldout_loss", [3.2, 3.2, 4.5])
    result = reg.check([current], reg.make_baseline([base_record]))
    assert _verdicts(result, "baseline", "heldout_loss") == ["regressed"] and result.exit_code == 1


def test_a_massive_activation_in_one_seed_is_caught():
    """M-Act [100, 100, 100] -> [100, 100, 1000]: no baseline spread, the relative floor (10%) decides."""
    base_record = _set(pair_record(), "gated", "m_act_mean", [100.0, 100.0, 100.0])
    current = _set(base_record, "gated", "m_act_mean", [100.0, 100.0, 1000.0])
    result = reg.check([current], reg.make_baseline([base_record]))
    row = _row(result, "gated", "m_act_mean")
    assert row.band == pytest.approx(10.0) and row.verdict == "regressed"


def test_a_change_inside_the_band_is_ok(record, baseline):
    nudged = edited(record, "baseline", "heldout_loss", add=0.01)
    assert _verdicts(reg.check([nudged], baseline), "baseline", "heldout_loss") == ["ok"]


def test_direction_higher_is_better_accuracy_drop_regresses_and_rise_improves(record, baseline):
    assert _verdicts(reg.check([edited(record, "gated", "accuracy", add=-0.05)], baseline), "gated",
                     "accuracy") == ["regressed"]
    assert _verdicts(reg.check([edited(record, "gated", "accuracy", add=+0.05)], baseline), "gated",
                     "accuracy") == ["improved"]


def test_direction_lower_is_better_spike_score_rise_regresses_and_drop_improves(record, baseline):
    up = reg.check([edited(record, "baseline", "grad_spike_score", add=5.0)], baseline)
    lower = edited(edited(record, "baseline", "grad_spike_score", factor=0.0, add=-3.0), "gated", "grad_spike_score",
                   add=-3.0)
    down = reg.check([lower], baseline)   # both arms lower: the paired difference moves inside its floor
    assert _verdicts(up, "baseline", "grad_spike_score") == ["regressed"] and up.exit_code == 1
    assert _verdicts(down, "baseline", "grad_spike_score") == ["improved"] and down.exit_code == 0


def test_the_gate_stopping_to_help_is_caught_in_the_paired_difference():
    """Each arm moves inside its own band (s = 4: band 9.8), but the gated arm's advantage shrinks by 17:
    the paired difference gated - baseline (-80 in every seed: band max(1, 10% of 80)) regressed."""
    base_record = _set(_set(pair_record(), "baseline", "m_act_mean", [100.0, 104.0, 96.0]),
                       "gated", "m_act_mean", [20.0, 24.0, 16.0])
    current = _set(_set(base_record, "baseline", "m_act_mean", [92.0, 96.0, 88.0]),
                   "gated", "m_act_mean", [29.0, 33.0, 25.0])
    result = reg.check([current], reg.make_baseline([base_record]))
    assert _verdicts(result, "baseline", "m_act_mean") == ["ok"]
    assert _verdicts(result, "gated", "m_act_mean") == ["ok"]
    row = _row(result, "gated-baseline", "m_act_mean")
    assert (row.delta, row.band, row.verdict) == (pytest.approx(17.0), pytest.approx(8.0), "regressed")


def test_seed_spread_of_the_baseline_widens_the_band():
    base_record = _set(pair_record(), "gated", "m_act_mean", [2.0, 10.0, 6.0])   # s = 4
    shifted = _set(base_record, "gated", "m_act_mean", [6.0, 14.0, 10.0])      # +4 each seed
    baseline = reg.make_baseline([base_record])
    row = _row(reg.check([shifted], baseline), "gated", "m_act_mean")
    assert row.band == pytest.approx(3 * 4.0 * math.sqrt(2 / 3)) and row.verdict == "ok"
    assert _verdicts(reg.check([shifted], baseline, {"m_act_mean": {"k": 0.5}}), "gated", "m_act_mean") == \
        ["regressed"]


def test_other_seeds_are_compared_unpaired_with_the_standard_error_of_both_means_and_student_t():
    """Unpaired, s comes from 3 baseline seeds (2 degrees of freedom): the multiplier is the t value of
    the normal tail beyond 3 (0.135% one-sided), 19.2067 by the t table, not 3."""
    base_record = _set(pair_record(), "gated", "m_act_mean", [2.0, 10.0, 6.0])   # mean 6, s = 4
    other = _set(pair_record(seeds=(5, 6, 7)), "gated", "m_act_mean", [7.0, 7.0, 7.0])
    row = _row(reg.check([other], reg.make_baseline([base_record])), "gated", "m_act_mean")
    assert row.mode == "unpaired 3/3" and row.delta == pytest.approx(1.0)
    assert row.band == pytest.approx(19.2067 * 4.0 * math.sqrt(1 / 3 + 1 / 3), rel=1e-5)
    far = _set(pair_record(seeds=(5, 6, 7)), "gated", "m_act_mean", [70.0, 70.0, 70.0])   # +64 > 62.7
    assert _verdicts(reg.check([far], reg.make_baseline([base_record])), "gated", "m_act_mean") == ["regressed"]


def test_figures_of_an_arm_that_diverged_are_left_out_and_its_status_is_judged(record, baseline):
    broken = copy.deepcopy(record)
    arm = next(a for a in broken["arms"] if a["arm"] == "gated" and a["seed"] == 1)
    arm.update(status="diverged", diverged_at_step=12)
    arm["final"].update(m_act_mean=4.7e12, heldout_loss=12979.0, diverged=True, divergence_step=12)
    result = reg.check([broken], baseline)
    status = _row(result, "gated", "status")
    assert status.verdict == "regressed" and "seed 1 diverged at step 12" in status.note
    m_act = _row(result, "gated", "m_act_mean")
    assert m_act.verdict == "ok" and m_act.mode == "paired n=2"     # the 4.7e12 is never compared
    assert _verdicts(result, "gated", "divergence_step") == ["regressed"]


def test_earlier_divergence_than_the_baseline_regresses():
    def diverging(steps):
        rec = pair_record()
        for arm, step in zip([a for a in rec["arms"] if a["arm"] == "baseline"], steps):
            arm.update(status="diverged", diverged_at_step=step)
            arm["final"].update(diverged=True, divergence_step=step)
        return rec
    baseline = reg.make_baseline([diverging([40, 42, 41])])
    assert _verdicts(reg.check([diverging([40, 43, 41])], baseline), "baseline", "divergence_step") == ["ok"]
    assert _verdicts(reg.check([diverging([20, 22, 21])], baseline), "baseline", "divergence_step") == \
        ["regressed"]


def test_peak_figures_of_diverged_arms_are_left_out_on_both_sides_and_judged_when_they_completed():
    """The largest update norm of an arm that diverged is the size of its explosion (baseline 6.5e4,
    a harmless change 4.4e6 in the regression zoo): left out seed by seed, on the baseline's side as
    well (a baseline made before the figure was a peak figure still holds it). The same jump in arms
    that completed regresses."""
    def ramp(norms, status):
        rec = pair_record()
        for arm, norm in zip([a for a in rec["arms"] if a["arm"] == "gated"], norms):
            arm["final"].update(max_update_norm=norm, max_grad_norm=norm, loss_spike_score=norm)
            if status == "diverged":
                arm.update(status="diverged", diverged_at_step=40)
                arm["final"].update(diverged=True, divergence_step=40)
        return rec
    new_baseline = reg.make_baseline([ramp([6.0e4, 7.0e4, 6.5e4], "diverged")])
    figures = new_baseline["cases"]["smoke/standard"]["arms"]["gated"]["figures"]
    assert "max_update_norm" not in figures and "max_grad_norm" not in figures
    old_baseline = copy.deepcopy(new_baseline)
    old_figures = old_baseline["cases"]["smoke/standard"]["arms"]["gated"]["figures"]
    for name in ("max_update_norm", "max_grad_norm", "loss_spike_score"):
        old_figures[name] = {"0": 6.0e4, "1": 7.0e4, "2": 6.5e4}
    exploded = ramp([4.4e6, 3.9e5, 6.4e5], "diverged")
    for baseline in (old_baseline, new_baseline):
        result = reg.check([exploded], baseline)
        assert not [r for r in result.rows if r.figure in ("max_update_norm", "max_grad_norm", "loss_spike_score")
                    and r.arm.startswith("gated")], result.table()
        assert result.exit_code == 0, result.table()
    completed = reg.make_baseline([ramp([6.0e4, 7.0e4, 6.5e4], "completed")])
    result = reg.check([ramp([4.4e6, 3.9e5, 6.4e5], "completed")], completed)
    assert _verdicts(result, "gated", "max_update_norm") == ["regressed"]
    assert _verdicts(result, "gated", "loss_spike_score") == ["regressed"]


def test_a_finite_baseline_figure_turning_non_finite_in_a_completed_arm_regresses(record, baseline):
    broken = _set(record, "gated", "heldout_loss", [None, None, None])
    result = reg.check([broken], baseline)
    assert _verdicts(result, "gated", "heldout_loss") == ["regressed"] and result.exit_code == 1


def test_fault_selfcheck_and_claim_records_never_enter_a_check_or_a_baseline(record, baseline):
    fault = copy.deepcopy(edited(record, "gated", "m_act_mean", factor=100.0))
    fault["purpose"] = "fault"
    result = reg.check([record, fault], baseline)
    assert result.exit_code == 0 and any("1 fault record" in n for n in result.notes)
    with pytest.raises(RecordError, match="no regression records"):
        reg.make_baseline([fault])
    assert reg.check([fault], baseline).exit_code == 2


def test_the_same_case_arm_and_seed_twice_is_unusable(record, baseline):
    result = reg.check([record, copy.deepcopy(record)], baseline)
    assert result.exit_code == 2 and "appears twice" in result.errors[0]


def test_a_baseline_from_another_preset_is_unusable_and_names_the_field(record):
    other = reg.make_baseline([pair_record(preset="ci", name="smoke")])
    result = reg.check([record], other)
    assert result.exit_code == 2
    assert "preset differs" in result.table() and "'ci'" in result.table()


def test_a_different_model_config_is_unusable_and_names_the_field(baseline):
    result = reg.check([pair_record(**{"model.d_model": 96})], baseline)
    assert result.exit_code == 2
    assert "run.model.d_model" in result.errors[0] and "64" in result.errors[0] and "96" in result.errors[0]


def test_a_different_schedule_is_unusable_and_says_schedule(baseline):
    result = reg.check([pair_record(schedule="lr_ramp")], baseline)
    assert result.exit_code == 2 and "schedule differs" in result.errors[0]


def test_a_killed_record_is_unusable(baseline):
    result = reg.check([pair_record(status="killed")], baseline)
    assert result.exit_code == 2 and "killed" in result.errors[0]


def test_a_new_case_is_noted_not_a_regression(record, baseline):
    result = reg.check([record, pair_record(name="lr_ramp_case")], baseline)
    assert result.exit_code == 0 and any("lr_ramp_case" in n for n in result.notes)


def test_unknown_figure_or_key_in_tolerances_is_an_error(tmp_path, record, baseline):
    with pytest.raises(RecordError, match="unknown figure 'loss_spikes_typo'"):
        reg.check([record], baseline, {"loss_spikes_typo": {"floor": 1}})
    with pytest.raises(RecordError, match="m_act_mean.abs is unknown"):
        reg.check([record], baseline, {"m_act_mean": {"abs": 1}})
    toml = tmp_path / "tol.toml"
    toml.write_text("[not_a_figure]\nfloor = 1.0\n")
    with pytest.raises(RecordError, match="unknown figure 'not_a_figure'"):
        reg.load_tolerances(toml)


def test_a_tolerance_file_overrides_the_band(tmp_path, record, baseline):
    shifted = edited(record, "gated", "m_act_mean", factor=2.0)
    tol = tmp_path / "tol.json"
    tol.write_text(json.dumps({"m_act_mean": {"rel_floor": 2.0}}))
    assert reg.check([shifted], baseline).exit_code == 1
    assert reg.check([shifted], baseline, reg.load_tolerances(tol)).exit_code == 0


def test_load_baseline_rejects_missing_corrupt_and_unknown_schema(tmp_path, baseline):
    with pytest.raises(RecordError, match="does not exist"):
        reg.load_baseline(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"schema_version": 2, "kind": "stability-base')
    with pytest.raises(RecordError, match="not valid JSON"):
        reg.load_baseline(tmp_path / "bad.json")
    (tmp_path / "v9.json").write_text(json.dumps({**baseline, "schema_version": 9}))
    with pytest.raises(RecordError, match="schema_version=9"):
        reg.load_baseline(tmp_path / "v9.json")


# ----------------------------------------------------------------------------- through the command line

def test_cli_check_exit_codes_and_readable_table(tmp_path, record, capsys):
    path = _write(tmp_path / "r.json", record)
    assert main(["baseline", "update", path, "--out", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    assert main(["check", "--baseline", str(tmp_path / "b.json"), path]) == 0
    assert "PASS" in capsys.readouterr().out
    worse = _write(tmp_path / "worse.json", edited(record, "baseline", "f_attn_mean", add=0.3))
    assert main(["check", "--baseline", str(tmp_path / "b.json"), worse]) == 1
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines() if line.startswith("smoke/standard  baseline  ")]
    assert [line[-1] for line in lines if line[2] == "f_attn_mean"] == ["REGRESSED"]
    assert "regressed: smoke/standard baseline f_attn_mean" in out
    header = next(line for line in out.splitlines() if line.startswith("case"))
    assert "baseline" in header and "current" in header and "band" in header


def test_cli_bad_inputs_exit_2_with_a_message(tmp_path, record, baseline, capsys):
    base = tmp_path / "b.json"
    reg.write_baseline(baseline, base)
    truncated = tmp_path / "trunc.json"
    truncated.write_text(json.dumps(record)[:500])
    assert main(["check", "--baseline", str(base), str(truncated)]) == 2
    assert "not valid JSON" in capsys.readouterr().out
    unknown = _write(tmp_path / "v7.json", {**record, "schema_version": 7})
    assert main(["check", "--baseline", str(base), unknown]) == 2
    assert "schema_version=7 is unknown" in capsys.readouterr().out
    not_arms = _write(tmp_path / "arms.json", {**record, "arms": {"baseline": 1}})
    assert main(["check", "--baseline", str(base), not_arms]) == 2
    assert "'arms' must be a list of arm objects" in capsys.readouterr().out
    good = _write(tmp_path / "good.json", record)
    assert main(["check", "--baseline", str(tmp_path / "missing.json"), good]) == 2
    assert "does not exist" in capsys.readouterr().out
    (tmp_path / "tol.json").write_text('{"bogus": {"floor": 1}}')
    assert main(["check", "--baseline", str(base), good, "--tolerances", str(tmp_path / "tol.json")]) == 2
    assert "unknown figure 'bogus'" in capsys.readouterr().out
    assert main(["baseline", "update", str(truncated), "--out", str(tmp_path / "x.json")]) == 2


def test_baseline_update_default_name_is_preset_and_device(tmp_path, record, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path / "r.json", record)
    assert main(["baseline", "update", path, "--commit", "feedbeef"]) == 0
    written = tmp_path / "reports" / "baselines" / "smoke-cpu.json"
    assert reg.load_baseline(written)["commit"] == "feedbeef"
    assert reg.default_baseline_path("full", "cuda:3").name == "full-cuda.json"


def test_markdown_summary_goes_to_github_step_summary(tmp_path, record, baseline, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    base = tmp_path / "b.json"
    reg.write_baseline(baseline, base)
    worse = _write(tmp_path / "w.json", edited(record, "gated", "m_act_max", factor=3.0))
    assert main(["check", "--baseline", str(base), worse]) == 1
    text = summary.read_text()
    assert "REGRESSED" in text and "| smoke/standard | gated | m_act_max |" in text
    assert "| case | arm | figure | better | baseline | current | delta | band | compared | verdict |" in text


# ----------------------------------------------------------------------------- run directories

def _session(root, name, records):
    from stability.record.rundir import ensure_run_dir

    session = ensure_run_dir(root / name, "test")
    for record in records:
        _write(session / f"{record['id']}-{record['schedule']}.json", record)
    return session


def test_check_reads_the_newest_run_directory_only(tmp_path, record, baseline, capsys):
    runs = tmp_path / "runs"
    worse = edited(record, "gated", "m_act_mean", factor=5.0)
    _session(runs, "20260101T000000-pytest-aaaaaa", [worse])
    _session(runs, "20260102T000000-pytest-bbbbbb", [record])
    reg.write_baseline(baseline, tmp_path / "b.json")
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(runs)]) == 0   # the older, worse one unread
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(runs / "20260101T000000-pytest-aaaaaa")]) == 1
    capsys.readouterr()
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(runs), "--all-sessions"]) == 0
    assert "left out: a newer record holds the same (arm, seed, config)" in capsys.readouterr().out


def test_repeated_seeds_are_never_pooled_twice(record):
    from stability.record.rundir import unique_arms

    older = copy.deepcopy(record)
    older["created_at"] = "2025-01-01T00:00:00+00:00"
    kept, notes = unique_arms([older, record])
    assert kept == [record] and len(notes) == 1


def test_no_run_directory_with_records_is_unusable_input(tmp_path, baseline, capsys):
    reg.write_baseline(baseline, tmp_path / "b.json")
    (tmp_path / "runs" / "20260101T000000-run-cccccc").mkdir(parents=True)
    (tmp_path / "runs" / "20260101T000000-run-cccccc" / "manifest.json").write_text("{}")
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(tmp_path / "runs")]) == 2
