"""What proves that a run's stresses and measurements were applied (stability.train.applied): each proof, with
the fault it detects injected, finds it where it happened (which step, which module) and counts it right; on
unchanged code it is clean (0), and the same config and seed give the same proof."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import pytest
import torch

from stability.cases.case import cpu_threads
from stability.config import DataConfig, ModelConfig, OptimConfig, PrecisionConfig, ProbeConfig, RunConfig
from stability.config.schedules import warmup_cosine
from stability.precision import PrecisionPolicy, formats, plain_linears
from stability.record import Status
from stability.train import applied, probes, trainer
from stability.train.trainer import train

# one block: q, k, v, o and the MLP's w_gate, w_up, w_down (7 Linears); k and v are 32 -> 16 (one KV head)
TINY = RunConfig(
    model=ModelConfig(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, context=32),
    data=DataConfig(batch_size=4, builtin_bytes=100_000),
    optim=OptimConfig(lr=3e-3, warmup_steps=2),
    probes=ProbeConfig(every=3, eval_batches=1, probe_batch_size=2),
    steps=8,
)
LINEARS = ["blocks.0.attn.q_proj", "blocks.0.attn.k_proj", "blocks.0.attn.v_proj", "blocks.0.attn.o_proj",
           "blocks.0.mlp.w_gate", "blocks.0.mlp.w_up", "blocks.0.mlp.w_down"]
ATTENTION = LINEARS[:4]
PROOFS = ("lr_off_log_steps", "linear_off_format_calls", "probe_steps_missed", "probe_modules_missed")


@pytest.fixture(autouse=True)
def one_thread():
    with cpu_threads(1):
        yield


def at(dtype: str, **precision) -> RunConfig:
    return replace(TINY, precision=PrecisionConfig(dtype=dtype, **precision))


def proofs(record: dict) -> dict:
    return {name: record["final"][name] for name in PROOFS}


# ----------------------------------------------------------------------------- unchanged code

def test_a_healthy_run_proves_every_stress_applied_and_the_same_seed_proves_it_the_same():
    first, second = train(TINY, arm="reference"), train(TINY, arm="reference")
    assert first["status"] == Status.COMPLETED
    assert proofs(first) == dict.fromkeys(PROOFS, 0) and first["final"]["linear_in_format_share"] == 1.0
    calls = first["applied"]["linear_calls"]
    assert calls == {"runs_in": "float32", "linears": 7, "high_precision": [], "calls": 8 * 7, "in_format": 8 * 7,
                     "off_format": {}}
    assert first["applied"]["lr_off_log"] == [] and first["applied"]["probe_steps_missed"] == []
    assert [snapshot["step"] for snapshot in first["probes"]] == [0, 3, 6, 7]
    assert all(snapshot["hooked"] == ["blocks.0", *LINEARS] for snapshot in first["probes"])
    assert second["applied"] == first["applied"] and proofs(second) == proofs(first)


# ----------------------------------------------------------------------------- the LR the optimiser stepped with

def fault_at(step: int, fault, monkeypatch) -> None:
    """The optimiser step of ``step`` goes through ``fault(original, policy, optimizer, grads_finite)`` instead of
    ``PrecisionPolicy.step``."""
    original, calls = PrecisionPolicy.step, []

    def step_with(self, optimizer, grads_finite):
        calls.append(None)
        if len(calls) - 1 == step:
            return fault(original, self, optimizer, grads_finite)
        return original(self, optimizer, grads_finite)
    monkeypatch.setattr(PrecisionPolicy, "step", step_with)


def twice_the_lr(original, policy, optimizer, grads_finite):
    """The fault: the optimiser's LR doubled for one update, undone right after it."""
    logged = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] *= 2
    try:
        return original(policy, optimizer, grads_finite)
    finally:
        for group, lr in zip(optimizer.param_groups, logged):
            group["lr"] = lr


def test_an_lr_changed_for_one_update_and_restored_is_found_at_its_step(monkeypatch):
    fault_at(5, twice_the_lr, monkeypatch)
    record = train(TINY, arm="reference")
    logged = warmup_cosine(5, TINY)
    assert record["series"]["lr"][5] == logged   # the log says nothing
    assert record["final"]["lr_off_log_steps"] == 1
    assert record["applied"]["lr_off_log"] == [{"step": 5, "logged": logged, "stepped": [2 * logged, 2 * logged]}]
    assert proofs(record) == {**dict.fromkeys(PROOFS, 0), "lr_off_log_steps": 1}


