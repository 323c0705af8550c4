"""Learning-rate sweep (Wortsman et al. 2023): both arms trained at every peak LR of the preset's
grid, for every seed; LR sensitivity and critical LR per arm, paired over seeds.

Invariants at any scale (suites/conftest.py; the figures are judged by `stability check` after the suites); the paired figures are reported. On the CPU no preset shows an LR-sensitivity or
critical-LR difference between the arms (reports/effects.md), so none is asserted here."""

from __future__ import annotations

import pytest

from stability.record import Status, case_result

pytestmark = pytest.mark.stress
CASE = "lr_sweep"

@pytest.fixture(scope="module")
def record(stress_record, report_figures):
    record = stress_record(CASE)
    report_figures(record, ["lr_sensitivity", "critical_lr", "m_act_mean", "f_attn_mean", "loss_spike_score",
                            "heldout_loss"], "LR sweep")
    return record


class TestInvariants:
    def test_record_written_then_tracked(self, record, assert_kept):
        assert_kept(record)

    def test_grid_fully_trained(self, record):
        grid = record["config"]["stress"]["sweep_lrs"]
        seeds = record["config"]["seeds"]
        runs = case_result(record, CASE)["runs"]
        assert sorted((r["arm"], r["seed"], r["lr"]) for r in runs) == sorted(
            (arm, seed, lr) for arm in ("baseline", "gated") for seed in seeds for lr in grid)
        assert all(r["status"] in (Status.COMPLETED, Status.DIVERGED) for r in runs), [r["stop_reason"] for r in runs]

    def test_reference_lr_finite_and_learns(self, record, learns):
        """At the reference LR in fp32 both arms complete with no non-finite event and the loss falls (model
        invariants, recorded)."""
        for arm in record["arms"]:
            learns(record, arm, arm["final"]["loss_init"])

    def test_sweep_figures_consistent(self, record, model_invariant):
        reference = case_result(record, CASE)["reference_lr"]
        for entry in case_result(record, CASE)["per_arm"]:
            assert entry["lr_sensitivity"] >= 0.0
            diverged = [lr for lr, s in zip(entry["lrs"], entry["status"]) if s == Status.DIVERGED]
            if diverged:
                assert entry["critical_lr"] == min(diverged) and not entry["critical_lr_censored"]
            else:
                assert entry["critical_lr"] > max(entry["lrs"]) and entry["critical_lr_censored"]
            model_invariant(record, "reference_lr_below_critical_lr", entry["arm"], entry["seed"],
                            entry["critical_lr"] > reference, entry["critical_lr"], reference,
                            "the smallest LR of the grid that diverged is above the reference LR")
