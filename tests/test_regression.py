"""Properties of the merge check (stability/check/: regression.py, rows.py, verdict.py, baseline.py,
calibration.py; `stability check`, `stability baseline ...`): noise from rounding replicates, floors and resolution, the primary family judged at
the job's rate and advisory rows that never fail it, outcomes seed by seed, inputs that fail closed, the
calibration over every arrangement of a baseline's replicates."""

from __future__ import annotations

import copy
import json
import statistics
from dataclasses import replace

import pytest
from _stability_records import diverged_run, edited, pair_record, replicate, with_replicates

from stability.check import baseline as baselines
from stability.check import baseline_schema
from stability.check import calibration as cal
from stability.check import regression as reg
from stability.check.family import in_primary_family
from stability.check.rows import DOF_RULE, Row, judge
from stability.check.tolerances import load_tolerances, resolve_tolerances
from stability.check.verdict import METHOD, CheckResult, decide
from stability.cli import main
from stability.record import RecordError, paired_summary
from stability.record import figures as fig
from stability.record.stats import holm, t_upper_tail


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2))


@pytest.fixture(scope="module")
def baseline(record):
    return baselines.make_baseline(with_replicates(record), commit="abc123")


def _write(path, record):
    path.write_text(json.dumps(record, allow_nan=False))
    return str(path)


def _row(result, arm, figure):
    return next(r for r in result.rows if r.arm == arm and r.figure == figure)


def _set(record, arm, figure, values):
    """A copy of ``record`` whose ``arm`` arms (seed order) have ``figure`` = values."""
    out = copy.deepcopy(record)
    for entry, value in zip([a for a in out["arms"] if a["arm"] == arm], values):
        entry["final"][figure] = value
    out["paired"] = paired_summary(out["arms"])
    return out


def _base(values: dict[str, list[float]]) -> dict:
    """seed -> the values of its replicates (0 the reference) in the baseline's layout."""
    return {seed: {str(r): v for r, v in enumerate(runs)} for seed, runs in values.items()}


# ----------------------------------------------------------------------------- the baseline

def test_baseline_holds_every_seeds_reference_and_replicates(record, baseline):
    assert baseline["schema_version"] == baselines.BASELINE_SCHEMA_VERSION == 7
    assert baseline["noise"] == baselines.NOISE and "every step's gradients" in baseline["noise"]
    assert (baseline["preset"], baseline["device"], baseline["commit"]) == ("smoke", "cpu", "abc123")
    assert baseline["replicates"] == [0, 1, 2, 3, 4]
    gated = baseline["cases"]["smoke/standard"]["arms"]["gated"]
    reference = {str(a["seed"]): a["final"]["m_act_mean"] for a in record["arms"] if a["arm"] == "gated"}
    assert {s: runs["0"] for s, runs in gated["figures"]["m_act_mean"].items()} == reference
    assert all(len(runs) == 5 for runs in gated["figures"]["m_act_mean"].values())
    assert gated["status"]["1"] == {str(d): "completed" for d in range(5)}


def test_a_baseline_needs_three_seeds_and_two_replicates_per_seed(record):
    with pytest.raises(RecordError, match="at least 3 seeds"):
        baselines.make_baseline(with_replicates(pair_record(seeds=(0, 1))))
    with pytest.raises(RecordError, match="at least 2 replicates"):
        baselines.make_baseline(with_replicates(record, replicates=(1,)))


def test_a_baseline_of_a_tree_with_uncommitted_changes_is_refused_unless_allowed(record):
    dirty = [{**r, "git": {**r["git"], "dirty": True}} for r in with_replicates(record)]
    with pytest.raises(RecordError, match="uncommitted changes .* --allow-dirty"):
        baselines.make_baseline(dirty)
    made = baselines.make_baseline(dirty, allow_dirty=True)
    assert made["dirty"] is True and made["commit"] == record["git"]["commit"]


def test_replicates_are_not_taken_for_repeats_of_one_run(record):
    from stability.record.rundir import duplicate_runs

    assert duplicate_runs(with_replicates(record, replicates=(1, 2))) == []
    twice = duplicate_runs([record, copy.deepcopy(record)])
    assert len(twice) == len(record["arms"]) and "is in two records" in twice[0]


# ----------------------------------------------------------------------------- one row

def test_a_row_by_hand_paired_welch_degrees_of_freedom():
    """Held-out loss, three seeds of five runs each whose deviations are 0, +-0.002, +-0.001 (sample
    variance 2.5e-6 per seed, 4 degrees of freedom). Current +0.03 at every seed: delta 0.03, floor
    max(0.02, 0.005 * 3.2) = 0.02, se = sqrt(3 * 2.5e-6 * (1 + 1/5)) / 3 = 0.001, z = (0.03 - 0.02) / 0.001
    = 10; degrees of freedom 4 (the fewest of any seed: the check's rule), 12 under Welch."""
    base = _base({"0": [3.200, 3.202, 3.198, 3.201, 3.199], "1": [3.250, 3.251, 3.249, 3.252, 3.248],
                  "2": [3.150, 3.149, 3.151, 3.148, 3.152]})
    stats = judge(base, {"0": 3.230, "1": 3.280, "2": 3.180}, "heldout_loss")
    assert stats["delta"] == pytest.approx(0.03) and stats["floor"] == pytest.approx(0.02)
    assert stats["se"] == pytest.approx(0.001) and stats["z"] == pytest.approx(10.0)
    assert DOF_RULE == "min" and stats["mode"] == "n=3 df=4"
    assert stats["p"] == pytest.approx(t_upper_tail(10.0, 4))
    welch = judge(base, {"0": 3.230, "1": 3.280, "2": 3.180}, "heldout_loss", dof_rule="welch")
    assert welch["mode"] == "n=3 df=12" and welch["p"] == pytest.approx(t_upper_tail(10.0, 12))
    inside = judge(base, {"0": 3.201, "1": 3.251, "2": 3.151}, "heldout_loss")
    assert inside["z"] == pytest.approx(-19.0) and inside["p"] > 0.999


def test_the_noise_is_the_replicates_spread_not_the_seed_spread():
    """The same +0.05 move: caught where the runs of a seed agree to 1e-3, not where they spread like
    seeds (0.05), although both baselines have the same seed means."""
    tight = _base({s: [m, m + 1e-3, m - 1e-3] for s, m in (("0", 3.0), ("1", 3.3), ("2", 2.7))})
    wide = _base({s: [m, m + 0.05, m - 0.05] for s, m in (("0", 3.0), ("1", 3.3), ("2", 2.7))})
    current = {"0": 3.05, "1": 3.35, "2": 2.75}
    assert judge(tight, current, "heldout_loss")["p"] < 1e-3
    assert judge(wide, current, "heldout_loss")["p"] > 0.1


def test_one_chaotic_seed_gets_its_own_degrees_of_freedom():
    """Seed 0's runs spread, seeds 1 and 2 agree exactly: the noise is seed 0's, with its 2 degrees of
    freedom (not 6), so a move there is judged against a heavy-tailed t."""
    base = _base({"0": [0.14, 0.18, 0.16], "1": [0.13, 0.13, 0.13], "2": [0.15, 0.15, 0.15]})
    stats = judge(base, {"0": 0.10, "1": 0.13, "2": 0.15}, "accuracy", quantum=1e-4)
    assert stats["mode"].startswith("n=3 df=2")
    assert judge(base, {"0": 0.10, "1": 0.13, "2": 0.15}, "accuracy", quantum=1e-4,
                     dof_rule="min")["mode"] == "n=3 df=2"


def test_the_conservative_rule_takes_the_fewest_degrees_of_freedom_of_any_seed():
    """Three seeds of five runs (4 df each) with equal spreads: Welch gives 12, the "min" rule 4, so the
    same z has a larger p under "min"."""
    base = _base({s: [m, m + 0.002, m - 0.002, m + 0.001, m - 0.001] for s, m in (("0", 3.2), ("1", 3.25),
                                                                                  ("2", 3.15))})
    current = {"0": 3.23, "1": 3.28, "2": 3.18}
    welch, low = (judge(base, current, "heldout_loss", dof_rule=rule) for rule in ("welch", "min"))
    assert welch["mode"] == "n=3 df=12" and low["mode"] == "n=3 df=4" and welch["z"] == low["z"]
    assert low["p"] == pytest.approx(t_upper_tail(low["z"], 4)) and low["p"] > welch["p"]


def test_a_figure_identical_in_every_run_is_judged_at_its_resolution():
    """Accuracy on 2048 tokens moves by 1/2048 at least: identical baseline runs give a noise of one
    quantum, so one token's move passes and a move past the floor (0.005) regresses."""
    base = _base({s: [0.1357421875] * 5 for s in ("0", "1", "2")})
    quantum = 1 / 2048
    one_token = judge(base, {s: 0.1357421875 - quantum for s in ("0", "1", "2")}, "accuracy", quantum)
    assert one_token["noise"] == quantum and one_token["p"] > 0.5
    many = judge(base, {s: 0.1357421875 - 0.02 for s in ("0", "1", "2")}, "accuracy", quantum)
    assert many["p"] < 1e-9
    assert judge(base, {s: 0.1357421875 - 0.02 for s in ("0", "1", "2")}, "accuracy", 0.0)["p"] == 0.0