def test_a_step_the_policy_says_it_took_without_the_optimiser_is_found(monkeypatch):
    fault_at(4, lambda original, policy, optimizer, grads_finite: True, monkeypatch)
    record = train(TINY, arm="reference")
    assert record["final"]["lr_off_log_steps"] == 1
    assert record["applied"]["lr_off_log"] == [{"step": 4, "logged": warmup_cosine(4, TINY), "stepped": None}]


def test_an_fp16_step_the_loss_scaler_skipped_is_not_counted():
    """2^30 overflows fp16's gradients at first: GradScaler skips those steps (the optimiser never steps, and
    the LR it did not step with is not an LR off the log)."""
    record = train(replace(at("fp16", init_loss_scale=2.0 ** 30), steps=6), arm="reference")
    assert record["series"]["skipped"][0] and record["final"]["skipped_steps"] > 0
    assert record["final"]["lr_off_log_steps"] == 0 and record["applied"]["lr_off_log"] == []


def test_lr_off_log_compares_exactly_and_needs_a_step_taken():
    assert not applied.lr_off_log(0.1, [0.1, 0.1], True)
    assert applied.lr_off_log(0.1, [0.1, math.nextafter(0.1, 1.0)], True)   # one ulp off is off
    assert not applied.lr_off_log(0.1, None, False)                    # skipped: nothing stepped
    assert applied.lr_off_log(0.1, None, True)                         # said it stepped, never did
    assert applied.lr_off_log(0.1, [0.2], False)                       # said it skipped, stepped


# ----------------------------------------------------------------------------- every Linear in the run's format

def test_bf16_trained_in_fp32_is_found_and_every_linear_named(monkeypatch):
    healthy = train(at("bf16"), arm="reference")
    assert healthy["final"]["linear_off_format_calls"] == 0 and healthy["final"]["linear_in_format_share"] == 1.0
    assert healthy["applied"]["linear_calls"]["runs_in"] == "bfloat16"
    monkeypatch.setattr(formats.Autocast, "autocast", lambda self: contextlib.nullcontext())
    record = train(at("bf16"), arm="reference")
    assert record["final"]["linear_off_format_calls"] == 8 * 7 and record["final"]["linear_in_format_share"] == 0.0
    assert record["applied"]["linear_calls"]["off_format"] == {
        name: {"calls": 8, "first_step": 0, "ran_as": "float32"} for name in LINEARS}
    assert record["series"]["loss"][0] == train(TINY, arm="reference")["series"]["loss"][0]   # fp32, bit for bit


def test_fp16_computing_in_bf16_is_found_by_the_rule_stated_apart_from_its_class(monkeypatch):
    """The fault: the fp16 format's autocast dtype is bfloat16. Its calls run in bfloat16 and the format class
    says bfloat16; the rule (stability.precision.rules, by the name "fp16") says float16, so every call is off."""
    healthy = train(replace(at("fp16"), steps=3), arm="reference")
    assert healthy["applied"]["linear_calls"]["runs_in"] == "float16"
    assert healthy["final"]["linear_off_format_calls"] == 0 and healthy["final"]["linear_in_format_share"] == 1.0
    monkeypatch.setattr(formats.Fp16, "dtype", torch.bfloat16)
    record = train(replace(at("fp16"), steps=3), arm="reference")
    calls = record["applied"]["linear_calls"]
    assert calls["runs_in"] == "float16"   # the record states the rule, not what the class computes in
    assert record["final"]["linear_off_format_calls"] == 3 * 7 and record["final"]["linear_in_format_share"] == 0.0
    assert calls["off_format"] == {name: {"calls": 3, "first_step": 0, "ran_as": "bfloat16"} for name in LINEARS}


def test_every_format_states_its_linear_rule_apart_and_a_format_without_one_is_refused(monkeypatch):
    """The table by registered name (what the record's runs_in says); a new format must state its rule first
    (None: counted, none judged), and a name takes one rule."""
    from stability.precision import rules

    assert set(rules.LINEAR_RULES) == set(formats.FORMATS)
    assert {name: rules.runs_in(PrecisionConfig(dtype=name)) for name in formats.FORMATS} == {
        "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "Float8Linear", "mxfp8": "MXLinear",
        "mxfp4": "MXLinear"}
    assert rules.runs_in(PrecisionConfig(dtype="fp8", fp8_recipe="own")) == "Fp8Linear"
    monkeypatch.setattr(formats, "FORMATS", dict(formats.FORMATS))
    monkeypatch.setattr(rules, "LINEAR_RULES", dict(rules.LINEAR_RULES))
    with pytest.raises(ValueError, match=r"'unruled'.*declare_linear_rule\('unruled'"):
        formats.register(type("Unruled", (formats.Format,), {"name": "unruled"}))
    assert "unruled" not in formats.FORMATS
    rules.declare_linear_rule("unjudged", None)
    formats.register(type("Unjudged", (formats.Format,), {"name": "unjudged"}))
    record = train(replace(at("unjudged"), steps=2), arm="reference")
    assert record["applied"]["linear_calls"] == {"runs_in": None, "linears": 7, "high_precision": [], "calls": 2 * 7,
                                                 "in_format": 0, "off_format": {}}
    assert record["final"]["linear_in_format_share"] is None
    with pytest.raises(ValueError, match="'fp16'"):
        rules.declare_linear_rule("fp16", "bfloat16")


