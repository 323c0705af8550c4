"""The paper's claims, asserted only on seeds that were not used to find them.

Each claim names its regime, the seeds it was discovered on (reports/effects.md) and the held-out
seeds it is asserted on, chosen before they were run. A claim holds when the 95% t-interval of
gated - reference lies entirely on the better side of 0 over the held-out seeds; the exact sign-flip
p-value is reported beside it (with 6 seeds it cannot go below 2/64 = 0.031).

Claims that the held-out seeds did not confirm, or that no CPU regime shows (F-Attn, sink rate,
spikes, critical LR), are reported, not asserted: see reports/effects.md and the paired figures each
stress case reports. The paper's controls (floored gate, headwise gate, G2) and the length-extrapolation
probe: reports/controls.md, hypotheses ``CONTROLS_HYPOTHESES``, asserted where ``CONTROLS_CONFIRMED``. The
first-token sink of the ``sink`` preset (reports/sink.md), which its held-out seeds did not confirm, is asserted as a
strict expected failure: the test fails the day the claim holds.
"""

from __future__ import annotations

import pytest

from stability.cases.pipeline import keep
from stability.cases.standard import run_pair
from stability.cases.stress import cpu_threads
from stability.check.claims import claim_rows, claims_table, held_out
from stability.config import resolve

pytestmark = pytest.mark.claim

# reports/effects.md, regime "ci_150": 4 layers x 128 wide, context 128, batch 8, 150 steps at peak LR
# 1e-2 with the ordinary optimiser (weight decay 0.1, betas (0.9, 0.95), clip 1.0).
M_ACT_REGIME = {"model.d_model": 128, "model.n_layers": 4, "model.n_heads": 4, "model.n_kv_heads": 2,
                "model.context": 128, "data.builtin_bytes": 2_000_000, "optim.warmup_steps": 30,
                "optim.weight_decay": 0.1, "optim.betas": "0.9,0.95", "optim.grad_clip": 1.0,
                "probes.spike_window": 50, "probes.diverge_patience": 20, "probes.eval_batches": 8,
                "probes.every": 100000, "steps": 150, "optim.lr": 1e-2, "data.batch_size": 8,
                "name": "claim-m_act"}
M_ACT_DISCOVERY_SEEDS = (0, 1, 2, 3, 4, 5)      # reports/effects.md: -200 [-366, -34], p = 0.031
M_ACT_HELD_OUT_SEEDS = (100, 101, 102, 103, 104, 105)


@pytest.mark.slow   # twelve seeds of a pair: CI runs it in its step of long tests
@pytest.mark.long
def test_claim_gate_lowers_massive_activations_on_held_out_seeds(device, tracking_uri, run_dir, record_property):
    """Qiu et al.: the gate removes massive activations (M-Act 1053 -> 94 at 1.7B). Here, in regime
    ci_150 on 6 held-out seeds (about 4 min on one thread): the 95% interval of gated - reference
    m_act_mean lies below 0, and the gated arm's M-Act is lower in every seed."""
    config = resolve("smoke", {**M_ACT_REGIME, "seeds": ",".join(map(str, M_ACT_HELD_OUT_SEEDS)),
                               "run.device": device or "cpu"})
    with cpu_threads(1 if config.run.device == "cpu" else 0):
        record = run_pair(config, purpose="claim")
    keep(record, run_dir, tracking_uri, plots=False)
    assert held_out(record, M_ACT_DISCOVERY_SEEDS) == list(M_ACT_HELD_OUT_SEEDS)
    rows = claim_rows(record, ["m_act_mean", "m_act_max", "f_attn_mean", "heldout_loss"])
    table = claims_table(rows, f"M-Act claim, regime ci_150, held-out seeds {list(M_ACT_HELD_OUT_SEEDS)}")
    print(table)
    record_property("claim.m_act_mean", str({k: rows[0].get(k) for k in ("difference", "ci_low", "ci_high",
                                                                          "p_value", "n")}))
    m_act = rows[0]
    assert m_act["n"] == len(M_ACT_HELD_OUT_SEEDS) and m_act["holds"] is True and m_act["ci_high"] < 0, table
    by_seed = {}
    for arm in record["arms"]:
        by_seed.setdefault(arm["seed"], {})[arm["arm"]] = arm["final"]["m_act_mean"]
    assert all(v["gated"] < v["reference"] for v in by_seed.values()), by_seed