def test_the_resolution_of_each_kind_of_figure():
    from stability.record.figures import quantum

    config = {"run.probes.eval_batches": 4, "run.data.batch_size": 8, "run.model.context": 64,
              "run.model.n_heads": 4, "run.model.n_layers": 2}
    assert quantum("accuracy", config, 60) == 1 / 2048
    assert quantum("quant_int8_damage_accuracy", config, 60) == 1 / 2048
    assert quantum("loss_spike_score", config, 60) == pytest.approx(100 / 60)
    assert quantum("sink_rate_mean", config, 60) == 1 / 8
    assert (quantum("nonfinite_events", config, 60), quantum("divergence_step", config, 60)) == (1.0, 1.0)
    assert quantum("tokens_seen", config, 60) == 512.0
    assert quantum("heldout_loss", config, 60) == 0.0


def test_a_job_of_other_seeds_is_refused_naming_the_seeds(baseline):
    """Each seed is paired with its own baseline runs; a job of seeds 3, 4, 5 has nothing to pair with:
    exit 2 with the seeds, never a comparison against the seed-to-seed spread that can catch nothing."""
    result = reg.check([pair_record(seeds=(3, 4, 5))], baseline)
    assert result.exit_code == 2
    assert "the job's seeds 3, 4, 5 are not the baseline's 0, 1, 2" in result.errors[0]


# ----------------------------------------------------------------------------- the job's verdict

def test_unchanged_records_and_a_new_rounding_replicate_pass(record, baseline):
    assert reg.check([record], baseline).exit_code == 0
    result = reg.check([replicate(record, 7)], baseline)
    assert result.exit_code == 0, result.table()
    assert "alpha = 0.01" in result.method() and "Holm" in result.method()


def test_one_bad_seed_is_caught(record, baseline):
    bad = _set(record, "reference", "heldout_loss", [3.2, 3.2, 4.5])
    row = _row(reg.check([bad], baseline), "reference", "heldout_loss")
    assert row.verdict == "regressed" and row.z > 10


def test_direction_accuracy_drop_is_worse_and_rise_improves(record, baseline):
    """Accuracy is advisory: a drop is shown as worse and does not fail the job; a rise improves."""
    drop = reg.check([edited(record, "gated", "accuracy", add=-0.05)], baseline)
    assert _row(drop, "gated", "accuracy").verdict == "worse" and drop.exit_code == 0
    assert _row(reg.check([edited(record, "gated", "accuracy", add=0.05)], baseline), "gated",
                "accuracy").verdict == "improved"


def test_only_the_primary_family_fails_a_job(record, baseline):
    """The declared family (the rows the figures of stability.record.figures declare) is what the verdict rests on: held-out loss
    of the plain pair is primary (a move fails the job), F-Attn is advisory (the same size of move is shown
    as worse, exit 0); the method line counts both."""
    from stability.record.figures import primary_rows

    assert in_primary_family("standard", "gated", "heldout_loss")
    assert in_primary_family("standard", "gated-reference", "m_act_max")
    assert not in_primary_family("standard", "gated", "f_attn_mean", "smoke")
    assert not in_primary_family("lr_sweep", "gated", "heldout_loss")
    assert any(p.case == "precision_ladder" and p.arms == "arms" for p in primary_rows())
    assert not in_primary_family("precision_ladder", "gated-reference", "loss_gap_fp16")
    # growth is primary under the ladder and the batch ramp too (a job judging one of them alone sees it),
    # not after the shock (a single step's maximum at the jump: calibration at ci fails with it)
    assert in_primary_family("precision_ladder", "reference", "m_act_max")
    assert in_primary_family("batch_ramp", "gated", "max_attn_logit")
    assert not in_primary_family("shock", "gated", "m_act_max")
    # the range test's early horizon: each arm (the same model under a second schedule), not the difference
    assert in_primary_family("lr_ramp", "reference", "early_grad_norm")
    # the plain pair's early gradient norm: the reference arm only (the gated arm's has a second mode at ci)
    assert in_primary_family("standard", "reference", "early_grad_norm")
    assert not in_primary_family("standard", "gated", "early_grad_norm")
    assert not in_primary_family("standard", "gated-reference", "early_grad_norm")
    assert in_primary_family("standard", "gated", "early_loss")
    assert not in_primary_family("lr_ramp", "gated-reference", "early_loss")
    primary = reg.check([edited(record, "gated", "heldout_loss", add=0.3)], baseline)
    assert primary.exit_code == 1 and _row(primary, "gated", "heldout_loss").tier == "primary"
    advisory = reg.check([edited(record, "reference", "f_attn_mean", add=0.3)], baseline)
    row = _row(advisory, "reference", "f_attn_mean")
    assert advisory.exit_code == 0 and row.tier == "advisory" and row.verdict == "worse" and row.z > 5
    assert f"over {advisory.hypotheses} hypotheses of {advisory.judged} primary rows" in advisory.method()
    assert f"{advisory.advisory} advisory rows never fail the job" in advisory.method()
    assert advisory.hypotheses == 2 * advisory.judged   # worse by its floor, and moved either way
    assert 0 < advisory.judged < 20 < advisory.advisory


def test_a_primary_row_that_moves_beyond_its_noise_either_way_changes_the_job(record):
    """Every primary row is judged both ways: a move beyond its rounding noise in the good direction, or in the
    bad one under its floor, is the code computing something else (exit 3, "changed", naming the row, its
    direction and how to accept it); worse by more than the floor is REGRESSED (exit 1), which wins over a
    change beside it; a move inside the noise passes."""
    with_early = copy.deepcopy(record)
    for entry in with_early["arms"]:
        entry["final"]["early_loss"] = 3.0 + 0.01 * entry["seed"]
    made = baselines.make_baseline(with_replicates(with_early, spread=2e-4))
    lower = reg.check([edited(with_early, "gated", "early_loss", add=-0.5)], made)
    row = _row(lower, "gated", "early_loss")
    assert lower.exit_code == 3 and row.verdict == "changed" and row.p_judged == row.p_change < 1e-6
    assert lower.verdict == "CHANGED" and lower.summary_line().startswith("stability check: CHANGED (exit 3)")
    assert any(line.startswith("changed: smoke/standard gated early_loss moved by -0.5 (better), beyond its "
                               "rounding noise") and "in every seed" in line and "stability baseline make" in line
               for line in lower.failure_lines())
    assert "CHANGED" in lower.table() and "**CHANGED**" in lower.markdown()
    both = reg.check([edited(edited(with_early, "gated", "early_loss", add=-0.5), "gated", "m_act_max", factor=5.0)],
                     made)
    assert both.exit_code == 1 and both.verdict == "REGRESSED"
    higher = reg.check([edited(with_early, "gated", "early_loss", add=0.5)], made)
    assert higher.exit_code == 1 and _row(higher, "gated", "early_loss").verdict == "regressed"
    assert reg.check([with_early], made).exit_code == 0
    better = reg.check([edited(with_early, "gated", "heldout_loss", add=-0.3)], made)
    assert better.exit_code == 3 and _row(better, "gated", "heldout_loss").verdict == "changed"
    under = reg.check([edited(with_early, "gated", "heldout_loss", add=0.018)], made)   # floor 0.02
    assert under.exit_code == 3 and any("(worse, under its floor)" in line for line in under.failure_lines())
    inside = reg.check([edited(with_early, "gated", "heldout_loss", add=1e-5)], made)   # noise ~3e-4
    assert inside.exit_code == 0


def test_a_row_declared_floor_only_is_judged_by_its_floor_alone(record, monkeypatch):
    """A primary row declared ``floor_only`` (its harmless spread heavier-tailed than its replicates show) has
    one hypothesis, worse by more than its floor: a move under the floor passes, one past it regresses."""
    declared = [replace(row, floor_only="measured: heavy-tailed") if (row.case, row.figure) == ("standard",
                "heldout_loss") else row for row in fig.ADDED_PRIMARY]
    monkeypatch.setattr(fig, "ADDED_PRIMARY", declared)
    made = baselines.make_baseline(with_replicates(record))
    under = reg.check([edited(record, "gated", "heldout_loss", add=0.01)], made)
    row = _row(under, "gated", "heldout_loss")
    assert row.floor_only and row.hypotheses == [("regressed", row.p)] and under.exit_code == 0
    assert under.hypotheses == 2 * under.judged - sum(r.floor_only for r in under.primary)
    assert reg.check([edited(record, "gated", "heldout_loss", add=0.3)], made).exit_code == 1
    assert {"case": "standard", "figure": "heldout_loss", "floor_only": True}.items() <= \
        next(r for r in fig.primary_family() if r["figure"] == "heldout_loss").items()


