"""N arms in one experiment: the arm syntax and its errors, the stabilizers, every consumer of a record
(paired table, regression check, report) with more than two arms. Training here is tiny (seconds)."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from _stability_records import edited, pair_record, with_replicates

from stability import config as cfg
from stability.cases.standard import run_pair
from stability.cases.stress import cpu_threads
from stability.check import regression as reg
from stability.check.baseline import make_baseline
from stability.check.claims import claim_rows, claims_table
from stability.config import ConfigError, ExperimentConfig, from_dict, resolve, to_dict
from stability.model.lm import GatedLM, z_loss
from stability.record import figures as fig
from stability.report import html as report
from stability.train.trainer import train

TINY = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 16,
        "data.batch_size": 4, "data.builtin_bytes": 20_000, "probes.every": 5, "probes.eval_batches": 1,
        "probes.probe_batch_size": 2, "steps": 6, "seeds": "0"}


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread, as the stress cases use: tiny models gain nothing from more."""
    with cpu_threads(1):
        yield


# ----------------------------------------------------------------------------- the syntax

def test_two_arms_stay_the_default_and_a_set_selects_the_papers_controls():
    assert resolve("smoke").arm_names == ("reference", "gated")
    controls = resolve("ci", {"arms": "controls"})
    assert controls.arm_names == ("reference", "gated", "gated_headwise", "gated_floored", "gated_value")
    gates = [controls.arm_config(name, 0).model.gate for name in controls.arm_names]
    assert [g.position for g in gates] == ["none", "G1", "G1", "G1", "G2"]
    assert gates[2].granularity == "headwise" and gates[3].floor == 0.5 and gates[1].floor == 0.0


def test_arms_share_everything_but_their_own_fields():
    config = resolve("smoke", {"arms": "gated,qk_norm,z_loss,softcap,gated_floored", "optim.lr": "0.01"})
    runs = {name: config.arm_config(name, 7) for name in config.arm_names}
    assert {run.seed for run in runs.values()} == {7} and {run.optim.lr for run in runs.values()} == {0.01}
    assert runs["qk_norm"].model.qk_norm and not runs["reference"].model.qk_norm
    assert runs["z_loss"].optim.z_loss == cfg.Z_LOSS and runs["reference"].optim.z_loss == 0.0
    assert runs["softcap"].model.attn_softcap == cfg.SOFTCAP
    shared = replace(runs["softcap"], model=replace(runs["softcap"].model, attn_softcap=0.0))
    assert shared == runs["reference"]   # the soft-cap arm differs from the baseline by the cap alone


def test_an_arm_keeps_the_shared_stabilizers_it_does_not_set():
    config = resolve("smoke", {"model.qk_norm": "true", "arms": "gated,z_loss"})
    assert all(config.arm_config(name, 0).model.qk_norm for name in config.arm_names)
    assert config.arm_config("z_loss", 0).variant == "ungated+qk_norm+z_loss0.0001"


def test_a_custom_arm_is_defined_field_by_field_and_round_trips():
    config = resolve("smoke", {"arms": "gated,mine", "arms.mine.gate.position": "G3", "arms.mine.z_loss": "1e-3",
                               "arms.gated.gate.granularity": "headwise"})
    assert config.arm_names == ("reference", "gated", "mine")
    assert config.arm("mine").gate.position == "G3" and config.arm("mine").z_loss == 1e-3
    assert config.arm("gated").gate.granularity == "headwise"
    assert from_dict(ExperimentConfig, to_dict(config)) == config
    flat = cfg.flatten(to_dict(config))
    assert flat["arms"] == "reference,gated,mine" and flat["arms.mine.gate.position"] == "G3"
    again = resolve("smoke", {k: v for k, v in flat.items() if k.startswith("arms")})  # a dumped config reloads
    assert again.arms == config.arms


def test_the_old_gate_fields_still_reach_the_arms():
    config = resolve("smoke", {"gated_gate.position": "G2", "baseline_gate.position": "G1"})
    assert config.arm("gated").gate.position == "G2" and config.arm("reference").gate.position == "G1"