# reports/controls.md, regime "controls_ci_150": the ci_150 regime above with the five arms of arms=controls
# (the reference arm, G1, G1 headwise, G1 floored at 0.5, G2) and the extrapolation probe at 2x and 4x the context.
CONTROLS_REGIME = {**M_ACT_REGIME, "arms": "controls", "extrapolation.factors": "2,4",
                   "extrapolation.eval_batches": 4, "name": "claim-controls"}
CONTROLS_DISCOVERY_SEEDS = (0, 1, 2, 3, 4, 5)
CONTROLS_HELD_OUT_SEEDS = (200, 201, 202, 203, 204, 205)
# The hypotheses, fixed from the discovery seeds before the held-out seeds were run (reports/controls.md):
# (name, arm, reference arm, figure, expected: "better" or "worse" than the reference)
CONTROLS_HYPOTHESES = (
    ("H1", "gated_floored", "gated", "m_act_mean", "worse"),            # the floor takes M-Act back
    ("H2", "gated_floored", "gated", "extrap_gap_plain_x4", "worse"),   # ... and extrapolates worse
    ("H3", "gated_headwise", "reference", "m_act_mean", "better"),
    ("H4", "gated_value", "reference", "m_act_mean", "better"),
    ("H5", "gated", "reference", "m_act_mean", "better"),
    ("H6", "gated_value", "gated", "heldout_loss", "better"),
    ("H7", "gated_value", "reference", "extrap_gap_plain_x4", "better"),
)
# The hypotheses the held-out seeds confirmed (reports/controls.md): asserted. The others are reported.
CONTROLS_CONFIRMED = ("H1", "H3", "H4", "H5", "H6")


@pytest.mark.slow
def test_claims_of_the_controls_on_held_out_seeds(device, tracking_uri, run_dir, record_property):
    """Qiu et al.'s controls and the length-extrapolation probe, regime controls_ci_150, six held-out seeds
    (about 12 min on a free CPU core): every hypothesis of ``CONTROLS_HYPOTHESES`` is measured and
    printed; the confirmed ones must hold again (their 95% interval on the expected side of 0), and the
    paper's two claims nothing here confirmed are reported beside them."""
    config = resolve("smoke", {**CONTROLS_REGIME, "seeds": ",".join(map(str, CONTROLS_HELD_OUT_SEEDS)),
                               "run.device": device or "cpu"})
    with cpu_threads(1 if config.run.device == "cpu" else 0):
        record = run_pair(config, purpose="claim")
    keep(record, run_dir, tracking_uri, plots=False)
    assert held_out(record, CONTROLS_DISCOVERY_SEEDS) == list(CONTROLS_HELD_OUT_SEEDS)
    results, tables = {}, []
    for name, arm, reference, figure, expect in CONTROLS_HYPOTHESES:
        rows = claim_rows(record, [figure], arm=arm, reference=reference, expect=expect)
        results[name] = rows[0]
        tables.append(claims_table(rows, f"{name}: {arm} {expect} than {reference}", arm=arm, reference=reference))
    for arm, reference, figure in (("gated", "reference", "extrap_gap_plain_x4"),    # the gate extrapolates better
                                   ("gated_floored", "reference", "f_attn_mean")):   # the floor brings the sink back
        expect = "better" if arm == "gated" else "worse"
        tables.append(claims_table(claim_rows(record, [figure], arm=arm, reference=reference, expect=expect),
                                   f"reported: {arm} {expect} than {reference}", arm=arm, reference=reference))
    print("\n\n".join(tables))
    for name, row in results.items():
        record_property(f"claim.controls.{name}", str({k: row.get(k) for k in ("difference", "ci_low", "ci_high",
                                                                               "p_value", "n", "holds")}))
    for name in CONTROLS_CONFIRMED:
        row = results[name]
        assert row["n"] == len(CONTROLS_HELD_OUT_SEEDS) and row["holds"] is True, (name, row)


