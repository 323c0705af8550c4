"""LR range test: one run per arm and seed whose LR rises exponentially (no warmup) from
``stress.ramp.start_lr`` to ``stress.ramp.end_lr`` until the arm diverges; the LR and step at the
onset of divergence and the spikes on the way.

Invariants at any scale (suites/conftest.py; the figures are judged by `stability check` after the suites); the paired figures are reported (suites/conftest.py)."""

from __future__ import annotations

import itertools
import math

import pytest

from stability.record import Status

pytestmark = pytest.mark.stress
CASE = "lr_ramp"

@pytest.fixture(scope="module")
def record(stress_record, report_figures):
    record = stress_record(CASE)
    report_figures(record, ["ramp_divergence_lr", "ramp_divergence_step", "ramp_spikes", "m_act_mean", "f_attn_mean"], "LR range test")
    return record


class TestInvariants:
    def test_record_written_then_tracked(self, record, assert_kept):
        assert_kept(record)

    def test_lr_rises_exponentially(self, record):
        ramp = record["config"]["stress"]["ramp"]
        steps = record["config"]["run"]["steps"]
        ratio = (ramp["end_lr"] / ramp["start_lr"]) ** (1 / max(1, steps - 1))
        for arm in record["arms"]:
            lrs = arm["series"]["lr"]
            assert lrs[0] == pytest.approx(ramp["start_lr"])
            assert all(b / a == pytest.approx(ratio, rel=1e-9) for a, b in itertools.pairwise(lrs))

    def test_ramp_finds_divergence(self, record, model_invariant):
        """Within the ramp every arm diverges (a ramp that never diverges measured nothing), after the loss
        first fell: the best loss on the way is below the initial loss (model invariants, recorded). Where it
        diverged, the figures of the onset are consistent (assertions)."""
        for arm in record["arms"]:
            final, name, seed = arm["final"], arm["arm"], arm["seed"]
            diverged = arm["status"] == Status.DIVERGED and not final["ramp_censored"]
            model_invariant(record, "ramp_diverges", name, seed, diverged, message=arm["stop_reason"])
            model_invariant(record, "loss_falls_before_divergence", name, seed,
                            final["ramp_best_loss"] is not None and final["ramp_best_loss"] < arm["series"]["loss"][0],
                            final["ramp_best_loss"], arm["series"]["loss"][0])
            if not diverged:
                continue
            assert final["ramp_divergence_step"] <= arm["diverged_at_step"]
            # the LR of the update after which the loss first went bad (the update before the onset step)
            assert arm["series"]["lr"][final["ramp_divergence_step"] - 1] == final["ramp_divergence_lr"]
            assert final["ramp_best_lr"] < final["ramp_divergence_lr"]

    def test_finite_until_divergence(self, record):
        for arm in record["arms"]:
            onset = arm["final"]["ramp_divergence_step"]
            assert all(math.isfinite(v) for v in arm["series"]["loss"][:onset])