def test_arms_from_a_toml_file(tmp_path):
    """A list of names, tables that define arms, or an array of tables that does both."""
    names, tables, array = tmp_path / "names.toml", tmp_path / "tables.toml", tmp_path / "array.toml"
    names.write_text('arms = "controls"\n')
    tables.write_text('[arms.capped]\nattn_softcap = 20.0\n[arms.capped.gate]\nposition = "G1"\n')
    array.write_text('[[arms]]\nname = "gated_floored"\n[[arms]]\nname = "capped"\nattn_softcap = 20.0\n'
                     'gate = {position = "G1"}\n')
    assert len(resolve("smoke", cfg.load_overrides(names)).arm_names) == 5
    assert resolve("smoke", cfg.load_overrides(tables)).arm_names == ("reference", "gated", "capped")
    config = resolve("smoke", cfg.load_overrides(array))
    assert config.arm_names == ("reference", "gated_floored", "capped")
    assert config.arm_config("capped", 0).model.attn_softcap == 20.0
    assert config.arm_config("capped", 0).model.gate.position == "G1"


@pytest.mark.parametrize("overrides, message", [
    ({"arms": "gated,gated_floored,gated"}, "'gated' used twice"),
    ({"arms": "controls,gated_value"}, "'gated_value' used twice"),
    ({"arms": "gated,bogus"}, "'bogus' is not a named arm"),
    ({"model.source": "hf", "arms": "softcap"}, "model.attn_softcap=50.0 is invalid: expected 0 unless the model is"),
    ({"model.family": "gpt2", "extrapolation.factors": "2"}, "extrapolation.factors=(2.0,) is invalid: expected ()"),
    ({"arms.gated.bogus": "1"}, "'arms.gated.bogus' is not a config field"),
    ({"arms.gated.gate.flor": "0.5"}, "'arms.gated.gate.flor' is not a config field"),
    ({"arms.gated.name": "other"}, "'arms.gated.name' is not settable"),
    ({"arms.bad-name.z_loss": "1"}, "arm name='bad-name' is invalid"),
    ({"arms.z_loss.z_loss": "-1"}, "arms.z_loss.z_loss=-1.0 is invalid: expected a positive finite coefficient"),
    ({"arms.z_loss.z_loss": "inf"}, "arms.z_loss.z_loss=inf is invalid"),
    ({"arms.z_loss.z_loss": "nan"}, "arms.z_loss.z_loss=nan is invalid"),
    ({"arms.z_loss.z_loss": "abc"}, "arms.z_loss.z_loss='abc' is invalid: expected a number"),
    ({"optim.z_loss": "-0.5"}, "optim.z_loss=-0.5 is invalid"),
    ({"arms.softcap.attn_softcap": "-5"}, "arms.softcap.attn_softcap=-5.0 is invalid: expected a positive finite cap"),
    ({"model.attn_softcap": "inf"}, "model.attn_softcap=inf is invalid"),
    ({"arms": "softcap", "model.backend": "triton"}, "arm 'softcap': model.attn_softcap=50.0 is invalid"),
    ({"arms.gated.gate.floor": "1.0"}, "gate.floor=1.0 is invalid: expected a number in [0, 1)"),
    ({"arms.gated.gate.floor": "0.5", "arms.gated.gate.activation": "silu"}, "gate.floor=0.5 is invalid"),
    ({"arms": "qk_norm", "model.qk_norm": "true"}, "arms.qk_norm is invalid: it trains the same run as the reference arm"),
    ({"model.gate.position": "G1"}, "'run.model.gate.position' is not settable"),
    ({"extrapolation.factors": "0.5,2"}, "extrapolation.factors=(0.5, 2.0) is invalid: expected factors >= 1"),
    ({"extrapolation.factors": "2,2"}, "distinct factors"),
    ({"extrapolation.scaling": "yarn"}, "extrapolation.scaling='yarn' is invalid"),
])
def test_bad_arms_and_stabilizer_values_name_the_value(overrides, message):
    with pytest.raises(ConfigError) as error:
        resolve("smoke", overrides)
    assert message in str(error.value)


# ----------------------------------------------------------------------------- the stabilizers

def test_z_loss_is_the_mean_squared_log_partition():
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0)) * 5
    expected = torch.stack([torch.log(torch.exp(row).sum()) ** 2 for row in logits.reshape(-1, 11)]).mean()
    assert z_loss(logits).item() == pytest.approx(expected.item(), rel=1e-5)


