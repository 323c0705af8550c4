"""The stress cases' proof that their stress was applied, each with its fault injected: the batch ramp's steps off
its settings (a changed schedule class)."""

from __future__ import annotations

import pytest

from stability.cases.batch_ramp import off_schedule, scheduled_batch
from stability.cases.case import cpu_threads
from stability.cases.stress import run_case
from stability.config import resolve
from stability.config.schedules import BatchRamp
from stability.record import case_result

TINY = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 16,
        "data.batch_size": 4, "data.builtin_bytes": 20_000, "probes.every": 5, "probes.eval_batches": 1,
        "probes.probe_batch_size": 2, "steps": 6, "seeds": "0"}


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