def test_the_same_runs_judged_in_two_cases_count_once(record, baseline):
    """A second case holding the same runs (the sweep's configured runs are the plain pair's) gives rows
    with the same values: they are marked duplicate and leave the family; a primary row keeps the
    judgement."""
    twin = {**copy.deepcopy(record), "name": "twin", "id": "twin"}
    twin_base = baselines.make_baseline(with_replicates(record) + with_replicates(twin))
    result = reg.check([record, twin], twin_base)
    pairs = [(r.case_key, r.tier) for r in result.rows if r.arm == "gated" and r.figure == "heldout_loss"]
    assert sorted(tier for _, tier in pairs) == ["duplicate", "primary"], pairs
    duplicate = next(r for r in result.rows if r.tier == "duplicate" and r.figure == "heldout_loss")
    assert duplicate.note.startswith("the same runs as ") and result.exit_code == 0
    assert result.judged == reg.check([record], baseline).judged


def test_the_gate_stopping_to_help_is_caught_in_the_paired_difference(record, baseline):
    """M-Act of the gated arm at the reference arm's level: the paired row gated - reference regresses."""
    flat = copy.deepcopy(record)
    ref = {a["seed"]: a["final"]["m_act_max"] for a in flat["arms"] if a["arm"] == "reference"}
    for arm in flat["arms"]:
        if arm["arm"] == "gated":
            arm["final"]["m_act_max"] = ref[arm["seed"]]
    result = reg.check([flat], baseline)
    assert _row(result, "gated-reference", "m_act_max").verdict == "regressed"


def test_holm_keeps_the_family_wise_rate(record, baseline):
    assert holm([0.001, 0.04, 0.03, 0.5], 0.05) == [True, False, False, False]
    assert holm([0.01, 0.011, 0.012], 0.05) == [True, True, True]
    assert holm([], 0.01) == []
    result = CheckResult(alpha=0.05)
    result.rows = [Row("c", "a", "heldout_loss", "lower", 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, p, "ok",
                           tier="primary") for p in (0.001, 0.04, 0.03, 0.5)]
    decide(result)
    assert [r.verdict for r in result.rows] == ["regressed", "ok", "ok", "ok"] and result.exit_code == 1


def test_a_row_below_alpha_alone_is_not_a_regression_of_the_job(record, baseline):
    """p = 0.004 < alpha but above alpha / primary rows: the job passes."""
    result = reg.check([record], baseline)
    result.primary[0].p = 0.004
    for row in result.rows:
        row.verdict = "ok"
    decide(result)
    assert result.exit_code == 0 and 0.004 > 0.01 / result.judged



def test_a_new_divergence_fails_the_job_naming_case_arm_seed_and_step(record, baseline):
    """Seed 1 of the gated arm diverges at step 10 where every baseline run of that seed completed: one
    failed outcome naming all of it; its evaluation figures are left out of the rows, not averaged."""
    result = reg.check([diverged_run(record, "gated", 1, 10, heldout_loss=9.0)], baseline)
    assert result.exit_code == 1 and [o.figure for o in result.outcomes] == ["diverged"]
    reason = result.outcomes[0].reason
    assert reason.startswith("case smoke/standard arm gated seed 1: diverged = ") and "step 10" in reason
    assert "every one of the 5 baseline runs of this seed was clean" in reason
    assert "failed: case smoke/standard arm gated seed 1" in result.table()
    assert _row(result, "gated", "heldout_loss").current == pytest.approx(
        sum(a["final"]["heldout_loss"] for a in record["arms"] if a["arm"] == "gated" and a["seed"] != 1) / 2)


def test_a_divergence_the_baseline_seed_also_showed_is_judged_by_the_explicit_rule(record):
    """Two of seed 1's five baseline runs diverged: the job's divergence there is no new outcome, and the
    verdict says how that seed's evaluation figures are judged (left out when its run diverged too,
    against the three completed runs when it completed)."""
    runs = with_replicates(record)
    runs[1], runs[2] = (diverged_run(r, "gated", 1, 12) for r in runs[1:3])
    mixed = baselines.make_baseline(runs)
    diverged = reg.check([diverged_run(record, "gated", 1, 11)], mixed)
    assert diverged.exit_code == 0 and not diverged.outcomes
    assert any("seed 1: 2 of 5 baseline runs diverged; this run diverged as they did" in n for n in diverged.notes)
    completed = reg.check([record], mixed)
    assert any("judged against the 3 completed ones" in n for n in completed.notes)


def test_a_finite_baseline_figure_turning_non_finite_or_absent_fails_the_job(record, baseline):
    """A NaN is a result: M-Act max finite in every baseline run of seed 0 and null now (the JSON of a NaN)
    fails the job, and so does a figure the job no longer reports."""
    result = reg.check([_set(record, "gated", "m_act_max", [None, 30.0, 30.0])], baseline)
    assert result.exit_code == 1
    assert [(o.arm, o.seed, o.figure) for o in result.outcomes] == [("gated", "0", "m_act_max")]
    assert "m_act_max is non-finite now; finite in every one of the 5 baseline runs" in result.outcomes[0].reason
    gone = copy.deepcopy(record)
    del next(a for a in gone["arms"] if a["arm"] == "reference" and a["seed"] == 2)["final"]["max_attn_logit"]
    absent = reg.check([gone], baseline)
    assert absent.exit_code == 1 and "max_attn_logit is absent now" in absent.outcomes[0].reason


def test_an_unhandled_non_finite_value_fails_where_every_baseline_run_was_clean(record):
    """``nonfinite_unhandled`` is an outcome: 0 in every baseline run, 1 in the job's run of seed 2."""
    runs = [_set(r, arm, "nonfinite_unhandled", [0, 0, 0]) for r in with_replicates(record)
            for arm in ("reference",)]
    runs = [_set(r, "gated", "nonfinite_unhandled", [0, 0, 0]) for r in runs]
    base = baselines.make_baseline(runs)
    job = _set(_set(record, "reference", "nonfinite_unhandled", [0, 0, 0]), "gated", "nonfinite_unhandled", [0, 0, 1])
    result = reg.check([job], base)
    assert result.exit_code == 1 and [(o.arm, o.seed) for o in result.outcomes] == [("gated", "2")]
    clean = _set(_set(record, "reference", "nonfinite_unhandled", [0, 0, 0]), "gated", "nonfinite_unhandled", [0, 0, 0])
    assert reg.check([clean], base).exit_code == 0


def test_a_handled_overflow_is_not_an_unhandled_event():
    from stability.record.summary import handled

    assert handled({"what": "grad", "skipped": True})
    assert not handled({"what": "grad", "skipped": False}) and not handled({"what": "loss", "skipped": True})


# ----------------------------------------------------------------------------- calibration

def test_every_arrangement_of_a_clean_baseline_passes(baseline):
    """5 replicates of 3 seeds: 125 arrangements, each judged by the check's own code against the other
    replicates; none fails, and the margin is large."""
    curve = cal.calibrate(baseline)
    assert curve["arrangements"] == 125 and (curve["seeds"], curve["replicates"]) == (3, 5)
    assert curve["failed"] == [0, 0, 0, 0] and curve["margin"] >= 5
    assert cal.acceptable(curve) is None
    chosen = {"0": "2", "1": "0", "2": "4"}
    result = cal.judge_arrangement(baseline, chosen)
    assert result.replicates == [1, 3] and result.exit_code == 0 and result.judged > 0


def test_calibration_shows_a_replicate_that_is_not_a_rounding_change(record):
    """A "replicate" of seed 0 whose held-out loss is 10% worse is no rounding change: the 25 arrangements
    where it plays the change fail (20%, above the diagonal at every alpha); the baseline is not
    acceptable. The same replicate 10% worse at every seed fails one arrangement (the one choosing it at every
    seed: 0.8%, under the diagonal: accepted), and the closest arrangement names it (margin under 1)."""
    records = with_replicates(record)
    one = copy.deepcopy(records[3])
    arm = next(a for a in one["arms"] if a["arm"] == "reference" and a["seed"] == 0)
    arm["final"]["heldout_loss"] *= 1.1
    curve = cal.calibrate(baselines.make_baseline(records[:3] + [one] + records[4:]))
    assert curve["failed"] == [25, 25, 25, 25] and curve["margin"] < 1
    assert "25 of 125 arrangements fail at alpha 0.01" in cal.acceptable(curve)
    records[3] = edited(records[3], "reference", "heldout_loss", factor=1.1)
    curve = cal.calibrate(baselines.make_baseline(records))
    assert curve["failed"] == [1, 1, 1, 1] and curve["closest"]["arrangement"] == {"0": "3", "1": "3", "2": "3"}
    assert curve["margin"] < 1 and cal.acceptable(curve) is None


