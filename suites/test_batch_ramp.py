"""Batch ramp: the batch size doubles every ``stress.batch.double_every`` steps up to
``stress.batch.max_size``, the LR scaled by ``stress.batch.lr_rule`` (none, sqrt, linear); spikes,
divergence and the loss against tokens seen.

Invariants at any scale (suites/conftest.py; the figures are judged by `stability check` after the suites); the paired figures are reported (suites/conftest.py)."""

from __future__ import annotations

import itertools

import pytest

from stability.config import RunConfig, from_dict
from stability.config.schedules import lr_scale, warmup_cosine
from stability.record import case_result

pytestmark = pytest.mark.stress
CASE = "batch_ramp"

@pytest.fixture(scope="module")
def record(stress_record, report_figures):
    record = stress_record(CASE)
    report_figures(record, ["loss_spike_score", "grad_spike_score", "final_train_loss", "m_act_mean", "f_attn_mean"], "batch ramp")
    return record


class TestInvariants:
    def test_record_written_then_tracked(self, record, assert_kept):
        assert_kept(record)

    def test_batch_doubles_and_lr_follows_rule(self, record):
        ramp = record["config"]["stress"]["batch"]
        run = from_dict(RunConfig, record["config"]["run"])
        base = run.data.batch_size
        for arm in record["arms"]:
            series = arm["series"]
            for step, batch, lr in zip(series["step"], series["batch_size"], series["lr"]):
                expected = min(ramp["max_size"], base * 2 ** (step // ramp["double_every"]))
                assert batch == expected
                assert lr == pytest.approx(warmup_cosine(step, run) * lr_scale(ramp["lr_rule"],
                                                                               batch / base))
            tokens = [b * run.model.context for b in series["batch_size"]]
            assert series["tokens"][-1] == sum(tokens) == arm["final"]["tokens_seen"]

    def test_finite_and_learns(self, record, learns):
        """The ramp stays trainable: no non-finite event, no divergence, the loss falls (model invariants,
        recorded)."""
        for arm in record["arms"]:
            learns(record, arm, arm["series"]["loss"][0])

    def test_loss_against_tokens_recorded(self, record):
        for entry in case_result(record, CASE)["per_arm"]:
            curve = entry["loss_vs_tokens"]
            assert curve and all(a[0] < b[0] for a, b in itertools.pairwise(curve))
            assert curve[-1][0] == entry["tokens_seen"]