# reports/sink.md, the "sink" preset: the positive control of the first-token probe. Three arms (reference, G1
# elementwise, G1 floored at 0.5); the preset's own seeds are the held-out ones below.
SINK_DISCOVERY_SEEDS = (0, 1, 2)                # studies/sink_search.py searched on these only
SINK_HELD_OUT_SEEDS = (300, 301, 302, 303, 304, 305)
# Discovery (seeds 0-2): gated - reference f_attn_mean -0.132 [-0.201, -0.063]. The held-out seeds, run once, did
# not confirm it at 95%: -0.0546 [-0.114, +0.0048], sign-flip p 0.094, gated lower in 5 of 6 (reports/sink.md).
SINK_HELD_OUT_RESULT = "held-out seeds 300-305: gated - reference f_attn_mean -0.0546 [-0.114, +0.0048], undecided"


@pytest.mark.slow
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=SINK_HELD_OUT_RESULT)
def test_claim_gate_removes_the_first_token_sink_on_held_out_seeds(device, tracking_uri, run_dir, record_property):
    """Qiu et al.: the gate removes the attention sink (first-token share 0.467 -> 0.048). Here, at the ``sink``
    preset on 6 held-out seeds (11 min on a loaded 2-core machine): the claim is that the 95% interval of gated -
    reference f_attn_mean lies below 0. It did not hold on these seeds (``SINK_HELD_OUT_RESULT``), so the test is a
    strict expected failure: it fails the day the claim holds (update reports/sink.md then), and on any error other
    than the claim's assertion. M-Act, the held-out loss and the floored gate against the gate (the paper's
    control: the floor should bring the sink back) are printed beside it."""
    config = resolve("sink", {"seeds": ",".join(map(str, SINK_HELD_OUT_SEEDS)), "run.device": device or "cpu"})
    with cpu_threads(1 if config.run.device == "cpu" else 0):
        record = run_pair(config, purpose="claim")
    keep(record, run_dir, tracking_uri, plots=False)
    if held_out(record, SINK_DISCOVERY_SEEDS) != list(SINK_HELD_OUT_SEEDS):   # never an xfail: pytest.fail
        pytest.fail(f"the record's seeds are not the held-out seeds {SINK_HELD_OUT_SEEDS}")
    rows = claim_rows(record, ["f_attn_mean", "sink_rate_mean", "m_act_mean", "heldout_loss"])
    floored = claim_rows(record, ["f_attn_mean", "m_act_mean"], arm="gated_floored", reference="gated",
                         expect="worse")
    table = "\n\n".join([
        claims_table(rows, f"sink claim, preset sink, held-out seeds {list(SINK_HELD_OUT_SEEDS)}"),
        claims_table(floored, "reported: gated_floored worse than gated", arm="gated_floored", reference="gated")])
    print(table)
    record_property("claim.sink.f_attn_mean", str({k: rows[0].get(k) for k in ("reference", "treatment",
                                                                                "difference", "ci_low", "ci_high",
                                                                                "p_value", "n")}))
    f_attn = rows[0]
    if f_attn["n"] != len(SINK_HELD_OUT_SEEDS):
        pytest.fail(f"f_attn_mean paired over {f_attn['n']} seeds, not {len(SINK_HELD_OUT_SEEDS)}:\n{table}")
    assert f_attn["holds"] is True and f_attn["ci_high"] < 0, table