def test_cli_calibrate_exit_codes(tmp_path, record, baseline, capsys):
    baselines.write_baseline(baseline, tmp_path / "b.json")
    assert main(["baseline", "calibrate", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "125 arrangements" in out and "alpha 0.01" in out and "margin" in out
    records = with_replicates(record)
    records[2] = copy.deepcopy(records[2])
    arm = next(a for a in records[2]["arms"] if a["arm"] == "gated" and a["seed"] == 0)
    arm["final"]["heldout_loss"] += 0.5
    baselines.write_baseline(baselines.make_baseline(records), tmp_path / "bad.json")
    assert main(["baseline", "calibrate", str(tmp_path / "bad.json")]) == 1
    assert "calibration fails" in capsys.readouterr().err


def test_a_calibration_names_its_rule_and_a_check_with_another_rule_says_it_is_stale(tmp_path, baseline, record,
                                                                                      monkeypatch, capsys):
    """``calibrate --write`` stores the curve with the primary family and dof rule it measured, nothing else
    changed; a check whose family differs (a row added to it) warns that the curve is stale, and writing
    it again clears the warning. A failing curve is written only with --accept-calibration."""
    from stability.record import figures as fig

    path = tmp_path / "b.json"
    baselines.write_baseline(baseline, path)
    assert "holds no calibration" in reg.check([record], baseline_schema.load_baseline(path)).warnings[0]
    assert main(["baseline", "calibrate", "--write", str(path)]) == 0
    written = baseline_schema.load_baseline(path)
    assert written["calibration"]["primary_family"] == fig.primary_family() and written["calibration"]["dof_rule"]
    assert {k: v for k, v in written.items() if k != "calibration"} == json.loads(json.dumps(baseline))
    assert reg.check([record], written).warnings == []
    monkeypatch.setattr(fig, "ADDED_PRIMARY", [*fig.ADDED_PRIMARY, fig.Primary("standard", "f_attn_mean")])
    stale = reg.check([record], written)
    assert any("calibration measured another rule" in w for w in stale.warnings) and "warning:" in stale.table()
    assert main(["baseline", "calibrate", "--write", str(path)]) == 0
    assert reg.check([record], baseline_schema.load_baseline(path)).warnings == []
    records = with_replicates(record)
    records[2] = copy.deepcopy(records[2])
    arm = next(a for a in records[2]["arms"] if a["arm"] == "gated" and a["seed"] == 0)
    arm["final"]["heldout_loss"] += 0.5
    baselines.write_baseline(baselines.make_baseline(records), tmp_path / "bad.json")
    capsys.readouterr()
    assert main(["baseline", "calibrate", "--write", str(tmp_path / "bad.json")]) == 1
    assert "calibration" not in baseline_schema.load_baseline(tmp_path / "bad.json")
    assert main(["baseline", "calibrate", "--write", "--accept-calibration", str(tmp_path / "bad.json")]) == 0
    assert baseline_schema.load_baseline(tmp_path / "bad.json")["calibration"]["accepted_anyway"]


def test_baseline_update_refuses_a_baseline_whose_calibration_fails(tmp_path, record, capsys):
    """Nothing is written unless --accept-calibration; then every check that uses it warns."""
    records = with_replicates(record)
    records[2] = copy.deepcopy(records[2])   # one seed's replicate no rounding change: 25 of 125 arrangements fail
    next(a for a in records[2]["arms"] if a["arm"] == "gated" and a["seed"] == 0)["final"]["heldout_loss"] += 0.5
    paths = [_write(tmp_path / f"r{i}.json", r) for i, r in enumerate(records)]
    out = tmp_path / "b.json"
    assert main(["baseline", "update", *paths, "--out", str(out)]) == 2
    assert "baseline not written: its calibration fails" in capsys.readouterr().err and not out.exists()
    assert main(["baseline", "update", *paths, "--out", str(out), "--accept-calibration"]) == 0
    made = baseline_schema.load_baseline(out)
    assert made["calibration"]["accepted_anyway"] and made["calibration"]["arrangements"] == 125
    result = reg.check([record], made)
    assert any("calibration failed" in w for w in result.warnings) and "warning:" in result.table()


# ----------------------------------------------------------------------------- unusable input

def test_a_figure_value_that_is_not_a_number_is_unusable_input(record, baseline):
    for value in ("2.31", [2.31], {"v": 1}):
        result = reg.check([_set(record, "gated", "heldout_loss", [value, 3.0, 3.0])], baseline)
        assert result.exit_code == 2, value
        assert "(arm gated, seed 0).final.heldout_loss = " in result.errors[0], result.errors
        assert "expected a number, true/false or null" in result.errors[0]


def test_a_figure_the_table_does_not_know_is_unusable_input(record, baseline):
    result = reg.check([_set(record, "gated", "heldout_los", [3.0, 3.0, 3.0])], baseline)
    assert result.exit_code == 2 and "final.heldout_los is not a figure of the table" in result.errors[0]


def test_records_of_several_replicates_are_not_one_job(record, baseline):
    result = reg.check(with_replicates(record, replicates=(1,)), baseline)
    assert result.exit_code == 2 and "a check judges one job's records" in result.errors[0]


def test_fault_selfcheck_and_claim_records_never_enter_a_check_or_a_baseline(record, baseline):
    for purpose in ("fault", "selfcheck", "claim"):
        other = {**edited(record, "gated", "m_act_max", factor=100.0), "purpose": purpose}
        result = reg.check([record, other], baseline)
        assert result.exit_code == 0 and any(f"1 {purpose} record" in n for n in result.notes)
        with pytest.raises(RecordError, match="no regression records"):
            baselines.make_baseline([other])


def test_the_same_case_arm_seed_and_replicate_twice_is_unusable(record, baseline):
    assert reg.check([record, record], baseline).exit_code == 2


def test_another_preset_config_or_variant_is_unusable_and_named(record, baseline):
    other = reg.check([pair_record(preset="ci")], baseline)
    assert other.exit_code == 2 and "preset differs" in other.errors[0]
    config = reg.check([pair_record(**{"model.d_model": 96})], baseline)
    assert config.exit_code == 2 and "run.model.d_model" in config.errors[0]
    schedule = reg.check([pair_record(case_label="shock")], baseline)
    assert schedule.exit_code == 2 and "qualifier differs" in schedule.errors[0] and "'shock'" in schedule.errors[0]


def test_a_killed_or_unfinished_record_is_unusable(record, baseline):
    assert reg.check([pair_record(status="killed")], baseline).exit_code == 2
    running = reg.check([{**record, "status": "running"}], baseline)
    assert running.exit_code == 2 and "the case is 'running'" in running.errors[0]


def test_a_job_missing_a_seed_an_arm_or_a_case_fails_closed(record, baseline):
    """What the baseline judged and the job lacks is exit 2 with the reason, never a pass on what is left."""
    no_seed = {**copy.deepcopy(record), "arms": [a for a in record["arms"] if a["seed"] != 2]}
    result = reg.check([no_seed], baseline)
    assert result.exit_code == 2 and "seed(s) 2 of the baseline are not in the job's records" in result.errors[0]
    no_arm = {**copy.deepcopy(record), "arms": [a for a in record["arms"] if a["arm"] != "gated"]}
    result = reg.check([no_arm], baseline)
    assert result.exit_code == 2 and "arm(s) gated of the baseline are not in the job's records" in result.errors[0]
    two_cases = baselines.make_baseline(with_replicates(record) + with_replicates(pair_record(name="extra")))
    result = reg.check([record], two_cases)
    assert result.exit_code == 2 and "no record of the baseline's case(s) extra/standard" in result.errors[0]


def test_a_new_case_makes_the_baseline_stale_naming_the_command(record, baseline):
    """A case the job's code trains that the baseline lacks is not covered: exit 2 with the command that
    makes that case only; judged with --cases on what the baseline holds, the job passes."""
    extra = {**pair_record(name="extra"), "case": "extra"}
    result = reg.check([record, extra], baseline, baseline_path="b.json")
    assert result.exit_code == 2 and "case extra/standard (not in the baseline)" in result.errors[0]
    assert result.errors[0].endswith("stability baseline make --preset smoke --device cpu --cases extra --out b.json")
    assert reg.check([record, extra], baseline, cases=["standard"]).exit_code == 0


def test_cases_narrow_the_baseline_on_purpose_and_say_so(record):
    """`--cases standard` judges the baseline's plain pair only; the verdict names what it left out."""
    extra = {**pair_record(name="extra"), "case": "shock"}
    two = baselines.make_baseline(with_replicates(record) + with_replicates(extra))
    result = reg.check([record], two, cases=["standard"])
    assert result.exit_code == 0 and any("left out on purpose: extra/standard" in n for n in result.notes)
    wrong = reg.check([record], two, cases=["nosuch"])
    assert wrong.exit_code == 2 and "nosuch not in the baseline" in wrong.errors[0]


def test_tolerances_override_floors_and_reject_unknown_names(tmp_path, record, baseline):
    worse = edited(record, "gated", "heldout_loss", add=0.05)
    assert _row(reg.check([worse], baseline), "gated", "heldout_loss").verdict == "regressed"
    relaxed = reg.check([worse], baseline, tolerances={"heldout_loss": {"floor": 0.1}})
    assert _row(relaxed, "gated", "heldout_loss").verdict == "changed"   # under the floor, beyond the noise
    for bad in ({"bogus": {"floor": 1}}, {"heldout_loss": {"k": 3}}, {"heldout_loss": {"floor": -1}}):
        with pytest.raises(RecordError):
            resolve_tolerances(bad)
    (tmp_path / "t.toml").write_text("[heldout_loss]\nfloor = 0.1\n")
    assert load_tolerances(tmp_path / "t.toml") == {"heldout_loss": {"floor": 0.1}}


def test_load_baseline_rejects_missing_corrupt_and_an_older_schema(tmp_path, baseline):
    with pytest.raises(RecordError, match="does not exist"):
        baseline_schema.load_baseline(tmp_path / "none.json")
    (tmp_path / "c.json").write_text("{")
    with pytest.raises(RecordError, match="not valid JSON"):
        baseline_schema.load_baseline(tmp_path / "c.json")
    _write(tmp_path / "v3.json", {**baseline, "schema_version": 3})
    with pytest.raises(RecordError, match="rounding replicates"):
        baseline_schema.load_baseline(tmp_path / "v3.json")


def test_a_baseline_that_says_draws_reads_as_the_same_baseline(tmp_path, baseline, record):
    """A baseline written while a rounding replicate was also called a "draw" holds "draws" where one now
    holds "replicates" (top level and in the calibration): it reads as the same baseline, each key in its
    place, and judges a job the same. A key a baseline does not have is still refused, and so is a file
    holding both names of one key."""
    today = json.loads(json.dumps({**baseline, "calibration": cal.stored(cal.calibrate(baseline), None)}))

    def said_draws(document):
        return {("draws" if key == "replicates" else key): value for key, value in document.items()}
    old = {**said_draws(today), "calibration": said_draws(today["calibration"])}
    assert old["draws"] == [0, 1, 2, 3, 4] and old["calibration"]["draws"] == 5
    read = baseline_schema.load_baseline(_write(tmp_path / "old.json", old))
    assert read == today and list(read) == list(today) and list(read["calibration"]) == list(today["calibration"])
    assert reg.check([record], read).to_dict() == reg.check([record], today).to_dict()
    refused = [({**old, "rounding": 1}, "rounding is not a key of Baseline"),
               ({**old, "calibration": {**old["calibration"], "rounding": 1}},
                "calibration.rounding is not a key of Calibration"),
               ({**old, "replicates": old["draws"]}, "draws is not a key of Baseline")]
    for document, message in refused:
        with pytest.raises(RecordError, match=message):
            baseline_schema.load_baseline(_write(tmp_path / "bad.json", document))


def test_alpha_must_be_a_rate(record, baseline):
    for alpha in (0, 1, -0.1, "0.01"):
        with pytest.raises(RecordError, match="alpha"):
            reg.check([record], baseline, alpha=alpha)


# ----------------------------------------------------------------------------- through the command line

def test_cli_check_states_its_false_alarm_rate_and_the_evidence(tmp_path, record, capsys):
    paths = [_write(tmp_path / f"r{i}.json", r) for i, r in enumerate(with_replicates(record))]
    assert main(["baseline", "update", *paths, "--out", str(tmp_path / "b.json")]) == 0
    assert "125 arrangements" in capsys.readouterr().out
    assert main(["check", "--baseline", str(tmp_path / "b.json"), paths[0]]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "Holm at alpha = 0.01" in out
    assert "false-alarm rate of this job: not measured (the baseline records no null jobs)" in out
    worse = _write(tmp_path / "worse.json", edited(record, "reference", "max_attn_logit", add=3.0))
    assert main(["check", "--baseline", str(tmp_path / "b.json"), worse, "--alpha", "0.05",
                 "--json", str(tmp_path / "c.json")]) == 1
    out = capsys.readouterr().out
    assert "alpha = 0.05" in out and "regressed: smoke/standard reference max_attn_logit worse by more than" in out
    header = next(line for line in out.splitlines() if line.startswith("case"))
    assert all(word in header.split() for word in ("tier", "floor", "noise", "z", "p"))
    document = json.loads((tmp_path / "c.json").read_text())
    assert document["alpha"] == 0.05 and document["method"] == METHOD and 0 < document["rows_judged"] < 20
    assert document["rows_advisory"] > 30 and document["calibration"]["arrangements"] == 125
    assert {"case": "standard", "figure": "heldout_loss", "arms": "all"}.items() <= document["primary_family"][0].items()
    row = next(r for r in document["rows"] if r["verdict"] == "regressed")
    assert row["figure"] == "max_attn_logit" and row["tier"] == "primary" and row["p"] < 1e-6 and row["z"] > 5


def test_cli_bad_inputs_exit_2_with_a_message(tmp_path, record, baseline, capsys):
    base = tmp_path / "b.json"
    baselines.write_baseline(baseline, base)
    truncated = tmp_path / "trunc.json"
    truncated.write_text(json.dumps(record)[:500])
    assert main(["check", "--baseline", str(base), str(truncated)]) == 2
    assert "not valid JSON" in capsys.readouterr().out
    unknown = _write(tmp_path / "v7.json", {**record, "schema_version": 7})
    assert main(["check", "--baseline", str(base), unknown]) == 2
    assert "schema_version=7 is unknown" in capsys.readouterr().out
    string = _write(tmp_path / "s.json", _set(record, "gated", "accuracy", ["0.15", 0.15, 0.15]))
    assert main(["check", "--baseline", str(base), string]) == 2
    assert "(arm gated, seed 0).final.accuracy = '0.15': expected a number" in capsys.readouterr().out
    good = _write(tmp_path / "good.json", record)
    assert main(["check", "--baseline", str(tmp_path / "missing.json"), good]) == 2
    assert "does not exist" in capsys.readouterr().out
    assert main(["baseline", "update", good, "--out", str(tmp_path / "x.json")]) == 2
    assert "at least 2 replicates" in capsys.readouterr().err


def test_baseline_update_default_name_is_preset_and_device(tmp_path, record, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = [_write(tmp_path / f"r{i}.json", r) for i, r in enumerate(with_replicates(record))]
    assert main(["baseline", "update", *paths, "--commit", "feedbeef"]) == 0
    assert baseline_schema.load_baseline(tmp_path / "reports" / "baselines" / "smoke-cpu.json")["commit"] == "feedbeef"
    assert baselines.default_baseline_path("full", "cuda:3").name == "full-cuda.json"


def test_markdown_summary_states_alpha_and_names_the_row(tmp_path, record, baseline, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    baselines.write_baseline(baseline, tmp_path / "b.json")
    worse = _write(tmp_path / "w.json", edited(record, "gated", "m_act_max", factor=3.0))
    assert main(["check", "--baseline", str(tmp_path / "b.json"), worse]) == 1
    text = summary.read_text()
    assert "REGRESSED" in text and "| smoke/standard | gated | m_act_max |" in text
    assert "alpha = 0.01" in text and "| case | arm | figure | tier | baseline | current | delta | floor |" in text


# ----------------------------------------------------------------------------- run directories

def _session(root, name, records):
    from stability.record.rundir import ensure_run_dir

    session = ensure_run_dir(root / name, "test")
    for record in records:
        _write(session / f"{record['id']}-{record['case_label']}.json", record)
    return session


def test_check_reads_the_newest_run_directory_only(tmp_path, record, baseline, capsys):
    runs = tmp_path / "runs"
    worse = edited(record, "gated", "m_act_max", factor=5.0)
    _session(runs, "20260101T000000-pytest-aaaaaa", [worse])
    _session(runs, "20260102T000000-pytest-bbbbbb", [record])
    baselines.write_baseline(baseline, tmp_path / "b.json")
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(runs)]) == 0   # the older, worse one unread
    assert f"read run directory {str(runs / '20260102T000000-pytest-bbbbbb')!r}, the newest" in capsys.readouterr().out
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(runs / "20260101T000000-pytest-aaaaaa")]) == 1
    capsys.readouterr()
    # two records of one run are never settled by a date inside them: refused, both named
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(runs), "--all-sessions"]) == 2
    assert "is in two records" in capsys.readouterr().err