def attention_left_in_fp32(monkeypatch) -> None:
    """The fault: the format converts every Linear but the attention projections (they stay plain nn.Linear),
    and says nothing of it."""
    original = PrecisionPolicy.prepare

    def prepare(self, model):
        model = original(self, model)
        for block in model.blocks:
            plain_linears(block.attn)
        return model
    monkeypatch.setattr(PrecisionPolicy, "prepare", prepare)


@pytest.mark.parametrize("dtype, recipe, runs_in, high_precision", [
    ("fp8", "tensorwise", "Float8Linear", []),
    ("fp8", "own", "Fp8Linear", []),
    ("mxfp8", "tensorwise", "MXLinear", ["blocks.0.attn.k_proj", "blocks.0.attn.v_proj"]),   # 16 outputs: no block
])
def test_linears_a_low_format_left_unconverted_are_found_and_named(dtype, recipe, runs_in, high_precision,
                                                                    monkeypatch):
    run = replace(at(dtype, fp8_recipe=recipe), steps=3)
    healthy = train(run, arm="reference")
    calls = healthy["applied"]["linear_calls"]
    assert (calls["runs_in"], calls["high_precision"], healthy["final"]["linear_off_format_calls"]) == (
        runs_in, high_precision, 0)
    assert calls["calls"] == 3 * 7 and calls["in_format"] == 3 * (7 - len(high_precision))   # declared: not judged
    attention_left_in_fp32(monkeypatch)
    record = train(run, arm="reference")
    covered = [name for name in ATTENTION if name not in high_precision]
    assert record["final"]["linear_off_format_calls"] == 3 * len(covered)
    assert record["applied"]["linear_calls"]["off_format"] == {
        name: {"calls": 3, "first_step": 0, "ran_as": "Linear"} for name in covered}


# ----------------------------------------------------------------------------- the probes where the config says

def test_a_probe_step_skipped_is_found_at_its_step(monkeypatch):
    take = trainer.take_probes
    monkeypatch.setattr(trainer, "take_probes", lambda parts, state, step: None if step == 3 else take(parts, state, step))
    record = train(TINY, arm="reference")
    assert [snapshot["step"] for snapshot in record["probes"]] == [0, 6, 7]
    assert record["final"]["probe_steps_missed"] == 1 and record["applied"]["probe_steps_missed"] == [3]


def test_probes_that_hook_fewer_modules_than_the_model_has_are_found_and_named(monkeypatch):
    every = probes.probed_linears
    monkeypatch.setattr(probes, "probed_linears", lambda model: [(name, module) for name, module in every(model)
                                                                 if ".attn." not in name])
    record = train(TINY, arm="reference")
    assert record["final"]["probe_modules_missed"] == 4
    assert record["applied"]["probe_modules_missed"] == [{"step": step, "modules": ATTENTION} for step in (0, 3, 6, 7)]


def test_the_probe_steps_the_config_names():
    """every 3 from step 0, and the last step of a run that completed or diverged; a run stopped otherwise (Ctrl-C,
    an error) may have stopped before probing its last step."""
    assert applied.probe_steps_missed(list(range(8)), [0, 3, 6, 7], 3, True) == []
    assert applied.probe_steps_missed(list(range(8)), [0, 6], 3, True) == [3, 7]
    assert applied.probe_steps_missed(list(range(5)), [0, 3], 3, True) == [4]          # diverged at step 4
    assert applied.probe_steps_missed(list(range(7)), [0, 3], 3, False) == []          # killed in step 6
    assert applied.probe_steps_missed([], [], 3, True) == []


def test_the_modules_the_probes_must_hook_come_from_the_model():
    model = trainer.build(TINY, None, None, trainer.reducer_for(TINY)).model
    assert applied.probe_targets(model) == ["blocks.0", *LINEARS]
    assert probes.heavy_probes(model, torch.zeros(1, 8, dtype=torch.long))["hooked"] == ["blocks.0", *LINEARS]
