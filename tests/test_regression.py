"""Properties of the merge check (stability/regression.py, `stability check`, `stability baseline update`)."""

from __future__ import annotations

import json

import pytest
from _stability_records import edited, pair_record

from stability import regression as reg
from stability.cli import main


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1))


@pytest.fixture(scope="module")
def baseline(record):
    return reg.make_baseline([record], commit="abc123")


def _write(path, record):
    path.write_text(json.dumps(record, allow_nan=False))
    return str(path)


def _verdicts(result, arm, figure):
    return [r.verdict for r in result.rows if r.arm == arm and r.figure == figure]


def test_baseline_document_holds_schema_preset_device_fingerprint_commit_and_seed_statistics(record, baseline):
    assert baseline["schema_version"] == reg.BASELINE_SCHEMA_VERSION
    assert (baseline["preset"], baseline["device"], baseline["commit"]) == ("smoke", "cpu", "abc123")
    case = baseline["cases"]["smoke/standard"]
    assert case["fingerprint"] == reg.config_fingerprint(record["config"])
    stats = case["arms"]["gated"]["m_act_mean"]
    values = [a["final"]["m_act_mean"] for a in record["arms"] if a["arm"] == "gated"]
    assert stats["n"] == 2 and stats["values"] == values
    assert stats["mean"] == pytest.approx(sum(values) / 2)
    assert stats["std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)


def test_unchanged_records_pass_with_exit_code_0(record, baseline):
    result = reg.check([record], baseline)
    assert result.exit_code == 0, result.table()
    assert result.rows and all(r.verdict == "ok" for r in result.rows)
    assert not result.regressed


def test_a_worse_figure_beyond_its_band_regresses_with_exit_code_1(record, baseline):
    worse = edited(record, "gated", "m_act_mean", factor=2.0)
    result = reg.check([worse], baseline)
    assert result.exit_code == 1
    assert [(r.arm, r.figure) for r in result.regressed] == [("gated", "m_act_mean")]
    assert "REGRESSED" in result.table() and "m_act_mean" in result.table()


def test_a_change_inside_the_band_is_ok(record, baseline):
    nudged = edited(record, "baseline", "heldout_loss", add=0.01)   # band: max(0.05, 2% of ~3.1)
    assert _verdicts(reg.check([nudged], baseline), "baseline", "heldout_loss") == ["ok"]


def test_direction_higher_is_better_accuracy_drop_regresses_and_rise_improves(record, baseline):
    assert _verdicts(reg.check([edited(record, "gated", "accuracy", add=-0.05)], baseline), "gated",
                     "accuracy") == ["regressed"]
    assert _verdicts(reg.check([edited(record, "gated", "accuracy", add=+0.05)], baseline), "gated",
                     "accuracy") == ["improved"]


def test_direction_lower_is_better_spike_score_rise_regresses_and_drop_improves(record, baseline):
    up = reg.check([edited(record, "baseline", "grad_spike_score", add=5.0)], baseline)
    down = reg.check([edited(record, "baseline", "grad_spike_score", factor=0.0, add=-3.0)], baseline)
    assert _verdicts(up, "baseline", "grad_spike_score") == ["regressed"] and up.exit_code == 1
    assert _verdicts(down, "baseline", "grad_spike_score") == ["improved"] and down.exit_code == 0


def test_critical_lr_is_higher_better_in_the_default_table():
    assert reg.DEFAULT_TOLERANCES["critical_lr"]["better"] == "higher"
    assert reg.DEFAULT_TOLERANCES["loss_spike_score"]["better"] == "lower"


def test_seed_spread_widens_the_band(record):
    noisy = edited(record, "gated", "m_act_mean")
    gated = [a for a in noisy["arms"] if a["arm"] == "gated"]
    gated[0]["final"]["m_act_mean"], gated[1]["final"]["m_act_mean"] = 2.0, 10.0   # std ~5.7
    base = reg.make_baseline([noisy])
    shifted = edited(noisy, "gated", "m_act_mean", add=4.0)   # beyond abs/rel (1, 25% of 6), inside 3*std
    row = next(r for r in reg.check([shifted], base).rows if r.arm == "gated" and r.figure == "m_act_mean")
    assert row.band == pytest.approx(3 * row.baseline_std) and row.verdict == "ok"
    tight = reg.check([shifted], base, {"m_act_mean": {"k": 0.0}})
    assert _verdicts(tight, "gated", "m_act_mean") == ["regressed"]


def test_a_finite_baseline_figure_turning_non_finite_regresses(record, baseline):
    broken = edited(record, "gated", "heldout_loss")
    for arm in broken["arms"]:
        if arm["arm"] == "gated":
            arm["final"]["heldout_loss"] = None
    result = reg.check([broken], baseline)
    assert _verdicts(result, "gated", "heldout_loss") == ["regressed"] and result.exit_code == 1


def test_a_baseline_from_another_preset_is_unusable_and_names_the_field(record):
    other = reg.make_baseline([pair_record(preset="ci", name="smoke")])
    result = reg.check([record], other)
    assert result.exit_code == 2
    assert "preset differs" in result.table() and "'ci'" in result.table()


def test_a_different_model_config_is_unusable_and_names_the_field(baseline):
    changed = pair_record(**{"model.d_model": 96})
    result = reg.check([changed], baseline)
    assert result.exit_code == 2
    assert "run.model.d_model" in result.errors[0] and "64" in result.errors[0] and "96" in result.errors[0]


def test_a_different_schedule_is_unusable_and_says_schedule(baseline):
    result = reg.check([pair_record(schedule="lr_ramp")], baseline)
    assert result.exit_code == 2 and "schedule differs" in result.errors[0]


def test_a_killed_record_is_unusable(baseline):
    result = reg.check([pair_record(status="killed")], baseline)
    assert result.exit_code == 2 and "killed" in result.errors[0]


def test_different_seeds_are_comparable(baseline):
    assert reg.check([pair_record(seeds=(0, 1, 2))], baseline).exit_code in (0, 1)


def test_a_new_case_is_noted_not_a_regression(record, baseline):
    result = reg.check([record, pair_record(name="lr_ramp_case")], baseline)
    assert result.exit_code == 0 and any("lr_ramp_case" in n for n in result.notes)


def test_unknown_figure_in_tolerances_is_an_error(tmp_path, record, baseline):
    with pytest.raises(reg.RegressionInputError, match="unknown figure 'loss_spikes_typo'"):
        reg.check([record], baseline, {"loss_spikes_typo": {"abs": 1}})
    toml = tmp_path / "tol.toml"
    toml.write_text("[not_a_figure]\nabs = 1.0\n")
    with pytest.raises(reg.RegressionInputError, match="unknown figure 'not_a_figure'"):
        reg.load_tolerances(toml)


def test_a_tolerance_file_overrides_the_band(tmp_path, record, baseline):
    shifted = edited(record, "gated", "m_act_mean", factor=2.0)
    tol = tmp_path / "tol.json"
    tol.write_text(json.dumps({"m_act_mean": {"rel": 2.0}}))
    assert reg.check([shifted], baseline, reg.load_tolerances(tol)).exit_code == 0


def test_load_baseline_rejects_missing_corrupt_and_unknown_schema(tmp_path, baseline):
    with pytest.raises(reg.RegressionInputError, match="does not exist"):
        reg.load_baseline(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"schema_version": 1, "kind": "stability-base')
    with pytest.raises(reg.RegressionInputError, match="not valid JSON"):
        reg.load_baseline(tmp_path / "bad.json")
    (tmp_path / "v9.json").write_text(json.dumps({**baseline, "schema_version": 9}))
    with pytest.raises(reg.RegressionInputError, match="schema_version=9"):
        reg.load_baseline(tmp_path / "v9.json")


# ----------------------------------------------------------------------------- through the command line

def test_cli_check_exit_codes_and_readable_table(tmp_path, record, capsys):
    records = tmp_path / "runs"
    records.mkdir()
    path = _write(records / "r.json", record)
    assert main(["baseline", "update", path, "--out", str(tmp_path / "b.json")]) == 0
    capsys.readouterr()
    assert main(["check", "--baseline", str(tmp_path / "b.json"), path]) == 0
    assert "PASS" in capsys.readouterr().out
    worse = _write(tmp_path / "worse.json", edited(record, "baseline", "f_attn_mean", add=0.3))
    assert main(["check", "--baseline", str(tmp_path / "b.json"), worse, "--changed-only"]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "f_attn_mean" in line]
    assert "REGRESSED" in out and len(lines) == 1 and "REGRESSED" in lines[0]
    assert "baseline" in out.splitlines()[2] and "current" in out.splitlines()[2]   # table header


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
    good = _write(tmp_path / "good.json", record)
    assert main(["check", "--baseline", str(tmp_path / "missing.json"), good]) == 2
    assert "does not exist" in capsys.readouterr().out
    (tmp_path / "tol.json").write_text('{"bogus": {"abs": 1}}')
    assert main(["check", "--baseline", str(base), good, "--tolerances", str(tmp_path / "tol.json")]) == 2
    assert "unknown figure 'bogus'" in capsys.readouterr().out
    assert main(["baseline", "update", str(truncated), "--out", str(tmp_path / "x.json")]) == 2


def test_baseline_update_default_name_is_preset_and_device(tmp_path, record, monkeypatch, capsys):
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
    assert "| case | arm | figure | direction | baseline | current | delta | band | verdict |" in text
