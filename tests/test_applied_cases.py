"""The stress cases' proof that their stress was applied, each with its fault injected: the batch ramp's steps off
its settings (a changed schedule class), the precision ladder's first-step loss gap and per-rung proofs (a bf16
rung that trains in fp32, an LR changed in one rung)."""

from __future__ import annotations

import contextlib

import pytest

from stability.cases.batch_ramp import (
    off_schedule,
    scheduled_batch,
    scheduled_lr_factor,
    the_batch_doubles_and_the_lr_follows_its_rule,
)
from stability.cases.case import cpu_threads
from stability.cases.checks import CheckFailed
from stability.cases.precision_ladder import first_loss_gap
from stability.cases.shock import shocked_lr, the_shock_is_applied_as_configured
from stability.cases.stress import run_case
from stability.config import RunConfig, resolve, schedules
from stability.config.schedules import BatchRamp, Shock
from stability.precision import PrecisionPolicy, formats
from stability.record import case_result

TINY = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 16,
        "data.batch_size": 4, "data.builtin_bytes": 20_000, "probes.every": 5, "probes.eval_batches": 1,
        "probes.probe_batch_size": 2, "steps": 6, "seeds": "0"}
LINEARS = {"reference": 7, "gated": 8}   # q, k, v, o (and the gate's projection), the MLP's three


@pytest.fixture(autouse=True)
def one_thread():
    with cpu_threads(1):
        yield


# ----------------------------------------------------------------------------- the batch ramp

def test_the_steps_off_the_ramps_settings_by_hand():
    """Base 2, doubled every 2 steps up to 4, context 16: batches 2, 2, 4, 4, tokens added 32, 32, 64, 64."""
    assert [scheduled_batch(step, 2, 2, 4) for step in range(6)] == [2, 2, 4, 4, 4, 4]
    series = {"step": [0, 1, 2, 3], "batch_size": [2, 2, 4, 4], "tokens": [32, 64, 128, 192]}
    assert off_schedule(series, 2, 16, 2, 4) == []
    logged_not_trained = {**series, "tokens": [32, 64, 96, 160]}       # step 2 logs 4 sequences, trains 2
    assert off_schedule(logged_not_trained, 2, 16, 2, 4) == [
        {"step": 2, "batch_size": 4, "tokens": 32, "expected_batch_size": 4, "expected_tokens": 64}]
    late = {**series, "batch_size": [2, 2, 2, 4], "tokens": [32, 64, 96, 160]}   # the doubling a step late
    assert off_schedule(late, 2, 16, 2, 4) == [
        {"step": 2, "batch_size": 2, "tokens": 32, "expected_batch_size": 4, "expected_tokens": 64}]


def test_a_changed_schedule_class_is_found_at_its_step(monkeypatch):
    config = resolve("smoke", {**TINY, "stress.batch.double_every": 2, "stress.batch.max_size": 8})
    record = run_case("batch_ramp", config)
    assert [arm["final"]["batch_off_schedule_steps"] for arm in record["arms"]] == [0, 0]
    scheduled = BatchRamp.batch_size_at   # the fault: every doubling one step late
    monkeypatch.setattr(BatchRamp, "batch_size_at", lambda self, step, run: scheduled(self, max(0, step - 1), run))
    record = run_case("batch_ramp", config)
    assert [arm["final"]["batch_off_schedule_steps"] for arm in record["arms"]] == [1, 1]
    for entry in case_result(record, "batch_ramp")["per_arm"]:
        assert entry["batch_off_schedule"] == [{"step": 2, "batch_size": 4, "tokens": 64, "expected_batch_size": 8,
                                                "expected_tokens": 128}]


def test_the_ramps_lr_rule_is_stated_apart_from_the_function_the_schedule_applies(monkeypatch):
    """The check's LR factor is its own (none 1, linear the growth, sqrt its root): an lr_scale whose "sqrt" rule
    became linear trains every doubled batch at the wrong LR, and the check names the first such step."""
    assert [scheduled_lr_factor(rule, 4) for rule in ("none", "linear", "sqrt")] == [1.0, 4.0, 2.0]
    config = resolve("smoke", {**TINY, "stress.batch.double_every": 2,
                               "stress.batch.max_size": 8, "stress.batch.lr_rule": "sqrt"})
    the_batch_doubles_and_the_lr_follows_its_rule(run_case("batch_ramp", config), None)
    scale = schedules.lr_scale   # the fault: "sqrt" scales the LR linearly
    monkeypatch.setattr(schedules, "lr_scale", lambda rule, growth: scale("linear" if rule == "sqrt" else rule, growth))
    with pytest.raises(CheckFailed, match="step 2: LR"):
        the_batch_doubles_and_the_lr_follows_its_rule(run_case("batch_ramp", config), None)


