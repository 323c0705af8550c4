"""The trainer: learning, determinism, divergence as a result, fault detection, the record."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from stability.cases.standard import run_pair
from stability.config import (
    DataConfig,
    ExperimentConfig,
    FaultConfig,
    GateConfig,
    ModelConfig,
    OptimConfig,
    ProbeConfig,
    RunConfig,
    resolve,
)
from stability.data import get_batch, load_corpus
from stability.record import Status, paired_summary
from stability.train.trainer import ArmHooks, train

TINY = RunConfig(
    model=ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, context=32),
    data=DataConfig(batch_size=4, builtin_bytes=100_000),
    optim=OptimConfig(lr=3e-3, warmup_steps=5),
    probes=ProbeConfig(every=10, spike_window=20, spike_min_history=5, diverge_patience=10, eval_batches=2),
    steps=30,
)


def test_loss_falls_and_the_record_is_complete():
    record = train(TINY, arm="reference")
    series = record["series"]
    assert record["status"] == Status.COMPLETED and record["diverged_at_step"] is None
    assert len(series["loss"]) == TINY.steps == len(series["grad_norm"]) == len(series["lr"])
    assert series["loss"][-1] < series["loss"][0] - 0.5
    assert len(series["layer_grad_norm"][0]) == len(record["layer_names"]) == TINY.model.n_layers + 2
    final = record["final"]
    assert final["heldout_loss"] < series["loss"][0]
    assert final["perplexity"] == pytest.approx(math.exp(final["heldout_loss"]))
    assert 0 < final["accuracy"] < 1
    assert [p["step"] for p in record["probes"]] == [0, 10, 20, 29]
    assert record["timing"]["tokens"] == TINY.steps * 4 * 32 and record["timing"]["tokens_per_second"] > 0


def test_same_config_and_seed_give_the_same_figures():
    first, second = train(TINY), train(TINY)
    assert first["series"]["loss"] == second["series"]["loss"]
    assert first["final"]["heldout_loss"] == second["final"]["heldout_loss"]
    other = train(replace(TINY, seed=1))
    assert other["series"]["loss"] != first["series"]["loss"]


def test_an_exploding_run_is_recorded_as_diverged_not_raised():
    exploding = replace(TINY, optim=replace(TINY.optim, lr=50.0, warmup_steps=0, grad_clip=0.0), steps=60)
    record = train(exploding)
    assert record["status"] == Status.DIVERGED
    step = record["diverged_at_step"]
    assert step is not None and step < 59 and len(record["series"]["loss"]) == step + 1
    assert record["stop_reason"]


def test_a_nan_injected_into_a_layer_is_found_at_its_step_and_layer():
    faulty = replace(TINY, fault=FaultConfig(kind="nan", step=12, layer=1))
    record = train(faulty)
    assert record["status"] == Status.DIVERGED and record["diverged_at_step"] == 12
    event = record["events"][0]
    assert (event["step"], event["what"], event["module"], event["layer"]) == (12, "activation", "blocks.1", 1)
    assert record["series"]["nonfinite"][:12] == [""] * 12


def test_a_sustained_rise_above_the_initial_loss_counts_as_divergence():
    run = replace(TINY, probes=replace(TINY.probes, diverge_factor=0.01, diverge_patience=3))
    record = train(run)
    assert record["status"] == Status.DIVERGED and record["diverged_at_step"] == 2  # steps 0, 1, 2
    assert "consecutive" in record["stop_reason"]


def test_ctrl_c_keeps_the_steps_so_far(monkeypatch):
    def interrupt(step, figures):
        if step == 4:
            raise KeyboardInterrupt
    record = train(TINY, hooks=ArmHooks(on_step=interrupt))
    assert record["status"] == Status.KILLED and len(record["series"]["loss"]) == 5


def test_both_arms_of_a_pair_read_identical_batches():
    corpus = load_corpus(TINY.data, TINY.model.vocab_size, TINY.model.context)
    config = ExperimentConfig(run=TINY)
    for step in (0, 7):
        batches = [get_batch(corpus, "train", step, 4, 32, config.arm_config(arm, 3).seed)
                   for arm in config.arm_names]
        assert all((a == b).all() for a, b in zip(*batches))


def test_a_pair_record_holds_both_arms_per_seed_and_paired_figures():
    config = ExperimentConfig(run=replace(TINY, steps=12), seeds=(0, 1))
    record = run_pair(config)
    assert [(a["arm"], a["seed"]) for a in record["arms"]] == [("reference", 0), ("gated", 0),
                                                              ("reference", 1), ("gated", 1)]
    assert record["arms"][1]["variant"] == "G1-elementwise" and record["arms"][1]["gate_parameters"] > 0
    loss = record["paired"]["gated"]["heldout_loss"]
    assert loss["n"] == 2 and loss["seeds"] == [0, 1]
    assert loss["difference"] == pytest.approx(loss["treatment"] - loss["reference"])
    assert loss["ci_low"] <= loss["difference"] <= loss["ci_high"]
    assert record["status"] == Status.COMPLETED and record["schema_version"] == 4


def test_paired_summary_drops_a_seed_missing_an_arm():
    arms = [{"arm": "reference", "seed": 0, "status": Status.COMPLETED, "final": {"heldout_loss": 2.0}},
            {"arm": "gated", "seed": 0, "status": Status.COMPLETED, "final": {"heldout_loss": 1.5}},
            {"arm": "reference", "seed": 1, "status": Status.COMPLETED, "final": {"heldout_loss": 9.0}}]
    summary = paired_summary(arms)["gated"]["heldout_loss"]
    assert summary["n"] == 1 and summary["difference"] == -0.5 and summary["ci_low"] is None


def test_gated_smoke_preset_uses_the_papers_g1_gate():
    config = resolve("smoke")
    assert config.arm_config("gated", 0).model.gate == GateConfig(position="G1")
    assert config.arm_config("reference", 0).model.gate.position == "none"


def test_paired_summary_leaves_out_evaluation_figures_of_an_arm_that_diverged():
    arms = [{"arm": "reference", "seed": s, "status": Status.COMPLETED, "final": {"heldout_loss": 2.0, "diverged": False}}
            for s in (0, 1)]
    arms += [{"arm": "gated", "seed": 0, "status": Status.COMPLETED, "final": {"heldout_loss": 1.5, "diverged": False}},
             {"arm": "gated", "seed": 1, "status": Status.DIVERGED, "final": {"heldout_loss": 1e9, "diverged": True}}]
    paired = paired_summary(arms)["gated"]
    assert paired["heldout_loss"]["n"] == 1 and paired["heldout_loss"]["difference"] == -0.5
    assert paired["diverged"]["n"] == 2 and paired["diverged"]["difference"] == 0.5   # a trajectory figure