def test_z_loss_trains_the_log_partition_down_but_the_logged_loss_stays_cross_entropy():
    """Same seed, same batches: step 0 logs the same loss (cross-entropy only); with a strong z-loss the
    LM head's mean log Z ends much nearer 0 than without it."""
    config = resolve("smoke", {**TINY, "steps": 30, "optim.lr": "0.01", "probes.every": 100})
    plain = train(config.arm_config("reference", 0))
    penalised = train(replace(config.arm_config("reference", 0),
                              optim=replace(config.run.optim, lr=0.01, z_loss=0.1)))
    assert plain["series"]["loss"][0] == penalised["series"]["loss"][0]
    assert plain["series"]["loss"][1] != penalised["series"]["loss"][1]
    assert abs(penalised["final"]["log_z_mean"]) < 0.7 * abs(plain["final"]["log_z_mean"]), (
        penalised["final"]["log_z_mean"], plain["final"]["log_z_mean"])
    assert penalised["variant"] == "ungated+z_loss0.1"


def test_arms_of_a_seed_start_from_the_same_shared_parameters():
    config = resolve("smoke", {**TINY, "arms": "controls,qk_norm,softcap"})
    models = {name: GatedLM(config.arm_config(name, 3).model, seed=3).state_dict() for name in config.arm_names}
    base = models["reference"]
    for name, state in models.items():
        shared = set(state) & set(base)
        assert shared and all(torch.equal(state[key], base[key]) for key in shared), name


# ----------------------------------------------------------------------------- N arms through the pipeline

def test_run_pair_trains_every_arm_per_seed_and_pairs_each_with_the_baseline():
    config = resolve("smoke", {**TINY, "seeds": "0,1", "arms": "gated,gated_floored,z_loss"})
    record = run_pair(config)
    assert [(a["arm"], a["seed"]) for a in record["arms"]] == [
        (arm, seed) for seed in (0, 1) for arm in ("reference", "gated", "gated_floored", "z_loss")]
    assert list(record["paired"]) == ["gated", "gated_floored", "z_loss"]
    for arm, table in record["paired"].items():
        loss = table["heldout_loss"]
        assert loss["n"] == 2 and loss["difference"] == pytest.approx(loss["treatment"] - loss["reference"]), arm
    variants = {a["arm"]: a["variant"] for a in record["arms"]}
    assert variants["gated_floored"] == "G1-elementwise-floor0.5" and variants["z_loss"] == "ungated+z_loss0.0001"
    scores = [a["final"]["gate_score_mean"] for a in record["arms"] if a["arm"] == "gated_floored"]
    assert all(0.5 <= s < 1.0 for s in scores)   # the floored gate never closes below one half


@pytest.fixture
def three_arms():
    return pair_record(arms="gated,gated_floored")


def test_the_check_judges_every_arm_and_its_paired_difference(three_arms):
    baseline = make_baseline(with_replicates(three_arms))
    result = reg.check([three_arms], baseline)
    assert result.exit_code == 0, result.table()
    assert {row.arm for row in result.rows} >= {"reference", "gated", "gated_floored", "gated-reference",
                                                "gated_floored-reference"}
    worse = edited(three_arms, "gated_floored", "m_act_max", factor=3.0)   # only the third arm regresses
    result = reg.check([worse], baseline)
    regressed = {(row.arm, row.figure) for row in result.regressed}
    assert ("gated_floored-reference", "m_act_max") in regressed
    assert not any(arm.startswith("gated-") or arm == "gated" for arm, _ in regressed)


def test_a_control_is_claimed_against_another_arm_and_may_claim_a_worse_figure(three_arms):
    """The floored gate against the gate: a claim that the floor takes the M-Act reduction back."""
    record = three_arms
    for arm in record["arms"]:
        if arm["arm"] == "gated_floored":
            arm["final"]["m_act_mean"] = arm["final"]["m_act_mean"] * 2 + arm["seed"]
    rows = claim_rows(record, ["m_act_mean", "heldout_loss"], arm="gated_floored", reference="gated", expect="worse")
    m_act = rows[0]
    assert m_act["against"] == "gated" and m_act["holds"] is True and m_act["ci_low"] > 0
    assert m_act["reference"] == pytest.approx(sum(a["final"]["m_act_mean"] for a in record["arms"]
                                                  if a["arm"] == "gated") / 3)
    as_better = claim_rows(record, ["m_act_mean"], arm="gated_floored", reference="gated")[0]
    assert as_better["holds"] is False   # the same interval read as "the floor helps" fails
    assert "gated_floored-gated" in claims_table(rows, arm="gated_floored", reference="gated")