# ----------------------------------------------------------------------------- the LR shock

def test_the_shocks_lr_is_stated_apart_from_the_schedule_that_applies_it(monkeypatch):
    """The check computes the shocked LR from the settings (``shocked_lr``), not by ``Shock.lr_at``, which made
    the series it checks: a jump that lasts one step (a spike) is found at the step after it."""
    run = RunConfig()
    for kind in ("jump", "no_warmup"):
        shock = Shock(kind=kind, at_step=3, factor=10.0)
        assert [shocked_lr(s, run, kind, 3, 10.0) for s in range(8)] == [shock.lr_at(s, run) for s in range(8)]
    config = resolve("smoke", {**TINY, "stress.shock.at_step": 3, "stress.shock.factor": 10.0})
    the_shock_is_applied_as_configured(run_case("shock", config), None)
    jump = Shock.lr_at   # the fault: the LR multiplied at the shock's step alone
    monkeypatch.setattr(Shock, "lr_at", lambda self, step, run: jump(self, step, run) / (
        self.factor if step > self.at_step else 1.0))
    with pytest.raises(CheckFailed, match="step 4: LR"):
        the_shock_is_applied_as_configured(run_case("shock", config), None)


# ----------------------------------------------------------------------------- the precision ladder

def test_the_first_loss_gap_by_hand():
    def run(*losses):
        return {"series": {"loss": list(losses)}}
    assert first_loss_gap(run(5.25, 1.0), run(5.5, 2.0)) == 0.25 and first_loss_gap(run(5.5), run(5.25)) == 0.25
    assert first_loss_gap(run(float("nan")), run(5.5)) is None and first_loss_gap(run(), run(5.5)) is None


def twice_the_lr_in_bf16_at(step: int, monkeypatch) -> None:
    """The fault: in the bf16 rung only, the optimiser's LR doubled for step ``step``'s update, undone after it."""
    original = PrecisionPolicy.step

    def step_with(self, optimizer, grads_finite):
        # counted on the policy itself: a count keyed by id() carried over to a new policy that reused a freed one's id
        calls = self.fault_steps = getattr(self, "fault_steps", -1) + 1
        if calls != step or self.config.dtype != "bf16":
            return original(self, optimizer, grads_finite)
        for group in optimizer.param_groups:
            group["lr"] *= 2
        try:
            return original(self, optimizer, grads_finite)
        finally:
            for group in optimizer.param_groups:
                group["lr"] /= 2
    monkeypatch.setattr(PrecisionPolicy, "step", step_with)


def test_a_bf16_rung_that_trains_in_fp32_and_an_lr_off_its_log_are_found(monkeypatch):
    config = resolve("smoke", {**TINY, "stress.precisions": "fp32,bf16", "stress.ladder_steps": 2})
    record = run_case("precision_ladder", config)
    runs = case_result(record, "precision_ladder")["runs"]
    for arm in record["arms"]:
        final = arm["final"]
        bf16 = next(r for r in runs if (r["precision"], r["arm"]) == ("bf16", arm["arm"]))
        assert final["first_loss_gap_bf16"] == abs(bf16["loss"][0] - arm["series"]["loss"][0]) > 0
        assert (final["linear_off_format_calls_bf16"], final["lr_off_log_steps_bf16"]) == (0, 0)
    monkeypatch.setattr(formats.Autocast, "autocast", lambda self: contextlib.nullcontext())
    twice_the_lr_in_bf16_at(1, monkeypatch)
    record = run_case("precision_ladder", config)
    runs = case_result(record, "precision_ladder")["runs"]
    for arm in record["arms"]:
        final, linears = arm["final"], LINEARS[arm["arm"]]
        assert final["first_loss_gap_bf16"] == 0.0   # the same weights, batch and arithmetic as the fp32 rung
        assert (final["linear_off_format_calls_bf16"], final["lr_off_log_steps_bf16"]) == (2 * linears, 1)
        assert (final["linear_off_format_calls"], final["lr_off_log_steps"]) == (0, 0)   # the fp32 run's own
        bf16 = next(r for r in runs if (r["precision"], r["arm"]) == ("bf16", arm["arm"]))
        assert len(bf16["applied"]["linear_calls"]["off_format"]) == linears
        assert {entry["ran_as"] for entry in bf16["applied"]["linear_calls"]["off_format"].values()} == {"float32"}
        assert [entry["step"] for entry in bf16["applied"]["lr_off_log"]] == [1]
