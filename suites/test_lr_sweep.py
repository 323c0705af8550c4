"""Learning-rate sweep (Wortsman et al. 2023): both arms trained at every peak LR of the preset's
grid, for every seed; LR sensitivity and critical LR per arm, paired over seeds.

Kinds (see suites/conftest.py): invariants at any scale, regression against the committed
baseline, paired claims (asserted only where established, otherwise reported)."""

from __future__ import annotations

import math

import pytest

from stability.config import resolve
from stability.experiment import run_pair
from stability.stress import SWEEP_FIGURES, claim_rows, claims_table, cpu_threads
from stability.tracking import log_to_mlflow, write_record

pytestmark = pytest.mark.stress
KIND = "lr_sweep"

# Claims asserted per scale; everything else is reported only. reports/effects.md: on the CPU no
# preset establishes LR sensitivity, critical LR, spike score or F-Attn (null or noise at 3-6 seeds;
# this suite's own ci run agrees: critical LR 1.0 in every arm, LR sensitivity 1.10 -> 1.14
# [-0.33, 0.40]); `full` has no measurement yet. The one CPU effect, M-Act at a high peak LR on the
# 4-layer model, is asserted in its own regime below (test_claim_m_act_...).
ESTABLISHED: dict[str, tuple[str, ...]] = {}

# reports/effects.md, regime "ci_150": 4 layers x 128 wide, context 128, batch 8, 150 steps at peak LR
# 1e-2 with the ordinary optimiser (weight decay 0.1, betas (0.9, 0.95), clip 1.0). Seeds 0-2:
# m_act_mean 95% CI of gated - baseline [-189, -154]; 6 seeds [-366, -34], gated lower in all.
M_ACT_REGIME = {"model.d_model": 128, "model.n_layers": 4, "model.n_heads": 4, "model.n_kv_heads": 2,
                "model.context": 128, "data.builtin_bytes": 2_000_000, "optim.warmup_steps": 30,
                "optim.weight_decay": 0.1, "optim.betas": "0.9,0.95", "optim.grad_clip": 1.0,
                "probes.spike_window": 50, "probes.diverge_patience": 20, "probes.eval_batches": 8,
                "probes.every": 100000, "steps": 150, "optim.lr": 1e-2, "data.batch_size": 8,
                "seeds": "0,1,2", "name": "claim-m_act"}


@pytest.fixture(scope="module")
def record(stress_record):
    return stress_record(KIND)


class TestInvariants:
    def test_grid_fully_trained(self, record):
        grid = record["config"]["stress"]["sweep_lrs"]
        seeds = record["config"]["seeds"]
        runs = record[KIND]["runs"]
        assert sorted((r["arm"], r["seed"], r["lr"]) for r in runs) == sorted(
            (arm, seed, lr) for arm in ("baseline", "gated") for seed in seeds for lr in grid)
        assert all(r["status"] in ("completed", "diverged") for r in runs), [r["stop_reason"] for r in runs]

    def test_reference_lr_finite_and_learns(self, record):
        """At the reference LR in fp32 both arms complete with no non-finite event and the loss falls."""
        for arm in record["arms"]:
            final = arm["final"]
            assert arm["status"] == "completed", arm["stop_reason"]
            assert final["nonfinite_events"] == 0
            assert math.isfinite(final["heldout_loss"])
            assert final["final_train_loss"] < 0.9 * final["loss_init"], (arm["arm"], final["final_train_loss"])

    def test_sweep_figures_consistent(self, record):
        for entry in record[KIND]["per_arm"]:
            assert entry["lr_sensitivity"] >= 0.0
            diverged = [lr for lr, s in zip(entry["lrs"], entry["status"]) if s == "diverged"]
            if diverged:
                assert entry["critical_lr"] == min(diverged) and not entry["critical_lr_censored"]
            else:
                assert entry["critical_lr"] > max(entry["lrs"]) and entry["critical_lr_censored"]
            assert entry["critical_lr"] > record[KIND]["reference_lr"]  # the reference LR trains


class TestRegression:
    def test_against_baseline(self, record, regression_check):
        result = regression_check(record)
        assert result.exit_code == 0, result.table()


class TestPairedClaims:
    def test_report_lr_sensitivity_and_critical_lr(self, record, report_claims, scale):
        report_claims(record, {k: SWEEP_FIGURES[k] for k in ("lr_sensitivity", "critical_lr")},
                      asserted=ESTABLISHED.get(scale, ()), title="LR sweep")

    def test_report_activations_at_reference_lr(self, record, report_claims):
        report_claims(record, {"m_act_mean": "lower", "f_attn_mean": "lower", "loss_spike_score": "lower",
                               "heldout_loss": "lower"}, title="LR sweep, reference LR")

    def test_claim_m_act_lower_at_high_lr_4layer(self, device, tracking_uri, record_property):
        """Qiu et al.: the gate removes massive activations. Established on the CPU only in the regime
        of reports/effects.md (M_ACT_REGIME, 3 seeds, about 2 min on one thread; part of the default run): asserted there, at any
        --scale: the 95% interval of gated - baseline m_act_mean lies below 0, and in every seed the
        gated arm's M-Act is below the baseline's."""
        config = resolve("smoke", {**M_ACT_REGIME, "run.device": device or "cpu"})
        with cpu_threads(1 if config.run.device == "cpu" else 0):
            record = run_pair(config)
        write_record(record)
        record["tracking"] = log_to_mlflow(record, tracking_uri)
        rows = claim_rows(record, {"m_act_mean": "lower", "m_act_max": "lower", "f_attn_mean": "lower"})
        table = claims_table(rows, "M-Act claim, regime ci_150 of reports/effects.md")
        print(table)
        for row in rows:
            record_property(f"paired.{row['figure']}", str({k: row.get(k) for k in ("difference", "ci_low",
                                                                                   "ci_high", "n")}))
        m_act = next(r for r in rows if r["figure"] == "m_act_mean")
        assert m_act["n"] == 3 and m_act["holds"] is True and m_act["ci_high"] < 0, table
        by_seed = {}
        for arm in record["arms"]:
            by_seed.setdefault(arm["seed"], {})[arm["arm"]] = arm["final"]["m_act_mean"]
        assert all(v["gated"] < v["baseline"] for v in by_seed.values()), by_seed
