"""The plain pair at the preset's settings (the case ``stability run`` trains): both arms train (an
assertion), complete and learn (model invariants, recorded), and its figures hold against the committed
baseline. The plain pair is quantized after training with every registered post-training scheme
(those the device cannot run are recorded as skipped, with the reason), so the damage per scheme and arm
(``quant_<scheme>_kl``, ``quant_<scheme>_damage_loss``) is in the baseline and in every job
(docs/quantization.md); a repository's own model (a factory) is not quantized."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.stress
CASE = "standard"


@pytest.fixture(scope="module")
def record(stress_record, report_figures):
    record = stress_record(CASE)   # quantized by the case itself (stability.cases.stress.quantized_by_default)
    report_figures(record, ["heldout_loss", "m_act_mean", "f_attn_mean", "sink_rate_mean", "max_attn_logit",
                            "loss_spike_score"], "standard pair")
    return record


class TestInvariants:
    def test_record_written_then_tracked(self, record, assert_kept):
        assert_kept(record)

    def test_both_arms_complete_and_learn(self, record, learns):
        assert sorted({a["arm"] for a in record["arms"]}) == ["baseline", "gated"]
        for arm in record["arms"]:
            learns(record, arm, arm["series"]["loss"][0])

    def test_the_gated_arm_carries_a_gate_and_reports_its_score(self, record, model_invariant):
        for arm in record["arms"]:
            gated = arm["arm"] == "gated"
            assert (arm["gate_parameters"] > 0) == gated
            assert (arm["final"]["gate_score_mean"] is not None) == gated
            if gated:
                score = arm["final"]["gate_score_mean"]
                model_invariant(record, "gate_score_within_0_1", arm["arm"], arm["seed"], 0.0 < score < 1.0, score,
                                message="mean gate value strictly between 0 (closed) and 1 (open)")


def test_every_scheme_is_measured_or_skipped_with_its_reason(record):
    """Each arm of the quantized pair holds, per registered scheme, its KL and loss damage, or why it was
    skipped; at least one scheme ran on every device."""
    for arm in record["arms"]:
        schemes = (arm.get("quant") or {}).get("schemes")
        if schemes is None:
            assert not record["config"]["quant_schemes"], "the pair was asked to quantize and holds no result"
            continue
        ran = [name for name, result in schemes.items() if "skipped" not in result]
        assert ran, schemes
        for name, result in schemes.items():
            assert (result.get("skipped")) or (
                f"quant_{name}_kl" in arm["final"] and result["kl"] >= 0), (name, result)