def test_no_run_directory_with_records_is_unusable_input(tmp_path, baseline):
    baselines.write_baseline(baseline, tmp_path / "b.json")
    (tmp_path / "runs" / "20260101T000000-run-cccccc").mkdir(parents=True)
    (tmp_path / "runs" / "20260101T000000-run-cccccc" / "manifest.json").write_text("{}")
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(tmp_path / "runs")]) == 2


def test_the_suites_outcome_is_part_of_the_one_verdict(tmp_path, record, baseline, capsys):
    """`--junit`: a failed test of the job's suites fails the check too (exit 1, one line naming it), so the
    check's exit, its table and the job summary agree; an unreadable JUnit file cannot be judged (exit 2)."""
    baselines.write_baseline(baseline, tmp_path / "b.json")
    good = _write(tmp_path / "r.json", record)
    passed = tmp_path / "passed.xml"
    passed.write_text('<testsuites><testsuite><testcase classname="suites.test_standard" name="test_a"/>'
                      '<testcase classname="suites.test_standard" name="test_b"><skipped/></testcase>'
                      '</testsuite></testsuites>')
    failed = tmp_path / "failed.xml"
    failed.write_text('<testsuites><testsuite><testcase classname="suites.test_standard.TestInvariants" '
                      'name="test_record_written_then_tracked"><failure message="AssertionError: not tracked&#10;'
                      'more">trace</failure></testcase></testsuite></testsuites>')
    common = ["check", "--baseline", str(tmp_path / "b.json"), good, "--json", str(tmp_path / "c.json")]
    assert main([*common, "--junit", str(passed)]) == 0
    capsys.readouterr()
    assert main([*common, "--junit", str(passed), "--junit", str(failed)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED" in out and ("failed: test suites.test_standard.TestInvariants::test_record_written_then_tracked "
                                   "failed: AssertionError: not tracked") in out
    assert json.loads((tmp_path / "c.json").read_text())["suite_failures"][0].startswith("test suites.")
    assert main([*common, "--junit", str(tmp_path / "none.xml")]) == 2
    assert "the suites' outcome" in capsys.readouterr().out


def test_a_nan_where_the_baseline_runs_of_the_seed_diverged_too_is_part_of_the_divergence(record):
    """In a case whose runs diverge (the LR range test) some replicates meet a NaN on the way and some stop on an
    exploding loss first: the non-finite outcome is judged only where every baseline run of the seed
    completed, so a job whose run diverges through a NaN there passes, as the calibration of such a
    baseline requires (measured: 9 of 27 arrangements failed before this rule)."""
    runs = []
    for number, r in enumerate(with_replicates(record)):
        out = copy.deepcopy(r)
        for arm in out["arms"]:
            arm.update(status="diverged", diverged_at_step=40)
            arm["final"].update(diverged=True, divergence_step=40, nonfinite_unhandled=int(number == 1),
                                heldout_loss=None)
        runs.append(out)
    ramp = baselines.make_baseline(runs)
    job = copy.deepcopy(runs[0])
    for arm in job["arms"]:
        arm["final"]["nonfinite_unhandled"] = 1
    assert reg.check([job], ramp).outcomes == []
    assert cal.calibrate(ramp)["failed"][0] == 0


def _invariant(name, arm, seed, held, value=None, bound=None, case="smoke/standard"):
    from stability.record.invariants import invariant_line

    return invariant_line(case, name, arm, seed, held, value, bound, "")


def test_model_invariants_are_judged_against_the_baseline_not_absolutely(record):
    """An invariant the baseline's run showed failing is this model's behaviour (noted, not failing the job);
    one that held there and fails now fails the job naming case, arm, seed, value and bound; one the job's
    suites did not evaluate is unusable input; a job without suites notes that none were judged."""
    held = [_invariant("loss_falls", "reference", 0, True, 0.6, 0.9), _invariant("loss_falls", "gated", 0, True),
            _invariant("mean_loss_gap_fp16", "reference", None, False, 0.82, 0.25)]
    base = baselines.make_baseline(with_replicates(record), invariants=held)
    assert base["invariants"] == held
    same = [dict(line) for line in held]
    result = reg.check([record], base, invariants=same)
    assert result.exit_code == 0 and any("mean_loss_gap_fp16 did not hold in the baseline (value 0.82 against "
                                         "bound 0.25) and still fails" in n for n in result.notes)
    broken = [dict(line) for line in held]
    broken[0].update(held=False, value=0.95)
    result = reg.check([record], base, invariants=broken)
    assert result.exit_code == 1 and [o.figure for o in result.outcomes] == ["loss_falls"]
    assert result.outcomes[0].reason == ("case smoke/standard arm reference seed 0: model invariant loss_falls no "
                                         "longer holds (value 0.95 against bound 0.9); it held in the baseline "
                                         "(value 0.6 against bound 0.9)")
    missing = reg.check([record], base, invariants=held[1:])
    assert missing.exit_code == 2 and "did not evaluate model invariant loss_falls" in missing.errors[0]
    none = reg.check([record], base, invariants=None)
    assert none.exit_code == 0 and any("recorded no model invariants" in n for n in none.notes)


def test_a_regressed_job_is_regressed_whatever_else_is_wrong_with_it(record, baseline):
    """A job whose rows regressed and whose inputs also hold a problem (an invariant failing now that the
    baseline cannot judge) is REGRESSED, exit 1, with the problem listed beside it, and no advice to make the
    baseline again (which would bake the regression in); the problem alone is unusable input (exit 2)."""
    failing = [_invariant("loss_gap_fp8", "gated", None, False, 0.9, 0.25)]
    worse = edited(record, "gated", "m_act_max", factor=5.0)
    result = reg.check([worse], baseline, invariants=failing)
    assert baseline["invariants"] is None and result.exit_code == 1 and result.verdict == "REGRESSED"
    assert any(line.startswith("regressed: smoke/standard gated m_act_max") for line in result.failure_lines())
    assert any("the baseline was made without the suites" in line for line in result.failure_lines())
    assert "make the baseline again" not in result.table() and "make the baseline again" not in result.markdown()
    alone = reg.check([record], baseline, invariants=failing)
    assert alone.exit_code == 2 and "the baseline was made without the suites" in alone.errors[0]


def test_the_command_line_reads_the_invariants_of_the_run_directories(tmp_path, record, capsys):
    """`baseline update` keeps the invariants its run directory holds; `check` reads the job's from its own."""
    from stability.record.invariants import append_invariant, invariants_file
    from stability.record.rundir import ensure_run_dir

    made = ensure_run_dir(tmp_path / "runs" / "20260101T000000-baseline-aaaaaa", "test")
    for r in with_replicates(record):
        _write(made / f"{r['id']}.json", r)
    append_invariant(invariants_file(made, "gw0"), _invariant("loss_falls", "gated", 1, True, 0.7, 0.9))
    assert main(["baseline", "update", str(made), "--out", str(tmp_path / "b.json")]) == 0
    assert baseline_schema.load_baseline(tmp_path / "b.json")["invariants"][0]["name"] == "loss_falls"
    job = ensure_run_dir(tmp_path / "runs" / "20260102T000000-pytest-bbbbbb", "test")
    _write(job / "r.json", record)
    append_invariant(invariants_file(job, "main"), _invariant("loss_falls", "gated", 1, False, 0.95, 0.9))
    capsys.readouterr()
    assert main(["check", "--baseline", str(tmp_path / "b.json"), str(job)]) == 1
    assert "model invariant loss_falls no longer holds" in capsys.readouterr().out


def test_a_baseline_without_the_invariants_the_job_evaluates_is_stale(record):
    """A baseline made without the suites cannot judge the job's invariants, held or not: exit 2 on unchanged
    code (never a silent pass), naming the cases to remake and the command."""
    base = baselines.make_baseline(with_replicates(record))
    assert base["invariants"] is None and base["covers"]["invariants"] is None
    for held in (False, True):
        result = reg.check([record], base, invariants=[_invariant("loss_falls", "gated", 0, held, 0.5, 0.9)])
        assert result.exit_code == 2 and result.errors == [
            ("the baseline is stale: the code judges what it does not hold (case smoke/standard model invariants (the "
            "baseline was made without the suites)): remake those cases: stability baseline make --preset smoke "
            "--device cpu --cases standard --out reports/baselines/smoke-cpu.json")]
    made = baselines.make_baseline(with_replicates(record), invariants=[_invariant("loss_falls", "gated", 0, True)])
    assert made["covers"]["invariants"] == {"smoke/standard": ["loss_falls"]}
    new = [_invariant("loss_falls", "gated", 0, True), _invariant("loss_stays_finite", "gated", 0, True)]
    assert "model invariant(s) loss_stays_finite" in reg.check([record], made, invariants=new).errors[0]


# ----------------------------------------------------------------------------- what a baseline covers

def test_a_baseline_states_what_it_covers(record, baseline):
    """The figures each case's runs report, the invariants, the primary family and each figure's resolution,
    as the code that made it judged them; a run that diverged names its evaluation figures too."""
    covered = baseline["covers"]
    assert covered["figures"]["smoke/standard"] == sorted(set(fig.judged(record["arms"][0]["final"])))
    assert covered["primary_family"] == fig.primary_family() and covered["invariants"] is None
    assert covered["resolutions"]["accuracy"] == "token" and covered["resolutions"]["heldout_loss"] is None
    diverged = diverged_run(record, "gated", 0, 30)
    assert "heldout_loss" in baselines.make_baseline(with_replicates(diverged))["covers"]["figures"]["smoke/standard"]


def test_a_baseline_older_than_its_coverage_is_stale(record, baseline):
    """A baseline that does not say what it covers (made by an older version) fails unchanged code, exit 2,
    with the command that remakes it whole."""
    old = {k: v for k, v in baseline.items() if k != "covers"}
    result = reg.check([record], old)
    assert result.exit_code == 2 and "does not state what it covers" in result.errors[0]
    assert result.errors[0].endswith("stability baseline make --preset smoke --device cpu --out "
                                     "reports/baselines/smoke-cpu.json")


def test_a_figure_the_code_now_judges_makes_the_baseline_stale(record, baseline):
    """A judged figure the job's runs report that the baseline's runs did not: stale, naming case and figure."""
    fewer = copy.deepcopy(baseline)
    fewer["covers"]["figures"]["smoke/standard"].remove("m_act_max")
    for arm in fewer["cases"]["smoke/standard"]["arms"].values():
        arm["figures"].pop("m_act_max")
    result = reg.check([record], fewer)
    assert result.exit_code == 2 and "case smoke/standard figure(s) m_act_max" in result.errors[0]
    assert "--cases standard" in result.errors[0]


def test_another_primary_family_makes_the_baseline_stale_until_it_is_calibrated_again(tmp_path, record, baseline,
                                                                                      monkeypatch, capsys):
    """A row that joined the primary family since the baseline was calibrated: stale (exit 2) naming the row and
    `stability baseline calibrate --write`, which measures the curve again without training; then it passes."""
    path = tmp_path / "b.json"
    baselines.write_baseline(baseline, path)
    extra = fig.Primary("standard", "loss_spike_score", "arms")
    monkeypatch.setattr(fig, "ADDED_PRIMARY", [*fig.ADDED_PRIMARY, extra])
    result = reg.check([record], baseline, baseline_path=str(path))
    assert result.exit_code == 2 and "the primary family changed" in result.errors[0]
    assert "added standard/loss_spike_score[arms]" in result.errors[0]
    assert result.errors[0].endswith(f"stability baseline calibrate --write {path}")
    assert main(["baseline", "calibrate", "--write", str(path)]) == 0
    assert reg.check([record], baseline_schema.load_baseline(path)).exit_code == 0


def test_a_stale_baseline_does_not_hide_a_regression(record, baseline):
    """Stale and regressed: REGRESSED (exit 1), the staleness listed beside it."""
    old = {k: v for k, v in baseline.items() if k != "covers"}
    result = reg.check([edited(record, "gated", "m_act_max", factor=5.0)], old)
    assert result.exit_code == 1 and any("does not state what it covers" in line for line in result.failure_lines())


def test_a_baseline_remade_case_by_case_covers_each_case_as_remade(record):
    """Merging remade cases takes their coverage from the new runs and keeps the others'."""
    extra = {**pair_record(name="extra"), "case": "extra"}
    old = baselines.make_baseline(with_replicates(record) + with_replicates(extra))
    old["covers"]["figures"]["extra/standard"].remove("m_act_max")
    new = baselines.make_baseline(with_replicates(record), invariants=[_invariant("loss_falls", "gated", 0, True)])
    both = baselines.merge_cases(old, new, ["standard"])
    assert "m_act_max" not in both["covers"]["figures"]["extra/standard"]
    assert both["covers"]["invariants"] == {"extra/standard": [], "smoke/standard": ["loss_falls"]}
    baseline_schema.validate_baseline(both, "merged")


# ----------------------------------------------------------------------------- the runs a job made

def test_the_check_refuses_records_of_another_commit_than_the_one_it_checks(tmp_path, record, baseline, capsys):
    """Records of another commit than HEAD, or of two commits, are not the job's runs: exit 2 naming the
    commits; `--expect-commit any` judges records of any one commit (a job's artifacts judged elsewhere), and a
    named commit must be the records'."""
    baselines.write_baseline(baseline, tmp_path / "b.json")
    other = copy.deepcopy(record)
    other["git"] = {**other["git"], "commit": "f" * 40}
    elsewhere = _write(tmp_path / "other.json", other)
    check = ["check", "--baseline", str(tmp_path / "b.json")]
    assert main([*check, elsewhere]) == 2
    assert "were trained from commit ffffffffffff, not HEAD" in capsys.readouterr().err
    assert main([*check, elsewhere, "--expect-commit", "any"]) == 0
    assert main([*check, elsewhere, "--expect-commit", "fffffff"]) == 0
    assert main([*check, elsewhere, "--expect-commit", "abcdef0"]) == 2
    capsys.readouterr()
    gated = copy.deepcopy(other)
    gated["arms"] = [arm for arm in gated["arms"] if arm["arm"] == "gated"]
    gated["git"]["commit"] = "e" * 40
    plain = copy.deepcopy(other)
    plain["arms"] = [arm for arm in plain["arms"] if arm["arm"] == "reference"]
    halves = [_write(tmp_path / "plain.json", plain), _write(tmp_path / "gated.json", gated)]
    assert main([*check, *halves, "--expect-commit", "any"]) == 2
    assert "were trained from 2 commits (eeeeeeeeeeee, ffffffffffff)" in capsys.readouterr().err
    assert main([*check, elsewhere, "--expect-commit", "main~1"]) == 2
    assert "--expect-commit 'main~1': expected HEAD, any, or a commit" in capsys.readouterr().err


def test_reading_a_record_imports_nothing_it_names(tmp_path, record, monkeypatch):
    """A record naming a module (its config's plugins, its environment's extensions) is read without importing
    it; a figure the table does not know is kept unread when the record names an extension this process lacks,
    and refused when it names none."""
    import sys

    from stability.record import RecordError, validate_record

    marker = tmp_path / "imported"
    (tmp_path / "planted_marker.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    named = copy.deepcopy(record)
    named["config"]["plugins"] = ["planted_marker"]
    named["env"]["extensions"] = [{"name": "x", "spec": "sys:exit", "source": "entry point", "version": None}]
    for arm in named["arms"]:
        arm["final"]["planted_figure"] = 1.0
    assert validate_record(named, "record") is named
    assert not marker.exists() and "planted_marker" not in sys.modules
    made = baselines.make_baseline(with_replicates(named))        # the extension's figure is not in it
    assert "planted_figure" not in made["cases"]["smoke/standard"]["arms"]["gated"]["figures"]
    assert reg.check([named], made).exit_code == 0 and not marker.exists()
    plain = copy.deepcopy(record)
    for arm in plain["arms"]:
        arm["final"]["planted_figure"] = 1.0
    with pytest.raises(RecordError, match="planted_figure is not"):
        validate_record(plain, "record")


def test_baseline_compare_names_what_moved_in_units_of_the_replicate_noise(tmp_path, record, capsys):
    """`stability baseline compare OLD NEW`: a baseline made on code whose gated arm's M-Act tripled, against
    the one before it, names that figure of that arm (primary rows first) with its move in replicate noise;
    the same against itself, or against a job of unchanged records, moves nothing."""
    old = tmp_path / "old.json"
    new = tmp_path / "new.json"
    baselines.write_baseline(baselines.make_baseline(with_replicates(record)), old)
    worse = edited(record, "gated", "m_act_max", factor=3.0)
    baselines.write_baseline(baselines.make_baseline(with_replicates(worse)), new)
    assert main(["baseline", "compare", str(old), str(new)]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.splitlines()[3:]]
    assert ["smoke/standard", "gated", "m_act_max", "primary"] == lines[0][:4], out
    assert float(lines[0][8]) > 3 and all(line[1] != "reference" for line in lines), out
    assert main(["baseline", "compare", str(old), str(old)]) == 0
    assert " 0 of " in capsys.readouterr().out
    job = _write(tmp_path / "job.json", record)
    assert main(["baseline", "compare", str(old), job]) == 0
    assert " 0 of " in capsys.readouterr().out
    assert main(["baseline", "compare", str(tmp_path / "missing.json"), job]) == 2


def test_a_baseline_remade_case_by_case_keeps_the_other_cases_and_shows_what_moved(tmp_path, record, capsys):
    """`stability baseline update --cases standard` (what `baseline make --cases` ends with) replaces the
    standard case of the baseline at --out with the new runs' and keeps every other case as it was (each case
    names the commit that trained it), calibrates the whole again and prints what moved from the baseline
    before; runs of another case than the ones named, or no baseline at --out, are refused."""
    ramp = copy.deepcopy(record)
    ramp.update(case_label="lr_ramp", case="lr_ramp", id="ramp0")
    out = tmp_path / "b.json"
    both = [_write(tmp_path / f"{i}.json", r) for i, r in enumerate(with_replicates(record) + with_replicates(ramp))]
    assert main(["baseline", "update", *both, "--out", str(out)]) == 0
    before = baseline_schema.load_baseline(out)
    assert sorted(before["cases"]) == ["smoke/lr_ramp", "smoke/standard"]
    changed = edited(record, "gated", "m_act_max", factor=3.0)
    changed["git"]["commit"] = "c" * 40
    remade = [_write(tmp_path / f"new{i}.json", r) for i, r in enumerate(with_replicates(changed))]
    capsys.readouterr()
    assert main(["baseline", "update", *remade, "--out", str(out), "--cases", "standard"]) == 0
    out_text = capsys.readouterr().out
    assert "(cases standard remade; the others kept)" in out_text and "125 arrangements" in out_text
    moved = out_text[out_text.index("what moved from the baseline before"):].splitlines()
    assert moved[3].split()[:4] == ["smoke/standard", "gated", "m_act_max", "primary"], moved
    after = baseline_schema.load_baseline(out)
    assert after["cases"]["smoke/lr_ramp"]["arms"] == before["cases"]["smoke/lr_ramp"]["arms"]
    assert after["cases"]["smoke/lr_ramp"]["commit"] == before["commit"]
    assert after["cases"]["smoke/standard"]["commit"] == after["commit"] == "c" * 40
    assert after["cases_remade"] == ["standard"] and after["calibration"]["arrangements"] == 125
    assert main(["baseline", "update", *remade, "--out", str(out), "--cases", "lr_ramp"]) == 2
    assert "expected exactly ['lr_ramp']" in capsys.readouterr().err
    assert main(["baseline", "update", *remade, "--out", str(tmp_path / "none.json"), "--cases", "standard"]) == 2
    assert "make it whole first" in capsys.readouterr().err


def test_the_first_token_share_is_primary_where_a_sink_forms_and_advisory_at_smoke_saying_why():
    """F-Attn is a primary row at ci (a sink forms there) and advisory at smoke, where the check notes why."""
    for preset, tier in (("smoke", "advisory"), ("ci", "primary")):
        record = pair_record(preset=preset)
        result = reg.check([record], baselines.make_baseline(with_replicates(record)))
        assert {r.tier for r in result.rows if r.figure == "f_attn_mean" and "-" not in r.arm} == {tier}
        said = [n for n in result.notes if "standard f_attn_mean is advisory at smoke" in n]
        assert bool(said) == (preset == "smoke") and all("no attention sink forms" in n for n in said)


# ----------------------------------------------------------------------------- a change of settings, judged

def _with_config(record: dict, section: str, field: str, value) -> dict:
    changed = copy.deepcopy(record)
    changed["config"]["run"][section][field] = value
    return changed


def test_a_changed_setting_is_judged_and_the_job_is_changed_naming_it(record, baseline):
    """AdamW's beta2 0.95 -> 0.999 in the job: the rows and outcomes are judged as usual, the setting is named
    with both values, and the job is CHANGED (exit 3), never refused; a regression beside it makes it REGRESSED,
    the setting still listed; a changed model width makes the runs other runs: exit 2 naming the field."""
    betas = _with_config(record, "optim", "betas", [0.9, 0.999])
    result = reg.check([betas], baseline)
    assert result.exit_code == 3 and result.verdict == "CHANGED" and not result.errors
    assert len(result.settings) == 1 and "run.optim.betas: baseline [0.9, 0.95], job [0.9, 0.999]" in result.settings[0]
    assert any(line.startswith("changed: case smoke/standard: 1 setting(s) differ") for line in result.failure_lines())
    assert result.judged > 0 and all(row.p is not None for row in result.primary)
    worse = reg.check([edited(betas, "gated", "heldout_loss", add=0.3)], baseline)
    assert worse.exit_code == 1 and worse.settings and _row(worse, "gated", "heldout_loss").verdict == "regressed"
    wider = reg.check([_with_config(record, "model", "d_model", 128)], baseline)
    assert wider.exit_code == 2 and not wider.rows and "run.model.d_model: baseline 64, job 128" in wider.errors[0]
    assert "cannot be compared" in wider.errors[0]


def test_the_check_states_one_rate_for_the_job_and_what_it_rests_on(record, baseline):
    """With the baseline's null jobs recorded, the job's false-alarm rate is their 95% upper bound (0 of 150:
    1.98%), printed with the rows' Holm, the outcome cells and the invariants it covers; without, it says the
    rate was not measured."""
    measured = {**baseline, "null_jobs": cal.null_job_evidence(150, 0, "abc", list(range(20, 170)), 31.0)}
    result = reg.check([record], measured)
    assert result.rate() == pytest.approx(0.0198, abs=1e-4) and result.to_dict()["rate"] == result.rate()
    lines = result.rate_lines()
    assert lines[0].startswith("false-alarm rate of this job (rows, outcomes and invariants together): at most 2.0% "
                               "at 95% confidence: 0 of 150 null jobs failed")
    assert f"by Holm over {result.hypotheses} hypotheses" in lines[1]
    cells, runs = result.clean_cells
    assert cells > 0 and runs == 5 * cells and f"outcomes: {cells} cells" in lines[2]
    assert lines[0] in result.table() and reg.check([record], baseline).rate() is None
    with pytest.raises(RecordError, match="null_jobs.failed = 151 is more than"):
        baseline_schema.validate_baseline({**measured, "null_jobs": {**measured["null_jobs"], "failed": 151}}, "b")


def test_the_ladders_mxfp4_gap_mode_in_one_seed_is_no_change_the_same_move_in_every_seed_is(monkeypatch):
    """The kept null job of replicate 39 (reports/null/smoke) holds the second mode of the precision ladder's
    reference mxfp4 loss gap (seed 1, 11 to 13 standard deviations from the baseline's replicates) that made it
    fail as CHANGED when a change was judged on the mean over seeds: the row is judged both ways, and the job
    passes the committed baseline (one seed moved); that move made in every seed of either arm is CHANGED."""
    from stability.check.baseline_schema import load_baseline
    from validation import null_jobs
    from validation import regression_zoo as zoo

    monkeypatch.setattr(zoo, "KEPT", null_jobs.ROOT / "reports" / "null")   # where the null jobs are kept
    job = zoo.read_kept("smoke", null_jobs.kept_name(39))
    made = load_baseline(str(null_jobs.ROOT / "reports" / "baselines" / "smoke-cpu.json"))
    ladder = next(r for r in job["records"] if r["case"] == "precision_ladder")
    base = made["cases"]["smoke/precision_ladder"]["arms"]
    seed1_runs = list(base["reference"]["figures"]["loss_gap_mxfp4"]["1"].values())
    seed1 = next(a for a in ladder["arms"] if a["seed"] == 1 and a["arm"] == "reference")
    move = seed1["final"]["loss_gap_mxfp4"] - sum(seed1_runs) / len(seed1_runs)
    assert move > 10 * statistics.stdev(seed1_runs)   # the mode: beyond ten of that seed's replicate SDs

    def the_row(result, arm: str):
        return next(r for r in result.rows if r.case_key == "smoke/precision_ladder" and r.arm == arm
                    and r.figure == "loss_gap_mxfp4")

    as_run = reg.check(job["records"], made, invariants=job["invariants"])
    row = the_row(as_run, "reference")
    assert not row.floor_only and row.verdict == "ok" and as_run.exit_code == 0

    def moved_in_every_seed(arm: str) -> list[dict]:
        moved = copy.deepcopy(job["records"])
        for entry in next(r for r in moved if r["case"] == "precision_ladder")["arms"]:
            if entry["arm"] == arm:
                runs = base[arm]["figures"]["loss_gap_mxfp4"][str(entry["seed"])].values()
                entry["final"]["loss_gap_mxfp4"] = sum(runs) / len(runs) + move
        return moved

    for arm in ("reference", "gated"):
        every = reg.check(moved_in_every_seed(arm), made, invariants=job["invariants"])
        assert the_row(every, arm).verdict == "changed" and every.exit_code == 3


def test_one_seeds_tail_in_a_kept_null_job_is_not_a_change_a_move_of_every_seed_is(monkeypatch):
    """The kept null job of replicate 153 (reports/null/smoke) failed as CHANGED under the mean over seeds: the
    batch ramp's gated ``m_act_max`` of seed 0 alone 5.4 replicate standard deviations out, seeds 1 and 2 inside
    their noise. A change asks every seed to move (``stability.check.rows.every_seed_moved``): the job passes
    the committed baseline; seed 0's move given to every seed makes the row CHANGED (exit 3)."""
    from stability.check.baseline_schema import load_baseline
    from validation import null_jobs
    from validation import regression_zoo as zoo

    monkeypatch.setattr(zoo, "KEPT", null_jobs.ROOT / "reports" / "null")
    job = zoo.read_kept("smoke", null_jobs.kept_name(153))
    made = load_baseline(str(null_jobs.ROOT / "reports" / "baselines" / "smoke-cpu.json"))
    runs = made["cases"]["smoke/batch_ramp-sqrt"]["arms"]["gated"]["figures"]["m_act_max"]
    mean = {seed: sum(values.values()) / len(values) for seed, values in runs.items()}
    sd = {seed: statistics.stdev(values.values()) for seed, values in runs.items()}
    ramp = next(r for r in job["records"] if r["case"] == "batch_ramp")
    gated = {str(a["seed"]): a for a in ramp["arms"] if a["arm"] == "gated"}
    out = {seed: (gated[seed]["final"]["m_act_max"] - mean[seed]) / sd[seed] for seed in mean}
    assert out["0"] > 5 and abs(out["1"]) < 3 and abs(out["2"]) < 3

    as_run = reg.check(job["records"], made, invariants=job["invariants"])
    row = next(r for r in as_run.rows if r.case_key == "smoke/batch_ramp-sqrt" and r.arm == "gated"
               and r.figure == "m_act_max")
    assert as_run.exit_code == 0 and row.verdict == "ok" and row.p_change > 0.01

    moved = copy.deepcopy(job["records"])
    move = gated["0"]["final"]["m_act_max"] - mean["0"]
    for entry in next(r for r in moved if r["case"] == "batch_ramp")["arms"]:
        if entry["arm"] == "gated":
            entry["final"]["m_act_max"] = mean[str(entry["seed"])] + move
    every = reg.check(moved, made, invariants=job["invariants"])
    row = next(r for r in every.rows if r.case_key == "smoke/batch_ramp-sqrt" and r.arm == "gated"
               and r.figure == "m_act_max")
    assert every.exit_code == 3 and row.verdict == "changed"
