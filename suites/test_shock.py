"""LR shock: the learning rate jumps by ``stress.shock.factor`` at ``stress.shock.at_step`` for the rest
of training ("jump"), or starts at the peak with no warmup ("no_warmup"); the loss excess it causes,
the spikes and the steps to get back to the pre-shock loss.

Invariants at any scale (suites/conftest.py; the figures are judged by `stability check` after the suites); baseline (plus the determinism the baseline relies on); the paired figures are reported (suites/conftest.py)."""

from __future__ import annotations

import math

import pytest

from stability.cases.stress import run_case
from stability.config import ExperimentConfig, RunConfig, from_dict
from stability.config.schedules import Shock, warmup_cosine
from stability.record import Status, clean

pytestmark = pytest.mark.stress
CASE = "shock"

@pytest.fixture(scope="module")
def record(stress_record, report_figures):
    record = stress_record(CASE)
    report_figures(record, ["shock_peak_excess", "shock_recovery_steps", "shock_spikes", "loss_spike_score", "m_act_mean", "f_attn_mean"], "LR shock")
    return record


class TestInvariants:
    def test_record_written_then_tracked(self, record, assert_kept):
        assert_kept(record)

    def test_shock_applied_as_configured(self, record):
        run = from_dict(RunConfig, record["config"]["run"])
        shock = from_dict(Shock, record["config"]["stress"]["shock"])
        for arm in record["arms"]:
            for step, lr in zip(arm["series"]["step"], arm["series"]["lr"]):
                assert lr == pytest.approx(shock.lr_at(step, run))
            if shock.kind == "jump" and len(arm["series"]["lr"]) > shock.at_step:
                s = shock.at_step
                assert arm["series"]["lr"][s] == pytest.approx(shock.factor * warmup_cosine(s, run))

    def test_finite_before_shock_and_figures_defined(self, record, model_invariant):
        """The loss is finite up to the shock (a model invariant, recorded); when it is, the shock's figures
        are defined and consistent (assertions)."""
        for arm in record["arms"]:
            final = arm["final"]
            s = final["shock_step"]
            before = arm["series"]["loss"][:s + 1]
            finite = len(before) == s + 1 and all(v is not None and math.isfinite(v) for v in before)
            if not model_invariant(record, "finite_before_shock", arm["arm"], arm["seed"], finite, len(before), s + 1,
                                   "steps with a finite loss up to the shock"):
                continue
            assert final["shock_pre_loss"] is not None and math.isfinite(final["shock_pre_loss"])
            assert final["shock_peak_excess"] is not None
            assert 1 <= final["shock_recovery_steps"] <= record["config"]["run"]["steps"] - s
            if final["shock_recovered"]:
                assert arm["status"] != Status.DIVERGED


class TestDeterminism:
    def test_deterministic_rerun(self, record, stress_baseline):
        """Same config and seed give the same figures on this device (what the baseline relies on):
        the case re-run in-process reproduces every arm's final figures and the paired table.
        Run where a baseline is committed (smoke on the CPU); elsewhere it would only cost time."""
        if stress_baseline is None:
            pytest.skip("no committed baseline for this preset and device: determinism not needed here")
        config = from_dict(ExperimentConfig, record["config"])
        again = run_case(CASE, config)
        for first, second in zip(record["arms"], again["arms"]):
            assert clean(first["final"]) == clean(second["final"]), (first["arm"], first["seed"])
            assert clean(first["series"]["loss"]) == clean(second["series"]["loss"])
        assert clean(record["paired"]) == clean(again["paired"])
