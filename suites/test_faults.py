"""Harness self-checks: deliberate faults prove each detector.

* a NaN / Inf injected into the output of block L at step k is reported at step k, localised to
  module "blocks.L" (layer L), and the arm is recorded as diverged at step k;
* an LR spike (LR x factor for the one step k, once the detector's window has left the warmup) is
  flagged as a loss spike within a few steps of k, and nothing is flagged before it;
* a deliberately exploding config (huge LR, no warmup, no clipping) is recorded as diverged with
  its step, and the run (and the suite) goes on.

Each case trains a pair (both arms must show the detection) through ``stability.cases.standard.run_pair``,
writes the JSON record (purpose "fault": never part of a regression check or a baseline), then logs
it to MLflow."""

from __future__ import annotations

import math

import pytest

from stability.cases.pipeline import keep
from stability.cases.standard import run_pair
from stability.cases.stress import cpu_threads
from stability.config.schedules import warmup_cosine
from stability.record import Status, read_record

pytestmark = pytest.mark.stress


@pytest.fixture
def record_pair(tracking_uri, run_dir):
    """Train the pair, write the JSON record (purpose "fault"), then log it to MLflow (no plots)."""
    def run(config) -> dict:
        with cpu_threads(config.stress.threads):
            record = run_pair(config, purpose="fault")
        keep(record, run_dir, tracking_uri, plots=False)
        assert read_record(record["record_path"])["purpose"] == "fault"
        assert record["tracking"]["status"] == "tracked", record["tracking"]
        return record
    return run


@pytest.mark.parametrize("kind, step, layer", [("nan", 3, 0), ("nan", 5, 1), ("inf", 4, 1)])
def test_nonfinite_fault_reported_at_step_and_layer(stress_config, record_pair, kind, step, layer):
    config = stress_config({"name": f"fault-{kind}", "fault.kind": kind, "fault.step": step,
                            "fault.layer": layer, "steps": step + 4})
    record = record_pair(config)
    assert record["status"] == Status.COMPLETED
    for arm in record["arms"]:
        assert arm["status"] == Status.DIVERGED and arm["diverged_at_step"] == step, (arm["arm"], arm["stop_reason"])
        assert all(math.isfinite(v) for v in arm["series"]["loss"][:step])
        assert arm["series"]["nonfinite"][step] != ""
        event = arm["events"][0]
        assert (event["step"], event["module"], event["layer"]) == (step, f"blocks.{layer}", layer), event
        assert arm["final"]["nonfinite_events"] == 1


def test_lr_spike_flagged_as_loss_spike(stress_config, record_pair):
    """The spike comes once the detector's window (``spike_window`` steps) holds only steps after the
    warmup: a window that still holds the loss's initial descent has a standard deviation wide enough to
    hide a doubling (with the spike at step 25 of the smoke preset, seeds 6-8 went from loss 3.4 to 6.5
    unflagged; seeds 0-2 happened to jump further)."""
    preset = stress_config()
    step = preset.run.optim.warmup_steps + preset.run.probes.spike_window + 5
    factor = 1000.0
    config = stress_config({"name": "fault-lr_spike", "fault.kind": "lr_spike", "fault.step": step,
                            "fault.lr_factor": factor, "steps": step + 6})
    record = record_pair(config)
    window = config.run.probes.spike_window
    assert step >= config.run.probes.spike_min_history, "the detector needs history before the spike"
    for arm in record["arms"]:
        series = arm["series"]
        assert series["lr"][step] == pytest.approx(factor * warmup_cosine(step, config.arm_config(arm["arm"], 0)))
        flagged = [s for s, spike in zip(series["step"], series["loss_spike"]) if spike]
        assert not [s for s in flagged if s < step], f"{arm['arm']}: spike flagged before the fault: {flagged}"
        assert [s for s in flagged if step <= s <= step + 3], \
            f"{arm['arm']}: no loss spike within 3 steps of the LR spike at {step} (flagged {flagged}, " \
            f"window {window}); losses {series['loss'][step - 2:step + 4]}"


def test_exploding_config_recorded_as_diverged(stress_config, record_pair):
    config = stress_config({"name": "fault-explode", "optim.lr": 10.0, "optim.warmup_steps": 0,
                            "optim.grad_clip": 0.0})
    record = record_pair(config)
    assert record["status"] == Status.COMPLETED  # both arms ran; nothing raised
    for arm in record["arms"]:
        assert arm["status"] == Status.DIVERGED, (arm["arm"], arm["status"], arm["final"].get("final_train_loss"))
        step = arm["diverged_at_step"]
        assert isinstance(step, int) and 0 <= step < config.run.steps
        assert arm["final"]["steps_completed"] == step + 1 < config.run.steps
        assert arm["stop_reason"], arm
        assert arm["final"]["diverged"] is True