def test_a_baseline_of_other_arms_is_a_config_difference_naming_the_arms(three_arms):
    baseline = make_baseline(with_replicates(pair_record()))
    result = reg.check([three_arms], baseline)
    assert result.exit_code == 2 and "runs cannot be compared" in result.errors[0] and "arms:" in result.errors[0]


def _extrapolation_points(record: dict) -> dict:
    for arm in record["arms"]:
        slope = 0.1 if arm["arm"] == "reference" else 0.04
        arm["extrapolation"] = {"scaling": "ntk", "factors": [1.0, 2.0, 4.0], "points": [
            {"factor": f, "length": int(64 * f), "rope": rope, "theta": 1e4, "heldout_loss": 3.0 + slope * f,
             "f_attn": 0.1 * f, "sink_rate": 0.0} for f in (1.0, 2.0, 4.0) for rope in ("plain", "ntk")
            if not (rope == "ntk" and f == 1.0)]}
        arm["final"]["extrap_gap_plain_x4"] = 3 * slope
    return record


def test_the_report_has_a_per_arm_table_and_the_extrapolation_curves(three_arms, tmp_path):
    record = _extrapolation_points(edited(three_arms, "gated", "m_act_mean"))
    rows = report.per_arm_rows(record)
    assert [row[0] for row in rows[1:]] == ["reference", "gated", "gated_floored"]
    column = rows[0].index("extrap_gap_plain_x4")
    assert float(rows[1][column]) == pytest.approx(0.3) and float(rows[3][column]) == pytest.approx(0.12)
    assert "heldout_loss" in rows[0] and "logit_max" not in rows[0]       # the columns the table marks headline
    curves = report.extrapolation_curves(record)
    assert [p[0] for p in curves["gated"]["ntk"]] == [1.0, 2.0, 4.0]    # NTK starts from the plain 1x point
    paths = report.write_report([record], tmp_path / "r.html")
    text = paths["html"].read_text()
    assert "Per arm (means over seeds)" in text and "id='plot-0-extrapolation'" in text
    assert "gated_floored" in paths["markdown"].read_text()
    assert len({report.arm_color(name, record) for name in ("reference", "gated", "gated_floored")}) == 3


def test_every_stress_case_runs_more_than_two_arms():
    from stability.cases.stress import CASES, run_case

    config = resolve("smoke", {**TINY, "steps": 4, "arms": "gated,qk_norm", "stress.sweep_lrs": "0.001,0.01",
                               "stress.precisions": "fp32,bf16", "stress.ladder_steps": 2, "stress.shock.at_step": 2,
                               "stress.batch.double_every": 2, "stress.batch.max_size": 8})
    for case in CASES:
        record = run_case(case, config)
        assert [a["arm"] for a in record["arms"]] == ["reference", "gated", "qk_norm"], case
        assert list(record["paired"]) == ["gated", "qk_norm"], case
        assert all(math.isfinite(a["final"]["final_train_loss"]) for a in record["arms"]), case


def test_the_per_arm_columns_are_the_figure_tables_headline_figures_an_extension_adds_one(three_arms, monkeypatch):
    """The report's per-arm columns are derived from the figure table: a figure added with headline=True
    (as an extension adds its probe's figure) becomes a column, in table order; a family's members each one."""
    monkeypatch.setitem(fig.FIGURES, "ext_probe_mean", fig.Figure("ext_probe_mean", None, "nats", "an extension's",
                                                                  headline=True))
    record = copy.deepcopy(three_arms)
    for arm in record["arms"]:
        arm["final"].update(ext_probe_mean=1.5, extrap_gap_plain_x2=0.1, extrap_gap_plain_x4=0.2)
    header = report.per_arm_rows(record)[0]
    assert header[-3:] == ["extrap_gap_plain_x2", "extrap_gap_plain_x4", "ext_probe_mean"]
    assert header.index("heldout_loss") < header.index("m_act_mean") < header.index("extrap_gap_plain_x2")
