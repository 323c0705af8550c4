"""Figures pinned to values computed by hand, so that a wrong formula fails a test.

Each test states its arithmetic in a comment; the numbers are chosen so that the usual slips (n for
n - 1, min for max, < for <=, the wrong window) give a different answer. The mutation run
(``tox -e mutation``, docs/mutation.md) shows which slips these tests catch.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from _stability_records import as_schema_3, pair_record, replicate
from torch import nn

from stability.cases.batch_ramp import loss_vs_tokens
from stability.cases.case import finite as _finite
from stability.cases.lr_ramp import ramp_figures, update_before
from stability.cases.lr_ramp import rolling_min_index as _rolling_min_index
from stability.cases.lr_sweep import reference_index, sweep_figures
from stability.cases.shock import shock_figures
from stability.check.baseline import case_values
from stability.check.calibration import arrangements, split_runs
from stability.check.claims import claim_rows, claims_table, held_out
from stability.check.regression import paired_values, rows_of_case
from stability.check.rows import Row, judge, seed_noise, welch_dof
from stability.check.verdict import CheckResult, decide
from stability.config import ConfigError, resolve
from stability.config.schedules import BatchRamp, ExponentialRamp, Shock, Standard, lr_scale, warmup_cosine
from stability.evaluate.quantize import (
    HEAD,
    FakeQuantLinear,
    _cast_counts,
    damage,
    fake_quant_int8,
    linear_input_stats,
    output_kl,
    per_linear_damage,
    quant_figures,
    relative_output_error,
)
from stability.record import (
    RecordError,
    arm_names,
    final_figures,
    paired_summary,
    upgraded,
    usable_value,
)
from stability.record.stats import (
    T_975,
    holm,
    paired_difference,
    sample_std,
    sign_flip_p_value,
    t_critical,
    t_quantile_for_z,
    t_two_sided_mass,
    t_upper_tail,
)
from stability.train import probes

# ----------------------------------------------------------------------------- the spike detector


def test_a_spike_is_k_population_stds_above_the_window_mean():
    """History [1, 3, 1, 3] (of a window of 10): mean 2, deviations +-1, std over the 4 values held
    (not 3, not 5, not the window's 10) = 1, so with k = 2 the threshold is exactly 4: 3.99 is not a
    spike, 4.0 is (at least k std above)."""
    for value, expected in ((3.99, False), (4.0, True)):
        detector = probes.SpikeDetector(window=10, k=2.0, min_history=4)
        assert [detector.update(v) for v in (1.0, 3.0, 1.0, 3.0)] == [False] * 4
        assert detector.update(value) is expected
        assert detector.score == pytest.approx(value - 2.0)   # (value - mean 2) / std 1


def test_the_spike_score_is_the_distance_above_the_mean_in_stds():
    """Window [2, 4, 2, 4] (population std 1, mean 3): 0.5 is 2.5 std below, 7 is 4 above. Before
    min_history values, and for a non-finite value, the score is 0 (not the last one's)."""
    detector = probes.SpikeDetector(window=4, k=3.0, min_history=4)
    scores = []
    for v in (2.0, 4.0, 2.0, 4.0, 0.5, math.nan):
        detector.update(v)
        scores.append(detector.score)
    assert scores == [0.0, 0.0, 0.0, 0.0, -2.5, 0.0]
    detector.update(7.0)   # window now [4, 2, 4, 0.5]: mean 2.625, std sqrt(8.6875 / 4) = 1.47373
    assert detector.score == pytest.approx((7.0 - 2.625) / math.sqrt(8.6875 / 4))
    flat = probes.SpikeDetector(window=3, k=3.0, min_history=2)
    for v in (1.0, 1.0, 1.0 + 1e-12):
        flat.update(v)
    assert flat.score == pytest.approx(1.0, rel=1e-3)   # std 0: the distance over 1e-12


def test_local_takes_the_shard_of_a_sharded_tensor():
    """Under FSDP2 a parameter is a DTensor; the norms read the part this process holds (``to_local``)."""
    shard = torch.tensor([1.0, 2.0])

    class Sharded:   # what a DTensor offers the probes: its local shard
        def to_local(self):
            return shard

    plain = torch.ones(3)
    assert probes.local(Sharded()) is shard and probes.local(plain) is plain


def test_update_norms_by_hand():
    """Two groups: "a" holds [1, 2] (step to [4, 6]: change (3, 4), norm 5), "b" holds [0] and
    [[1, 1]] (steps to [12] and [[1, 1]]: norm 12). Global sqrt(25 + 144) = 13. A second step measures
    from the new weights: only "b"'s first weight moves, by 5."""
    a, b1, b2 = (nn.Parameter(torch.tensor(v)) for v in ([1.0, 2.0], [0.0], [[1.0, 1.0]]))
    norms = probes.UpdateNorms({"a": [a], "b": [b1, b2]})
    norms.before()
    with torch.no_grad():
        a.copy_(torch.tensor([4.0, 6.0]))
        b1.copy_(torch.tensor([12.0]))
    assert norms.after().tolist() == [13.0, 5.0, 12.0]
    norms.before()
    with torch.no_grad():
        b1.add_(-5.0)
    assert norms.after().tolist() == [5.0, 0.0, 5.0]
    assert a.tolist() == [4.0, 6.0] and b1.tolist() == [7.0]   # the weights themselves untouched


def test_update_norms_stay_on_the_parameters_device():
    """One parameter on the meta device: the norms are computed there (no host tensor mixed in)."""
    only = nn.Parameter(torch.zeros(3, device="meta"))
    norms = probes.UpdateNorms({"only": [only]})
    norms.before()
    out = norms.after()
    assert out.device.type == "meta" and out.shape == (2,)
    assert probes.SpikeDetector(window=3, k=3.0).score == 0.0   # no value yet: no distance


def test_the_exact_step_of_a_spike_in_a_loss_series():
    """window 3, k 3, min_history 3. Steps 0-2 fill the window. Step 3: window [2, 4, 2], mean 8/3,
    std sqrt(8/9 / 1 * ... ) = sqrt(((2/3)^2 * 2 + (4/3)^2) / 3) = sqrt(8/9) = 0.943, threshold 5.49:
    5 is not a spike. Step 4: window [4, 2, 5] (step 0 left it), mean 11/3, std sqrt(14/9) = 1.247,
    threshold 7.41: 7 is not. Step 5: window [2, 5, 7], mean 14/3, std sqrt(38/9) = 2.055, threshold
    10.83: 11 is. Step 6 (NaN) is a non-finite event, never a spike, and does not enter the window,
    so step 7 is judged on [5, 7, 11]: mean 23/3, std sqrt(56/9) = 2.494, threshold 15.15: 15.2 is."""
    detector = probes.SpikeDetector(window=3, k=3.0, min_history=3)
    losses = [2.0, 4.0, 2.0, 5.0, 7.0, 11.0, float("nan"), 15.2, 15.1]
    flags = [detector.update(v) for v in losses]
    assert [step for step, flag in enumerate(flags) if flag] == [5, 7]
    assert list(detector.history) == [11.0, 15.2, 15.1]


def test_a_flat_history_flags_any_rise_but_not_the_same_value():
    """std 0: the threshold is the mean itself (plus k * 1e-12)."""
    detector = probes.SpikeDetector(window=5, k=6.0, min_history=3)
    assert [detector.update(v) for v in (2.0, 2.0, 2.0, 2.0)] == [False] * 4
    assert detector.update(2.0 + 1e-9) and not probes.SpikeDetector(5, 6.0, 3).update(2.0)
    flat = probes.SpikeDetector(window=5, k=6.0, min_history=3)
    for v in (2.0, 2.0, 2.0):
        flat.update(v)
    assert not flat.update(2.0)


def test_no_spike_before_min_history_values_and_one_right_at_it():
    """min_history 3: the 3rd value is judged on 2 values (never), the 4th on 3 ([1, 1, 1]: any rise)."""
    detector = probes.SpikeDetector(window=10, k=1.0, min_history=3)
    assert [detector.update(v) for v in (1.0, 1.0, 9.0)] == [False, False, False]
    detector = probes.SpikeDetector(window=10, k=1.0, min_history=3)
    assert [detector.update(v) for v in (1.0, 1.0, 1.0, 9.0)] == [False, False, False, True]


# ----------------------------------------------------------------------------- paired statistics


def test_t_critical_is_the_tabulated_value_at_or_below_df():
    assert t_critical(1) == 12.706 and t_critical(2) == 4.303 and t_critical(20) == 2.086
    assert t_critical(22) == 2.086 and t_critical(25) == 2.060 and t_critical(1000) == 1.980
    assert math.isnan(t_critical(0))


def test_the_t_quantile_of_a_normal_tail_matches_the_t_table_and_the_closed_forms():
    """z = 1.959964 (2.5% one-sided) gives the two-sided 95% table values for every tabulated df; df = 1
    (Cauchy, t = tan(pi (1/2 - p))) and df = 2 (P(|T| < t) = t / sqrt(t^2 + 2)) have closed forms: at
    z = 3 (p = 0.0013499) they give 235.80 and 19.2067; a large df tends to z itself."""
    for df, value in T_975.items():
        assert t_quantile_for_z(1.959964, df) == pytest.approx(value, abs=1.5e-3), df
    p = 0.5 * math.erfc(3 / math.sqrt(2))
    assert t_quantile_for_z(3, 1) == pytest.approx(math.tan(math.pi * (0.5 - p)), rel=1e-9)
    a = 1 - 2 * p
    assert t_quantile_for_z(3, 2) == pytest.approx(math.sqrt(2) * a / math.sqrt(1 - a * a), rel=1e-9)
    assert t_quantile_for_z(3, 2) == pytest.approx(19.2067, abs=1e-4)
    assert 3.0 < t_quantile_for_z(3, 1000) < 3.01
    small = 1 - 2 * (0.5 * math.erfc(0.5 / math.sqrt(2)))   # z = 0.5: a t value below 1
    assert t_quantile_for_z(0.5, 2) == pytest.approx(math.sqrt(2) * small / math.sqrt(1 - small * small), rel=1e-9)
    assert t_two_sided_mass(0.0, 5) == 0.0 and t_two_sided_mass(1e9, 5) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="df=0"):
        t_two_sided_mass(1.0, 0)


def test_the_95_percent_t_interval_of_three_differences():
    """Differences 1, 2, 3 (treatment 2, 4, 6 minus baseline 1, 2, 3): mean 2, sample std 1 (divide by
    n - 1 = 2), t with n - 1 = 2 degrees of freedom 4.303, half width 4.303 / sqrt(3) = 2.48434;
    sign-flip p: of the 8 sign patterns of (1, 2, 3) only +++ and --- reach |sum| 6: 2 / 8."""
    out = paired_difference([1.0, 2.0, 3.0], [2.0, 4.0, 6.0])
    assert out["n"] == 3 and out["reference"] == 2.0 and out["treatment"] == 4.0 and out["difference"] == 2.0
    assert out["ci_low"] == pytest.approx(2 - 2.484338, abs=1e-6)
    assert out["ci_high"] == pytest.approx(2 + 2.484338, abs=1e-6)
    assert out["p_value"] == 0.25


def test_non_finite_and_missing_pairs_are_dropped_before_the_interval():
    """Only the pairs (0, 1) and (0, 3) stay: differences 1, 3, mean 2, sd sqrt(2), t(1) = 12.706,
    half width 12.706 * sqrt(2) / sqrt(2) = 12.706; p: 2 of the 4 patterns reach |sum| 4."""
    out = paired_difference([0.0, None, float("nan"), 0.0, 5.0], [1.0, 2.0, 2.0, 3.0, float("inf")])
    assert out["n"] == 2 and out["difference"] == 2.0 and out["reference"] == 0.0 and out["treatment"] == 2.0
    assert out["ci_low"] == pytest.approx(2 - 12.706) and out["ci_high"] == pytest.approx(2 + 12.706)
    assert out["p_value"] == 0.5


def test_one_pair_has_a_difference_but_no_interval_and_none_has_nothing():
    one = paired_difference([1.0], [1.5])
    assert (one["n"], one["difference"], one["ci_low"], one["ci_high"], one["p_value"]) == (1, 0.5, None, None, None)
    none = paired_difference([float("nan")], [1.0])
    assert none == {"n": 0, "reference": None, "treatment": None, "difference": None, "ci_low": None,
                    "ci_high": None, "p_value": None}


def test_sign_flip_p_counts_ties_with_the_observed_sum():
    """(0.5, 1, 2): sums of the 8 sign patterns 3.5, 2.5, 1.5, 0.5 and their negatives; only the two
    of magnitude 3.5 reach the observed 3.5: p = 2 / 8. (4, -1, -1) observed 2: |sums| 6, 4, 4, 2 each
    twice, so every pattern counts: p = 1."""
    assert sign_flip_p_value([0.5, 1.0, 2.0]) == 0.25
    assert sign_flip_p_value([4.0, -1.0, -1.0]) == 1.0
    assert sign_flip_p_value([1.0]) is None


def exact_sign_flip_p(differences: list[int]) -> float:
    """The exact sign-flip p of integer differences by counting subset sums: flipping the signs of a
    subset with |values| summing to s turns the total T = sum |d| into T - 2s (the sign pattern of the
    differences themselves does not change the distribution of |sum|)."""
    total = sum(abs(d) for d in differences)
    counts = [1] + [0] * total   # counts[s]: subsets of the |d| with sum s
    for d in map(abs, differences):
        for s in range(total, d - 1, -1):
            counts[s] += counts[s - d]
    observed = abs(sum(differences))
    return sum(c for s, c in enumerate(counts) if abs(total - 2 * s) >= observed) / 2 ** len(differences)


def test_the_sampled_sign_flip_p_above_16_pairs_is_close_to_the_exact_one():
    """17 differences (1, -2, 3, ..., 17) / 2 (sum 4.5): the exact p of the 2^17 patterns, by subset sums
    of the integers, is 0.854; the estimate from 20000 sampled patterns is within 4 standard errors
    (0.010) of it, and the same on every call (seeded)."""
    diffs = [i if i % 2 else -i for i in range(1, 18)]
    exact = exact_sign_flip_p(diffs)
    assert exact == pytest.approx(0.8536, abs=1e-4)
    error = math.sqrt(exact * (1 - exact) / 20000)
    halves = [d / 2 for d in diffs]
    assert sign_flip_p_value(halves) == pytest.approx(exact, abs=4 * error)
    assert sign_flip_p_value(halves) == sign_flip_p_value(halves)


def test_sign_flip_p_is_exact_up_to_16_pairs_and_sampled_above():
    """16 differences all 1: exact p 2 / 2^16. 17: the sampled p, never below 1 / (20000 + 1), far above
    the exact 2 / 2^17."""
    assert sign_flip_p_value([1.0] * 16) == 2 / 2 ** 16
    assert sign_flip_p_value([1.0] * 17) >= 1 / 20001


def test_a_sum_within_1e_12_of_the_observed_one_is_a_tie():
    """(2, 5e-13): observed |sum| 2 + 5e-13; the patterns +- and -+ give 2 - 5e-13, which is the observed
    sum minus 1e-12 to the last bit: rounding-level ties count as extreme, so all 4 patterns do (p 1).
    The same with 15 zero differences added (sampled: every draw is extreme)."""
    assert sign_flip_p_value([2.0, 5e-13]) == 1.0
    assert sign_flip_p_value([2.0, 5e-13] + [0.0] * 15) == 1.0


def test_the_sampled_sign_flip_p_counts_the_observed_pattern():
    """30 differences all 1: only 2 of the 2^30 patterns reach |sum| 30, so 20000 draws hit neither
    (a 1 in 27000 chance): the estimate counts the observed pattern itself, p = (0 + 1) / (20000 + 1),
    never 0 (the exact p is 2 / 2^30)."""
    assert exact_sign_flip_p([1] * 30) == 2 / 2 ** 30
    assert sign_flip_p_value([1.0] * 30) == 1 / 20001


def test_sample_std_divides_by_n_minus_one_and_survives_huge_values():
    """[1, 2, 3]: squared deviations 1, 0, 1, / (3 - 1) -> 1. [1, 3]: 2 + 2 over 1 -> sqrt(2)."""
    assert sample_std([1.0, 2.0, 3.0]) == 1.0
    assert sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2))
    assert sample_std([5.0]) == 0.0 and sample_std([]) == 0.0 and sample_std([2.0, 2.0, 2.0]) == 0.0
    assert sample_std([1e200, 2e200, 3e200]) == pytest.approx(1e200)   # squaring 1e200 would overflow
    assert sample_std([-4.0, 0.0, -2.0]) == pytest.approx(2.0)


# ----------------------------------------------------------------------------- the heavy probes


class Emit(nn.Module):
    """A block whose output (the residual stream after it) is a fixed tensor, or the tuple (output,
    extra) as the blocks of Hugging Face models return it."""

    def __init__(self, output: torch.Tensor, extra: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("output", output)
        self.extra = extra

    def forward(self, _x):
        return self.output if self.extra is None else (self.output, self.extra)


class HandModel(nn.Module):
    """Stands in for a GatedLM: two blocks with fixed residual outputs, attention maps, attention
    logits and gate scores handed to the observer, one Linear (the head) fed a fixed input, and fixed
    output logits: every figure of ``heavy_probes`` is known by hand."""

    def __init__(self, gated: bool = True, attention: bool = True):
        super().__init__()
        self.blocks = nn.ModuleList([
            # a batch of 2 sequences; |values| seven 1s and a 4: max 4, median 1 (ratio 4) (the first
            # sequence alone: max 1)
            Emit(torch.tensor([[[1.0, -1.0], [1.0, 1.0]], [[1.0, 1.0], [-4.0, 1.0]]])),
            # a tuple (residual, extra); |values| seven 2s and a 10: max 10, median 2 (ratio 5)
            Emit(torch.tensor([[[2.0, 2.0], [2.0, -2.0], [10.0, 2.0], [2.0, 2.0]]]), extra=torch.zeros(1, 4, 2)),
        ])
        self.head = nn.Linear(2, 2)
        sink = torch.tensor([[1.0, 0, 0, 0], [0.6, 0.4, 0, 0], [0.3, 0.3, 0.4, 0], [0.3, 0.2, 0.2, 0.3]])
        faint = torch.tensor([[1.0, 0, 0, 0], [0.1, 0.9, 0, 0], [0.1, 0.4, 0.5, 0], [0.1, 0, 0, 0.9]])
        local = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0.5, 0.5, 0], [0, 0, 0, 1.0]])
        self.probs = [torch.stack([sink, faint])[None], torch.stack([sink, local])[None]]   # (1, 2, 4, 4)
        self.attention = attention
        future = ~torch.ones(4, 4, dtype=torch.bool).tril()
        self.attn_logits = [torch.full((1, 2, 4, 4), -1.0).masked_fill(future, float("-inf")) for _ in range(2)]
        self.attn_logits[0][0, 1, 3, 2] = 3.0    # the largest unmasked logit of layer 0
        self.attn_logits[1][0, 0, 2, 0] = 7.5    # and of layer 1
        self.gates = [torch.tensor([0.2, 0.4]), torch.tensor([0.1, 0.3])] if gated else None
        self.out_logits = torch.zeros(1, 4, 2)
        self.out_logits[0, 3, 1] = -5.0
        self.observer = None

    def set_observer(self, observer):
        self.observer = observer

    def forward(self, tokens):
        x = tokens
        for index, block in enumerate(self.blocks):
            x = block(x)
            if self.observer is not None and self.attention:
                self.observer(index, "attn_logits", self.attn_logits[index])
                self.observer(index, "attn_probs", self.probs[index])
                if self.gates is not None:
                    self.observer(index, "gate_score", self.gates[index])
        self.head(torch.tensor([[[0.0, 0.0], [0.0, 4.0]]]))
        return self.out_logits


def test_heavy_probes_figures_of_known_activations_and_attention_maps():
    """Per layer: M-Act 4 and 10 (ratios 4 and 5): mean 7, max 10. F-Attn (queries 1..3 on token 0):
    the sink head 0.6, 0.3, 0.3 -> 0.4, the faint head 0.1, the local head 0 -> layer 0 (sink, faint)
    0.25, layer 1 (sink, local) 0.2, mean 0.225. alpha_0 (queries 0..3, query 0 included): sink head
    2.2 / 4 = 0.55 > 0.3, faint head 1.3 / 4 = 0.325 > 0.3 (without query 0 it would be 0.1), local head
    1 / 4 = 0.25 -> sink rate 1.0 and 0.5, mean 0.75. Attention logit max 3 and 7.5 -> 7.5. Gate scores
    0.3 and 0.2 -> 0.25.
    Output logits all 0 but one -5 in 2 classes: max |logit| 5, log Z log 2 at three positions and
    log(1 + e^-5) at one. Head input [0, 0, 0, 4]: centred [-1, -1, -1, 3], variance 3, fourth moment
    21, kurtosis 21 / 9; infinity norm 4."""
    model = HandModel().train()
    out = probes.heavy_probes(model, torch.zeros(1, 4, dtype=torch.long))
    layers = out["layers"]
    assert [layer["m_act"] for layer in layers] == [4.0, 10.0]
    assert [layer["m_act_ratio"] for layer in layers] == [4.0, 5.0]
    assert out["m_act_mean"] == 7.0 and out["m_act_max"] == 10.0
    assert [layer["f_attn"] for layer in layers] == pytest.approx([0.25, 0.2])
    assert out["f_attn_mean"] == pytest.approx(0.225)
    assert [layer["sink_rate"] for layer in layers] == [1.0, 0.5] and out["sink_rate_mean"] == 0.75
    assert [layer["max_attn_logit"] for layer in layers] == [3.0, 7.5] and out["max_attn_logit"] == 7.5
    assert [layer["gate_score"] for layer in layers] == pytest.approx([0.3, 0.2])
    assert out["gate_score_mean"] == pytest.approx(0.25)
    assert out["logit_max"] == 5.0
    assert out["log_z_mean"] == pytest.approx((3 * math.log(2) + math.log(1 + math.exp(-5))) / 4, rel=1e-6)
    assert out["linear_inputs"] == {"head": {"kurtosis": pytest.approx(21 / 9), "inf_norm": 4.0}}
    assert model.training and model.observer is None
    assert not model.head._forward_pre_hooks and not any(b._forward_hooks for b in model.blocks)


def test_heavy_probes_without_a_gate_have_no_gate_score():
    out = probes.heavy_probes(HandModel(gated=False).eval(), torch.zeros(1, 4, dtype=torch.long))
    assert out["gate_score_mean"] is None and all("gate_score" not in layer for layer in out["layers"])


def test_heavy_probes_of_a_model_that_shows_no_attention():
    """No observer call (attention the probes cannot see): the attention and gate figures are None, M-Act
    stays."""
    out = probes.heavy_probes(HandModel(attention=False), torch.zeros(1, 4, dtype=torch.long))
    assert (out["f_attn_mean"], out["sink_rate_mean"], out["max_attn_logit"]) == (None, None, None)
    assert out["m_act_max"] == 10.0 and out["layers"] == [{"m_act": 4.0, "m_act_ratio": 4.0},
                                                          {"m_act": 10.0, "m_act_ratio": 5.0}]


def test_layer_of_and_layer_groups_with_block_names():
    """A wrapped model names its blocks ("inner.layers.1"): a module below block i, or block i itself,
    is in layer i; "inner.layers.10" is not below "inner.layers.1" (the prefix ends with a dot)."""
    names = [f"inner.layers.{i}" for i in range(11)]
    assert probes.layer_of("inner.layers.1.attn.q_proj", names) == 1
    assert probes.layer_of("inner.layers.1", names) == 1 and probes.layer_of("inner.layers.10.mlp", names) == 10
    assert probes.layer_of("inner.norm", names) is None and probes.layer_of("blocks.0.attn", names) is None
    model = nn.Module()
    model.inner = nn.Module()
    model.inner.embed_tokens = nn.Embedding(3, 2)
    model.inner.layers = nn.ModuleList([nn.Linear(2, 2, bias=False) for _ in range(11)])
    model.blocks = nn.ModuleList([nn.Linear(2, 2, bias=False)])   # not the named blocks: in "head"
    model.block_names = names
    groups = probes.layer_groups(model)
    assert list(groups) == ["embed"] + [f"layer{i}" for i in range(11)] + ["head"]
    assert groups["layer1"] == [model.inner.layers[1].weight] and groups["layer10"] == [model.inner.layers[10].weight]
    assert groups["head"] == [model.blocks[0].weight] and groups["embed"] == [model.inner.embed_tokens.weight]


# ----------------------------------------------------------------------------- the record's figures

NAN, INF = float("nan"), float("inf")


# the model figures of a heavy-probe snapshot (stability.train.probes.heavy_probes)
PROBE_FIGURES = ("m_act_mean", "m_act_max", "f_attn_mean", "sink_rate_mean", "max_attn_logit", "gate_score_mean",
                 "logit_max", "log_z_mean")


def hand_arm(status: str = "diverged") -> dict:
    """12 steps of an arm (``new_arm_record`` layout) with every series chosen for its figures."""
    steps = 12
    return {
        "arm": "reference", "seed": 0, "status": status, "diverged_at_step": 11 if status == "diverged" else None,
        "series": {
            "loss": [5.0, 4.0, 3.0, NAN, 2.0, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2],
            "grad_norm": [1.0, 2.0, INF, 7.0, NAN, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            "loss_spike": [False, False, True, False, True, False, False, False, False, False, True, False],
            "grad_spike": [False, True] + [False] * (steps - 2),
            "skipped": [False] * (steps - 1) + [True],
        },
        "events": [{"step": 3, "kind": "loss"}],
        "probes": [{"m_act_mean": 0.0, "m_act_max": 0.0, "f_attn_mean": 0.0, "sink_rate_mean": 0.0,
                    "max_attn_logit": 0.0, "gate_score_mean": None, "logit_max": 0.0, "log_z_mean": 0.0},
                   {"m_act_mean": 1.0, "m_act_max": 2.0, "f_attn_mean": 0.1, "sink_rate_mean": 0.0,
                    "max_attn_logit": 3.0, "gate_score_mean": None, "logit_max": 4.0, "log_z_mean": 5.0},
                   {"m_act_mean": 10.0, "m_act_max": 20.0, "f_attn_mean": 0.5, "sink_rate_mean": 0.25,
                    "max_attn_logit": 30.0, "gate_score_mean": 0.2, "logit_max": 40.0, "log_z_mean": 6.0}],
        "precision_stats": [{"overflow_fraction": 0.1, "underflow_fraction": 0.0, "scale_drops": 2},
                            {"overflow_fraction": None, "underflow_fraction": 0.5, "scale_drops": 1},
                            {"overflow_fraction": 0.3, "underflow_fraction": NAN}],
    }


def test_final_figures_of_a_twelve_step_arm():
    """Last 10 losses 3, NaN, 2, 1.5, 1, 1, 1, 1, 1, 1.2: the 9 finite sum to 12.7, mean 12.7 / 9; the
    lowest finite loss 1. Spikes: 3 of 12 steps (25%) and 1 of 12 (8.33%). Largest finite gradient norm
    7. Overflow over the snapshots that have one: (0.1 + 0.3) / 2; underflow (0 + 0.5) / 2; scale drops
    2 + 1 + 0. The probe figures are the last snapshot's."""
    final = final_figures(hand_arm(), steps_planned=40)
    assert final["steps_completed"] == 12
    assert final["final_train_loss"] == pytest.approx(12.7 / 9)
    assert final["min_train_loss"] == 1.0
    assert final["loss_spike_score"] == 25.0 and final["grad_spike_score"] == pytest.approx(100 / 12)
    assert (final["loss_spikes"], final["grad_spikes"], final["nonfinite_events"], final["skipped_steps"]) == \
        (3, 1, 1, 1)
    assert final["max_grad_norm"] == 7.0
    assert final["diverged"] is True and final["divergence_step"] == 11
    assert {k: final[k] for k in PROBE_FIGURES} == hand_arm()["probes"][-1]
    arm = hand_arm()
    arm["probes"][-1].update(step=11, layers=[{"m_act": 10.0}], linear_inputs={"blocks.0.w_up": {"kurtosis": 3.0}})
    assert set(final_figures(arm, steps_planned=40)) == set(final)   # step, layers, Linear inputs: no figures
    assert final["overflow_fraction"] == pytest.approx(0.2) and final["underflow_fraction"] == 0.25
    assert final["loss_scale_drops"] == 3


def test_final_figures_of_a_completed_arm_without_steps_probes_or_precision_stats():
    arm = hand_arm("completed")
    assert final_figures(arm, steps_planned=40)["divergence_step"] == 40   # never diverged: the planned steps
    arm.update(series={k: [] for k in arm["series"]}, events=[], probes=[], precision_stats=[])
    final = final_figures(arm, steps_planned=40)
    assert math.isnan(final["final_train_loss"]) and math.isnan(final["min_train_loss"])
    assert math.isnan(final["max_grad_norm"]) and final["loss_spike_score"] == 0.0
    assert final["diverged"] is False and final["steps_completed"] == 0
    assert not set(final) & {*PROBE_FIGURES, "overflow_fraction", "underflow_fraction", "loss_scale_drops"}


def test_update_norm_figures_by_hand():
    """Update norms 0.5, NaN, 3, None, 2 then 1s (12 steps): the largest finite 3; update spikes at steps
    1 and 4: 2 of 12 steps, 16.67%. An arm without the series (an older record) has none of them."""
    arm = hand_arm()
    arm["series"]["update_norm"] = [0.5, NAN, 3.0, None, 2.0] + [1.0] * 7
    arm["series"]["update_spike"] = [False, True, False, False, True] + [False] * 7
    final = final_figures(arm, steps_planned=40)
    assert final["max_update_norm"] == 3.0 and final["update_spikes"] == 2
    assert final["update_spike_score"] == pytest.approx(100 * 2 / 12)
    arm["series"]["update_norm"] = [NAN] * 11 + [None]
    assert math.isnan(final_figures(arm, steps_planned=40)["max_update_norm"])
    assert not {"max_update_norm", "update_spikes", "update_spike_score"} & set(final_figures(hand_arm(), 40))

def test_usable_value_drops_what_a_comparison_cannot_use():
    diverged = {"status": "diverged", "final": {"heldout_loss": 3.0, "loss_spikes": 4, "diverged": True,
                                                "max_grad_norm": INF, "nonfinite_events": None, "note": "x"}}
    assert usable_value(diverged, "heldout_loss") is None      # an eval figure of a broken model
    assert usable_value(diverged, "loss_spikes") == 4.0 and isinstance(usable_value(diverged, "loss_spikes"), float)
    assert usable_value(diverged, "diverged") == 1.0
    assert usable_value(diverged, "max_grad_norm") is None and usable_value(diverged, "nonfinite_events") is None
    assert usable_value(diverged, "note") is None and usable_value(diverged, "absent") is None
    completed = {"status": "completed", "final": {"heldout_loss": 3.0, "diverged": False}}
    assert usable_value(completed, "heldout_loss") == 3.0 and usable_value(completed, "diverged") == 0.0
    assert usable_value({"status": "completed"}, "heldout_loss") is None


def test_arm_names_put_the_baseline_first_then_the_order_of_appearance():
    arms = [{"arm": "zeta"}, {"arm": "gated"}, {"arm": "reference"}, {"arm": "zeta"}, {"arm": "alpha"}]
    assert arm_names(arms) == ["reference", "zeta", "gated", "alpha"]


def paired_arm(arm: str, seed: int, status: str = "completed", **final) -> dict:
    return {"arm": arm, "seed": seed, "status": status, "final": final}


def test_paired_summary_by_hand():
    """heldout_loss baseline 1, 2, 3 and gated 2, 4, 6 in seeds 0-2: the interval of differences 1, 2, 3
    (2 +- 4.303 / sqrt(3)), p 0.25. Seed 3 has no gated arm: left out. accuracy is missing in the gated
    arm of seed 1: pairs of seeds 0 and 2 only (differences 0.1 and 0.3). A figure outside the table
    ("comment", named before the figures after it), a detail kept beside the figures (loss_spikes, 2 in
    every arm: a count, never paired) and one that no arm measured (f_attn_mean None everywhere) get no
    row; the rows come in name order."""
    arms = [paired_arm("reference", s, heldout_loss=float(s + 1), accuracy=0.5, f_attn_mean=None, comment=1.0,
                       loss_spikes=2) for s in range(4)]
    arms += [paired_arm("gated", 0, heldout_loss=2.0, accuracy=0.6, f_attn_mean=None, z_note=2.0, loss_spikes=2),
             paired_arm("gated", 1, heldout_loss=4.0, f_attn_mean=None, loss_spikes=2),
             paired_arm("gated", 2, heldout_loss=6.0, accuracy=0.8, f_attn_mean=None, loss_spikes=2)]
    summary = paired_summary(arms)
    assert list(summary) == ["gated"] and list(summary["gated"]) == ["accuracy", "heldout_loss"]
    loss = summary["gated"]["heldout_loss"]
    assert (loss["n"], loss["reference"], loss["treatment"], loss["difference"]) == (3, 2.0, 4.0, 2.0)
    assert loss["ci_low"] == pytest.approx(2 - 2.484338, abs=1e-6)
    assert loss["ci_high"] == pytest.approx(2 + 2.484338, abs=1e-6)
    assert loss["p_value"] == 0.25 and loss["better"] == "lower" and loss["seeds"] == [0, 1, 2]
    accuracy = summary["gated"]["accuracy"]
    assert accuracy["seeds"] == [0, 2] and accuracy["n"] == 2 and accuracy["better"] == "higher"
    assert accuracy["difference"] == pytest.approx(0.2) and accuracy["treatment"] == pytest.approx(0.7)


def test_paired_summary_against_another_arm():
    """Reference "gated": every other arm (the baseline first) minus gated, per seed. heldout_loss gated
    2, 3; floored 2.5, 3.5 (differences 0.5, 0.5); baseline 3, 5 (differences 1, 2)."""
    arms = [paired_arm("gated", 0, heldout_loss=2.0), paired_arm("floored", 0, heldout_loss=2.5),
            paired_arm("reference", 0, heldout_loss=3.0), paired_arm("gated", 1, heldout_loss=3.0),
            paired_arm("floored", 1, heldout_loss=3.5), paired_arm("reference", 1, heldout_loss=5.0)]
    summary = paired_summary(arms, reference="gated")
    assert list(summary) == ["reference", "floored"]
    floored, baseline = summary["floored"]["heldout_loss"], summary["reference"]["heldout_loss"]
    assert (floored["reference"], floored["treatment"], floored["difference"]) == (2.5, 3.0, 0.5)
    assert (baseline["reference"], baseline["treatment"], baseline["difference"], baseline["n"]) == (2.5, 4.0, 1.5, 2)

def test_paired_summary_keeps_a_figure_that_lost_every_pair():
    """The held-out loss of a diverged arm is unusable in every seed: the row stays, with n = 0, so the
    comparison shows the figure could not be compared (rather than hiding it)."""
    arms = [paired_arm("reference", 0, heldout_loss=3.0), paired_arm("gated", 0, "diverged", heldout_loss=9.0)]
    row = paired_summary(arms)["gated"]["heldout_loss"]
    assert row["n"] == 0 and row["difference"] is None and row["seeds"] == []


def test_paired_summary_of_arms_without_figures():
    """An arm record may lack "final" (stopped before its first step): it pairs nothing."""
    arms = [{"arm": "reference", "seed": 0, "status": "killed"}, paired_arm("gated", 0, heldout_loss=2.0),
            paired_arm("reference", 1, heldout_loss=1.0), {"arm": "gated", "seed": 1, "status": "killed"}]
    row = paired_summary(arms)["gated"]["heldout_loss"]
    assert row["n"] == 0 and row["seeds"] == []


# ----------------------------------------------------------------------------- the merge check


def replicates(**seeds) -> dict:
    """seed -> {replicate: value}: ``replicates(s0=[3.0, 3.1])`` is seed "0" with replicates "0" and "1"."""
    return {name[1:]: {str(r): v for r, v in enumerate(values)} for name, values in seeds.items()}


def test_the_one_sided_t_tail_by_hand():
    """P(T > t): 1/2 at 0; with 1 df (Cauchy) 1/2 - atan(t)/pi: 1/4 at 1; 1 minus the upper tail below 0;
    with 2 df (1 - t / sqrt(t^2 + 2)) / 2: at t = 0.5, sqrt(2.25) = 1.5, so (1 - 1/3) / 2 = 1/3 (a t
    between 0 and 1 is an upper tail below 1/2, not its complement 2/3); far out, where the two-sided mass
    rounds a hair above 1 (12 df at t = 520), 0 and never negative."""
    assert t_upper_tail(0.0, 5) == pytest.approx(0.5)
    assert t_upper_tail(1.0, 1) == pytest.approx(0.25) and t_upper_tail(-1.0, 1) == pytest.approx(0.75)
    assert t_upper_tail(0.5, 2) == pytest.approx(1 / 3) and t_upper_tail(-0.5, 2) == pytest.approx(2 / 3)
    assert t_upper_tail(3.0, 2) == pytest.approx((1 - 3 / math.sqrt(11)) / 2)
    assert 1 - t_two_sided_mass(520, 12) < 0 and t_upper_tail(520, 12) == 0.0


def test_seed_noise_by_hand():
    """Seed 0: 1.0, 3.0 (mean 2, sample variance 2, 1 df); seed 1: 5.0, 5.0, 5.0 (variance 0: below the
    quantum 0.5, so 0.25 with infinite df); seed 2: one run, the mean variance of the seeds that have
    two or more ((2 + 0) / 2 = 1) with their summed df (1 + 2 = 3)."""
    noise = seed_noise({"0": [1.0, 3.0], "1": [5.0, 5.0, 5.0], "2": [7.0]}, 0.5)
    assert noise == {"0": (2.0, 1), "1": (0.25, math.inf), "2": (1.0, 3)}
    assert seed_noise({"0": [1.0], "1": [2.0]}, 0.0) == {"0": (0.0, math.inf), "1": (0.0, math.inf)}
    assert seed_noise({"0": [1.0, 3.0]}, 2.0) == {"0": (4.0, math.inf)}   # at the quantum: the quantum
    assert seed_noise({"0": [1.0, 3.0]}, 1.4) == {"0": (2.0, 1)}           # 1.96 < 2: the spread


def test_welch_dof_by_hand():
    """(2 + 2)^2 / (2^2/1 + 2^2/1) = 2; one term of 3 df alone: 3; terms of infinite df add no spread."""
    assert welch_dof([(2.0, 1), (2.0, 1)]) == pytest.approx(2.0)
    assert welch_dof([(5.0, 3)]) == pytest.approx(3.0)
    assert welch_dof([(5.0, 3), (1.0, math.inf)]) == pytest.approx(36 / (25 / 3))
    assert welch_dof([(1.0, math.inf)]) == math.inf and welch_dof([(1.0, 0)]) == math.inf


def test_one_row_paired_by_hand():
    """heldout_loss (lower is better, floor 0.02, rel_floor 0.005). Seed 0: 3.0, 3.2 (mean 3.1, variance
    0.02); seed 1: 3.3, 3.5 (mean 3.4, variance 0.02). Baseline 3.25, floor max(0.02, 0.01625) = 0.02.
    Now 3.5 and 3.8: delta ((3.5 - 3.1) + (3.8 - 3.4)) / 2 = 0.4; se sqrt(2 * 0.02 * 1.5) / 2 = 0.12247;
    Welch df (0.06)^2 / (2 * 0.03^2) = 2 (the check's own rule takes the fewest of any seed, 1); z (0.4 - 0.02)
    / se = 3.1027; p = P(T_2 > z). The change (no floor) asks every seed: each moved 0.4 against its own
    standard error sqrt(0.02 * 1.5) = 0.17321 on 1 df, the weaker seed's p doubled, 2 P(T_1 > 0.4 / 0.17321)."""
    stats = judge(replicates(s0=[3.0, 3.2], s1=[3.3, 3.5]), {"0": 3.5, "1": 3.8}, "heldout_loss", dof_rule="welch")
    se = math.sqrt(2 * 0.02 * 1.5) / 2
    assert stats == {"baseline": pytest.approx(3.25), "current": pytest.approx(3.65), "delta": pytest.approx(0.4),
                     "floor": pytest.approx(0.02), "noise": pytest.approx(math.sqrt(0.02)), "se": pytest.approx(se),
                     "z": pytest.approx(0.38 / se), "p": pytest.approx(t_upper_tail(0.38 / se, 2)),
                     "mode": "n=2 df=2", "note": "", "p_improved": pytest.approx(t_upper_tail(-0.42 / se, 2)),
                     "p_change": pytest.approx(2 * t_upper_tail(0.4 / math.sqrt(0.03), 1)),
                     "se_seed": pytest.approx(math.sqrt(0.03))}
    better = judge(replicates(s0=[3.0, 3.2], s1=[3.3, 3.5]), {"0": 2.5, "1": 2.8}, "heldout_loss", dof_rule="welch")
    assert better["z"] == pytest.approx(-0.62 / se) and better["p_improved"] == pytest.approx(t_upper_tail(0.58 / se, 2))
    higher = judge(replicates(s0=[0.5, 0.5], s1=[0.6, 0.6]), {"0": 0.4, "1": 0.5}, "accuracy", quantum=0.01)
    assert higher["delta"] == pytest.approx(-0.1) and higher["floor"] == pytest.approx(0.005)
    assert higher["se"] == pytest.approx(math.sqrt(2 * 1e-4 * 1.5) / 2) and higher["mode"] == "n=2 df=inf"
    assert higher["z"] == pytest.approx(0.095 / higher["se"])
    assert higher["p"] == pytest.approx(0.5 * math.erfc(0.095 / higher["se"] / math.sqrt(2)))


def test_a_change_is_a_move_every_seed_shows_by_hand():
    """heldout_loss, three seeds of three replicates 3.0 +/- 0.01 (variance 1e-4, 2 df; a seed's difference from
    its mean has standard error sqrt(1e-4 * 4/3) = 0.011547). One seed 0.1 out (8.7 of them; job 153's
    pattern: a heavy tail in one run): the mean over seeds moves 0.0333 with standard error 0.011547 / sqrt(3),
    z 5, which the mean's two-sided test would call a change (2 P(T_2 > 5) = 0.038), but two seeds did not move,
    so "every seed moved" has p 1. All three 0.1 out: 2 P(T_2 > 0.1 / 0.011547). Two up, one down: p 1 (no
    direction that every seed shows). The regressed hypothesis keeps the mean: the one seed 1.0 out is worse
    than the floor 0.02 by 0.313, z 47."""
    base = replicates(s0=[2.99, 3.0, 3.01], s1=[3.09, 3.1, 3.11], s2=[3.19, 3.2, 3.21])
    se_seed = math.sqrt(1e-4 * 4 / 3)
    one = judge(base, {"0": 3.1, "1": 3.1, "2": 3.2}, "heldout_loss")
    assert one["delta"] == pytest.approx(0.1 / 3) and one["se"] == pytest.approx(se_seed / math.sqrt(3))
    assert 2 * t_upper_tail(one["delta"] / one["se"], 2) < 0.05 and one["p_change"] == 1.0
    every = judge(base, {"0": 3.1, "1": 3.2, "2": 3.3}, "heldout_loss")
    assert every["p_change"] == pytest.approx(2 * t_upper_tail(0.1 / se_seed, 2))
    assert every["se_seed"] == pytest.approx(se_seed)
    either = judge(base, {"0": 3.1, "1": 3.2, "2": 3.1}, "heldout_loss")
    assert either["p_change"] == 1.0
    worse = judge(base, {"0": 4.0, "1": 3.1, "2": 3.2}, "heldout_loss")
    assert worse["z"] == pytest.approx((1.0 / 3 - 0.02) / worse["se"]) and worse["p"] < 1e-3
    assert worse["p_change"] == 1.0


def test_one_row_tolerances_and_seeds_left_out_by_hand():
    """A tolerance floor replaces the table's; rel_floor 0.5 of the baseline 3.25 gives 1.625. A current
    seed the baseline lacks is left out of the row (the case notes it); with no seed in common there is
    nothing to judge (the check refuses such a job before any row)."""
    base = replicates(s0=[3.0, 3.2], s1=[3.3, 3.5])
    assert judge(base, {"0": 3.5, "1": 3.8}, "heldout_loss", tolerance={"floor": 1.0})["floor"] == 1.0
    assert judge(base, {"0": 3.5, "1": 3.8}, "heldout_loss", tolerance={"rel_floor": 0.5})["floor"] == \
        pytest.approx(1.625)
    extra = judge(base, {"0": 3.5, "1": 3.8, "7": 9.0}, "heldout_loss")
    assert extra["mode"] == "n=2 df=1" and extra["delta"] == pytest.approx(0.4)
    assert extra["current"] == pytest.approx(3.65)
    other = judge(base, {"5": 3.5, "6": 3.8}, "heldout_loss")
    assert (other["baseline"], other["p"], other["mode"]) == (pytest.approx(3.25), None, "")


def test_a_figure_new_or_gone_by_hand():
    """No finite baseline value: nothing to judge. No current value at any seed: no statistics (the
    outcome rule fails the job for a value gone non-finite). One seed's value only: that seed judged, its two
    identical runs (variance 0) at one fp32 rounding step of 3.0: se = 3 2^-23 sqrt(1 + 1/2)."""
    assert judge(replicates(s0=[None]), {"0": 3.0}, "heldout_loss") == {
        "baseline": None, "current": 3.0, "delta": None, "floor": None, "noise": None, "se": None, "z": None,
        "p": None, "mode": "", "note": "", "p_improved": None, "p_change": None, "se_seed": None}
    gone = judge(replicates(s0=[3.0, 3.0], s1=[3.0, 3.0]), {"0": None, "1": None}, "heldout_loss")
    assert (gone["baseline"], gone["current"], gone["p"]) == (3.0, None, None)
    half = judge(replicates(s0=[3.0, 3.0], s1=[3.0, 3.0]), {"0": 3.0, "1": None}, "heldout_loss")
    # identical baseline runs: judged at one fp32 rounding step of the value (rows.FP32_RESOLUTION), not at zero width
    assert half["mode"] == "n=1 df=inf" and half["se"] == pytest.approx(3.0 * 2 ** -23 * math.sqrt(1.5))
    assert half["z"] == pytest.approx(-0.02 / half["se"]) and half["p"] == 1.0 and half["p_improved"] == 1.0
    assert half["p_change"] == 1.0   # no move at all
    jump = judge(replicates(s0=[3.0, 3.0]), {"0": 3.5}, "heldout_loss")
    assert jump["z"] > 1e5 and jump["p"] == 0.0 and jump["p_change"] == 0.0


def two_seed_baseline() -> dict:
    """A standard case's baseline by hand: two seeds of two completed replicates, held-out loss 3.0 in the
    reference arm and 2.9 in the gated arm in every run."""
    done = {"0": {"0": "completed", "1": "completed"}, "1": {"0": "completed", "1": "completed"}}
    return {"config": {}, "steps": 10, "case": "standard", "arms": {
        "reference": {"status": done, "diverged_at_step": {},
                      "figures": {"heldout_loss": replicates(s0=[3.0, 3.0], s1=[3.0, 3.0])}},
        "gated": {"status": done, "diverged_at_step": {},
                  "figures": {"heldout_loss": replicates(s0=[2.9, 2.9], s1=[2.9, 2.9])}}}}


def test_rows_of_one_case_by_hand():
    """Arms baseline and gated, two seeds of two replicates; arm "new" only in the job (a note). baseline:
    heldout_loss 3.0 everywhere, unchanged: ok. gated: seed 1's held-out loss went non-finite in a completed
    run: a failed outcome naming case, arm and seed, and its row judges seed 0 alone; accuracy only now:
    new. Paired gated - reference: heldout_loss from seed 0; accuracy has no reference arm value: no row."""
    base = two_seed_baseline()
    now = {"0": {"0": "completed"}, "1": {"0": "completed"}}
    case = {"config": {}, "steps": 10, "arms": {
        "reference": {"status": now, "diverged_at_step": {}, "figures": {"heldout_loss": {"0": {"0": 3.0}, "1": {"0": 3.0}}}},
        "gated": {"status": now, "diverged_at_step": {}, "figures": {"heldout_loss": {"0": {"0": 2.9}, "1": {"0": None}},
                                                                      "accuracy": {"0": {"0": 0.6}}}},
        "new": {"status": now, "diverged_at_step": {}, "figures": {}}}}
    result = CheckResult()
    rows_of_case(result, "c/standard", base, case, {})
    assert result.notes == ["case c/standard: arm new is not in the baseline (new arm): not compared"]
    assert [o.reason for o in result.outcomes] == [
        ("case c/standard arm gated seed 1: heldout_loss is non-finite now; finite in every one of the 2 "
         "baseline runs of this seed")]
    rows = [(r.arm, r.figure, r.verdict, r.p, r.tier, r.mode) for r in result.rows]
    assert rows == [("reference", "heldout_loss", "ok", 1.0, "primary", "n=2 df=inf"),
                    ("gated", "heldout_loss", "ok", 1.0, "primary", "n=1 df=inf"),
                    ("gated", "accuracy", "new", None, "advisory", ""),
                    ("gated-reference", "heldout_loss", "ok", 1.0, "primary", "n=1 df=inf")]


def test_a_paired_difference_is_judged_at_its_operands_rounding_step():
    """Gated 2.9 and reference 3.0 in every baseline run; the job's gated arm one fp32 rounding step of 3.0
    lower (2.9 - 2^-22: its last bit moved). The paired difference (-0.1) is 30x smaller than its operands,
    but it moves by their rounding step: judged at 2^-23 x (2.9 + 3.0), the move is about one step (no change),
    where the difference's own rounding step (2^-23 x 0.1) would call it a change at z ~ 20."""
    base = two_seed_baseline()
    now = {"0": {"0": "completed"}, "1": {"0": "completed"}}
    moved = 2.9 - 2.0 ** -22
    case = {"config": {}, "steps": 10, "arms": {
        "reference": {"status": now, "diverged_at_step": {}, "figures": {"heldout_loss": {"0": {"0": 3.0}, "1": {"0": 3.0}}}},
        "gated": {"status": now, "diverged_at_step": {}, "figures": {"heldout_loss": {"0": {"0": moved}, "1": {"0": moved}}}}}}
    result = CheckResult()
    rows_of_case(result, "c/standard", base, case, {})
    paired = next(r for r in result.rows if r.arm == "gated-reference")
    assert paired.se == pytest.approx(2.0 ** -23 * 5.9 * math.sqrt(1.5) / math.sqrt(2), rel=1e-9)
    assert abs(paired.delta / paired.se) < 1 and paired.p_change > 0.3
    assert paired.se > 20 * 2.0 ** -23 * 0.1


def test_holm_rejects_a_p_exactly_at_its_threshold():
    """Holm rejects the i-th smallest p (from 0) while p <= alpha / (m - i), equality included. alpha 0.05,
    m = 2: 0.025 = 0.05 / 2 (halving is exact in binary, so the two are the same double) is rejected,
    then 0.05 = 0.05 / 1 is too; 0.0250001 is not, and stops the second. One p of 0.01 at alpha 0.01: 0.01
    / 1, rejected."""
    assert holm([0.05, 0.025], 0.05) == [True, True]
    assert holm([0.05, 0.0250001], 0.05) == [False, False]
    assert holm([0.01], 0.01) == [True]


def test_decide_by_hand():
    """Primary rows: Holm at alpha 0.05 over their eight hypotheses (worse by the floor p, moved at all p_change):
    sorted 0, 0, 0.001, 0.002, 0.02, ... against 0.05/8, /7, /6, /5, /4: the first four are rejected, 0.02 > 0.0125
    stops it. The first row regressed (p 0.001), the second changed (moved, p_change 0.002, not worse by its
    floor), the third is ok, a row without a p is not judged, the last regressed (both rejected: regressed wins).
    Declared floor_only, the second row has one hypothesis and stays ok (7 hypotheses: 0.001 <= 0.05/5 still
    rejected). Advisory rows: Holm over their own family marks "worse" (0.001 <= 0.05/2), never "regressed", and
    the job passes on them alone; "improved" at alpha / rows."""
    def row(p, p_change=None, tier="primary", p_improved=None, floor_only=False):
        return Row("c", "a", "heldout_loss", "lower", 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, p, "ok",
                   p_improved=p_improved, p_change=p_change, tier=tier, floor_only=floor_only)
    result = CheckResult(alpha=0.05, rows=[row(0.001, 0.5), row(0.3, 0.002), row(0.3, 0.02), row(None),
                                           row(0.0, 0.0)])
    decide(result)
    assert [r.verdict for r in result.rows] == ["regressed", "changed", "ok", "ok", "regressed"]
    assert result.hypotheses == 8 and result.exit_code == 1
    floor_only = CheckResult(alpha=0.05, rows=[row(0.001, 0.5), row(0.3, 0.002, floor_only=True), row(0.3, 0.02)])
    decide(floor_only)
    assert [r.verdict for r in floor_only.rows] == ["regressed", "ok", "ok"] and floor_only.hypotheses == 5
    changed = CheckResult(alpha=0.05, rows=[row(0.3, 0.002), row(0.3, 0.4)])
    decide(changed)
    assert [r.verdict for r in changed.rows] == ["changed", "ok"] and changed.exit_code == 3
    advisory = CheckResult(alpha=0.05, rows=[row(0.001, tier="advisory"), row(0.4, tier="advisory", p_improved=0.001)])
    decide(advisory)
    assert [r.verdict for r in advisory.rows] == ["worse", "improved"] and advisory.exit_code == 0


def test_split_runs_by_hand():
    """Replicate 1 out of a baseline of replicates 0, 1, 2: the kept baseline has 0 and 2, the picked case only
    1."""
    arm = {"status": {"0": {"0": "completed", "1": "diverged", "2": "completed"}},
           "diverged_at_step": {"0": {"0": None, "1": 5, "2": None}},
           "figures": {"x": {"0": {"0": 1.0, "1": 2.0, "2": 3.0}}, "y": {"0": {"0": 1.0}}}}
    baseline = {"replicates": [0, 1, 2], "cases": {"c": {"fingerprint": "f", "arms": {"gated": arm}}}}
    kept, picked = split_runs(baseline["cases"], lambda seed: "1")
    assert kept["c"]["arms"]["gated"] == {
        "status": {"0": {"0": "completed", "2": "completed"}}, "diverged_at_step": {"0": {"0": None, "2": None}},
        "figures": {"x": {"0": {"0": 1.0, "2": 3.0}}, "y": {"0": {"0": 1.0}}}}
    assert picked["c"]["arms"]["gated"] == {"status": {"0": {"1": "diverged"}}, "diverged_at_step": {"0": {"1": 5}},
                                            "figures": {"x": {"0": {"1": 2.0}}}}
    assert picked["c"]["fingerprint"] == "f"
    assert list(arrangements({"replicates": [0, 1], "cases": {"c": {"arms": {"g": {"status": {"0": {}, "1": {}}}}}}})) \
        == [{"0": "0", "1": "0"}, {"0": "0", "1": "1"}, {"0": "1", "1": "0"}, {"0": "1", "1": "1"}]


def test_paired_values_need_both_arms():
    """gated - reference per seed (and replicate) where both arms hold the figure: seed 0 only (seed 1 has no
    baseline value). A case without the reference arm, or an arm without figures, pairs nothing."""
    arms = {"reference": {"figures": {"x": {"0": 1.0}}}, "gated": {"figures": {"x": {"0": 3.0, "1": 4.0}}}}
    assert paired_values(arms, "gated", "x", nested=False) == {"0": 2.0}
    nested = {"reference": {"figures": {"x": {"0": {"0": 1.0, "1": 2.0}}}},
              "gated": {"figures": {"x": {"0": {"0": 3.0, "1": None, "2": 9.0}}}}}
    assert paired_values(nested, "gated", "x", nested=True) == {"0": {"0": 2.0, "1": None}}
    assert paired_values({"gated": arms["gated"]}, "gated", "x", nested=False) == {}
    assert paired_values({"reference": {}, "gated": arms["gated"]}, "gated", "x", nested=False) == {}
    assert paired_values({"reference": arms["reference"], "gated": {}}, "gated", "x", nested=False) == {}


def test_case_values_keep_the_record_ids_and_name_the_record_that_breaks_a_case():
    """Two records of case smoke/standard (seeds 0 and 1): both ids kept, in order. A third with 31 steps
    instead of 60 is named as record #3 with the field that differs; seed 1 twice, as record #3 too; a
    replicate of seed 1 is another run of it, not a repeat."""
    first, second = pair_record(seeds=(0,)), pair_record(seeds=(1,))
    first["id"], second["id"] = "first", "second"
    cases = case_values([first, second, replicate(second, 3)])
    assert cases["smoke/standard"]["records"] == ["first", "second", "secondd3"]
    assert sorted(cases["smoke/standard"]["arms"]["gated"]["status"]["1"]) == ["0", "3"]
    assert cases["smoke/standard"]["steps"] == 60 and cases["smoke/standard"]["case"] == "standard"
    older = upgraded(as_schema_3(first, stress="pair"))   # before the plain pair was called "standard": the same case
    assert case_values([older])["smoke/standard"]["case"] == "standard"
    other = {**pair_record(seeds=(2,), steps=31), "id": "third"}
    with pytest.raises(RecordError) as error:
        case_values([first, second, other])
    assert str(error.value) == ("record #3 (smoke/standard, id third): case smoke/standard appears with two different "
                                "configs among the records (run.steps: baseline 60, record 31)")
    with pytest.raises(RecordError) as error:
        case_values([first, second, {**second, "id": "again"}])
    assert str(error.value) == ("record #3 (smoke/standard, id again): case smoke/standard arm reference seed 1 "
                                "replicate 0 appears twice among the records (pass one run directory, or records of "
                                "distinct seeds)")


# ----------------------------------------------------------------------------- schedules


def hand_run(**overrides):
    """A run of 12 steps at peak LR 1.0, 4 warmup steps, cosine to 0.1, batch 8."""
    settings = {"steps": 12, "optim.lr": 1.0, "optim.warmup_steps": 4, "optim.min_lr_ratio": 0.1,
                "data.batch_size": 8, **overrides}
    return resolve("smoke", settings).run


def test_warmup_then_cosine_by_hand():
    """Warmup: lr * (step + 1) / 4 -> 0.25, 0.5, 0.75, 1. Then progress (step - 4) / (12 - 4):
    step 4 -> 0 -> 1.0; step 8 -> 0.5 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi / 2)) = 0.55; step 6 -> 0.25 ->
    0.1 + 0.45 * (1 + cos(pi / 4)) = 0.86820; step 12 and after -> the floor 0.1."""
    run = hand_run()
    lrs = [warmup_cosine(step, run) for step in (0, 1, 2, 3, 4, 6, 8, 12, 30)]
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 0.1 + 0.45 * (1 + math.sqrt(0.5)), 0.55, 0.1, 0.1])
    assert [Standard().lr_at(s, run) for s in (0, 8)] == pytest.approx([0.25, 0.55])
    assert [warmup_cosine(s, hand_run(**{"optim.lr_schedule": "constant"})) for s in (0, 4, 11)] == \
        pytest.approx([0.25, 1.0, 1.0])
    no_warmup = hand_run(**{"optim.warmup_steps": 0})
    assert [warmup_cosine(s, no_warmup) for s in (0, 6)] == pytest.approx([1.0, 0.55])
    all_warmup = hand_run(**{"optim.warmup_steps": 12})   # nothing left to decay: the peak, then the floor
    assert [warmup_cosine(s, all_warmup) for s in (11, 12, 13)] == pytest.approx([1.0, 1.0, 0.1])
    assert warmup_cosine(12, hand_run(**{"optim.lr": 0.5})) == pytest.approx(0.05)   # the floor is 0.1 * lr


def test_exponential_ramp_by_hand():
    """1e-3 to 10 over 5 steps: a factor 10 per step (10^4 over 4 intervals)."""
    ramp = ExponentialRamp(1e-3, 10.0)
    run = hand_run(steps=5)
    assert [ramp.lr_at(s, run) for s in range(5)] == pytest.approx([1e-3, 1e-2, 1e-1, 1.0, 10.0])
    assert ramp.lr_at(0, hand_run(steps=1)) == pytest.approx(1e-3) and ramp.batch_size_at(3, run) == 8
    assert [ramp.lr_at(s, hand_run(steps=2)) for s in (0, 1)] == pytest.approx([1e-3, 10.0])


def test_batch_ramp_by_hand():
    """Batch 8 doubling every 3 steps up to 32: 8, 8, 8, 16, 16, 16, 32 ... The LR is the standard LR
    times the growth (linear), its square root (sqrt) or 1 (none)."""
    run = hand_run()
    ramp = BatchRamp(double_every=3, max_size=32, lr_rule="linear")
    assert [ramp.batch_size_at(s, run) for s in range(10)] == [8, 8, 8, 16, 16, 16, 32, 32, 32, 32]
    assert ramp.lr_at(4, run) == pytest.approx(2 * 1.0) and ramp.lr_at(8, run) == pytest.approx(4 * 0.55)
    assert BatchRamp(3, 32, "sqrt").lr_at(8, run) == pytest.approx(2 * 0.55)
    assert BatchRamp(3, 32, "none").lr_at(8, run) == pytest.approx(0.55)
    assert BatchRamp(3, 4, "linear").batch_size_at(9, run) == 8   # a cap below the batch size keeps the batch
    assert [BatchRamp(1, 1024).batch_size_at(s, run) for s in (0, 1, 3, 5)] == [8, 16, 64, 256]   # 8 * 2^s
    assert lr_scale("sqrt", 9) == 3.0 and lr_scale("linear", 3) == 3.0 and lr_scale("none", 3) == 1.0


def test_shock_by_hand():
    """Jump x10 from step 6: 0.8682 before stays, 10 * 0.55 at step 8. No warmup: the cosine from 1.0
    at step 0 (progress step / 12)."""
    run = hand_run()
    jump = Shock("jump", at_step=6, factor=10.0)
    assert [jump.lr_at(s, run) for s in (5, 6, 8)] == pytest.approx(
        [0.1 + 0.45 * (1 + math.cos(math.pi / 8)), 10 * (0.1 + 0.45 * (1 + math.sqrt(0.5))), 5.5])
    assert jump.shock_step == 6 and jump.batch_size_at(7, run) == 8
    cold = Shock("no_warmup", at_step=6, factor=10.0)
    assert cold.shock_step == 0
    assert [cold.lr_at(s, run) for s in (0, 6, 12)] == pytest.approx([1.0, 0.55, 0.1])


@pytest.mark.parametrize("make, message", [
    (lambda: ExponentialRamp(0.0, 1.0), "stress.ramp.start_lr=0.0 is invalid: expected a positive finite learning rate"),
    (lambda: ExponentialRamp(math.inf, math.inf), "stress.ramp.start_lr=inf is invalid"),
    (lambda: ExponentialRamp(1.0, 1.0), ("stress.ramp.end_lr=1.0 is invalid: expected a finite learning rate above "
                                        "stress.ramp.start_lr=1.0")),
    (lambda: ExponentialRamp(1.0, 0.5), "stress.ramp.end_lr=0.5 is invalid"),
    (lambda: ExponentialRamp(1.0, math.inf), "stress.ramp.end_lr=inf is invalid"),
    (lambda: BatchRamp(double_every=0), "stress.batch.double_every=0 is invalid: expected a positive integer"),
    (lambda: BatchRamp(double_every=2.5), "stress.batch.double_every=2.5 is invalid"),
    (lambda: BatchRamp(max_size=0), "stress.batch.max_size=0 is invalid: expected a positive integer"),
    (lambda: BatchRamp(max_size=64.0), "stress.batch.max_size=64.0 is invalid"),
    (lambda: BatchRamp(lr_rule="cube"), ("stress.batch.lr_rule='cube' is invalid: expected one of ('none', 'linear', "
                                        "'sqrt')")),
    (lambda: Shock(kind="drop"), "stress.shock.kind='drop' is invalid: expected one of ('jump', 'no_warmup')"),
    (lambda: Shock(at_step=-1), "stress.shock.at_step=-1 is invalid: expected a non-negative step"),
    (lambda: Shock(at_step=3.0), "stress.shock.at_step=3.0 is invalid"),
    (lambda: Shock(factor=0.0), "stress.shock.factor=0.0 is invalid: expected a positive finite factor"),
    (lambda: Shock(factor=math.inf), "stress.shock.factor=inf is invalid"),
    (lambda: lr_scale("cube", 2.0), "lr_rule='cube' is invalid: expected one of ('none', 'linear', 'sqrt')"),
])
def test_schedules_reject_bad_settings_naming_the_field(make, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


def test_schedule_settings_at_their_limits_are_valid():
    assert BatchRamp(double_every=1, max_size=1).double_every == 1
    assert Shock(at_step=0, factor=0.5).lr_at(0, hand_run()) == pytest.approx(0.125)   # an LR drop is a shock too
    assert ExponentialRamp(1e-300, 2e-300).end_lr == 2e-300   # any positive start below the end


def test_the_stress_settings_are_the_schedules_the_cases_train_with():
    """``stress.ramp``, ``stress.batch`` and ``stress.shock`` are the schedules, set by their dotted names."""
    stress = resolve("smoke", {"stress.ramp.start_lr": 1e-3, "stress.ramp.end_lr": 5.0, "stress.batch.double_every": 7,
                               "stress.batch.max_size": 64, "stress.batch.lr_rule": "linear",
                               "stress.shock.kind": "jump", "stress.shock.at_step": 9,
                               "stress.shock.factor": 4.0}).stress
    assert stress.ramp == ExponentialRamp(1e-3, 5.0) and stress.ramp.name == "lr_ramp"
    assert stress.batch == BatchRamp(7, 64, "linear") and stress.batch.name == "batch_ramp"
    assert stress.shock == Shock("jump", 9, 4.0) and stress.shock.name == "shock" and Standard().name == "standard"


# ----------------------------------------------------------------------------- stress-case figures


def test_lr_sensitivity_and_critical_lr_by_hand():
    """Grid 1e-3 .. 1 (x10), loss_init 6. Held-out losses 5, 3.5, None (failed), 7 (worse than at
    init), diverged at 1: counted 5, 3.5, 6, 6, 6 (a failure, a non-finite loss and anything above
    loss_init count as loss_init). Best 3.5 at 1e-2; sensitivity mean(1.5, 0, 2.5, 2.5, 2.5) = 1.8.
    Critical LR: the smallest LR that diverged (0.1, not 1: the None at 0.1 also diverged)."""
    lrs = [1e-3, 1e-2, 1e-1, 0.5, 1.0]
    figures = sweep_figures(lrs, [5.0, 3.5, None, 7.0, 2.0], [False, False, True, False, True], 6.0)
    assert figures == {"lr_sensitivity": pytest.approx(1.8), "critical_lr": 0.1, "critical_lr_censored": False,
                       "best_lr": 1e-2, "best_lr_loss": 3.5, "loss_init": 6.0}
    nan = sweep_figures([1e-3, 1e-2], [math.nan, 4.0], [False, False], 6.0)   # NaN without a divergence flag
    assert nan["lr_sensitivity"] == pytest.approx(1.0) and nan["best_lr"] == 1e-2


def test_a_sweep_without_divergence_censors_the_critical_lr_one_grid_step_up():
    """Grid 1e-3, 3e-3 (x3): nothing diverged -> critical LR 3e-3 * 3 = 9e-3, censored; one LR: x2."""
    figures = sweep_figures([1e-3, 3e-3], [4.0, 5.0], [False, False], 6.0)
    assert figures["critical_lr"] == pytest.approx(9e-3) and figures["critical_lr_censored"] is True
    assert figures["lr_sensitivity"] == pytest.approx(0.5) and figures["best_lr"] == 1e-3
    three = sweep_figures([1e-3, 1e-2, 3e-2], [4.0, 5.0, 5.5], [False] * 3, 6.0)   # the last grid step: x3
    assert three["critical_lr"] == pytest.approx(9e-2)
    single = sweep_figures([0.01], [4.0], [False], 6.0)
    assert single["critical_lr"] == pytest.approx(0.02) and single["lr_sensitivity"] == 0.0


def test_reference_index_and_update_before():
    assert reference_index((1e-3, 1e-2, 1e-1), 4e-2) == 2 and reference_index((1e-3, 1e-2, 1e-1), 2e-3) == 0
    assert reference_index((1e-3, 1e-2, 1e-1), 1e-2) == 1
    assert [update_before(s) for s in (0, 1, 5)] == [0, 0, 4]


def test_rolling_min_index_needs_full_finite_windows_and_keeps_the_first_minimum():
    """Width 2: windows (trailing) of 4, 2, NaN, 1, 1, 3: [4] is short, [4, 2] mean 3, [2, NaN] and
    [NaN, 1] hold a NaN, [1, 1] mean 1 (index 4), [1, 3] mean 2: index 4. Width 1: the first 1 (index 3)."""
    values = [4.0, 2.0, math.nan, 1.0, 1.0, 3.0]
    assert _rolling_min_index(values, 2) == 4
    assert _rolling_min_index(values, 1) == 3
    assert _rolling_min_index([math.nan, math.inf], 1) is None and _rolling_min_index([], 3) is None
    assert _rolling_min_index([5.0, 1.0], 3) == 1   # windows shorter than the width at the start count whole


def ramp_arm(losses, status, diverged_at=None, spikes=(), grad_spikes=()):
    n = len(losses)
    return {"status": status, "diverged_at_step": diverged_at,
            "series": {"loss": losses, "lr": [10.0 ** (i - 3) for i in range(n)],
                       "loss_spike": [i in spikes for i in range(n)], "grad_spike": [i in grad_spikes for i in range(n)]}}


def test_ramp_figures_by_hand():
    """Losses 5, 4, 3, 3.5, 2.5, 6, 20, NaN (diverged at 7), factor 1.2 -> limit 6.0. Going back from
    step 7: 20 > 6 and 6 <= 6, so the onset is step 6 (the loss measured after step 5's update: LR
    10^2). Best smoothed loss (width 2) before the onset: means 4.5, 3.5, 3.25, 3.0, 4.25 -> step 4
    (after step 3's update: LR 1), mean 3.0. Spikes at 2 and 6: only step 2 is before the onset;
    grad spikes at 1, 4 and 7: 2."""
    arm = ramp_arm([5.0, 4.0, 3.0, 3.5, 2.5, 6.0, 20.0, math.nan], "diverged", 7, spikes=(2, 6), grad_spikes=(1, 4, 7))
    figures = ramp_figures(arm, diverge_factor=1.2, smoothing=2, end_lr=1e4)
    assert figures == {"ramp_divergence_lr": pytest.approx(100.0), "ramp_divergence_step": 6, "ramp_censored": False,
                       "ramp_spikes": 1, "ramp_grad_spikes": 2, "ramp_best_lr": pytest.approx(1.0),
                       "ramp_best_loss": pytest.approx(3.0)}


def test_ramp_figures_when_the_first_loss_already_diverged_or_none_did():
    """A NaN at step 0 and step 1: no finite initial loss, the onset walks back to step 0 (LR of step 0).
    An arm that completed: censored at the end LR and the number of steps; best over every step."""
    broken = ramp_figures(ramp_arm([math.nan, math.nan], "diverged", 1), 1.2, 1, 1e4)
    assert broken["ramp_divergence_step"] == 0 and broken["ramp_divergence_lr"] == pytest.approx(1e-3)
    assert broken["ramp_best_lr"] is None and broken["ramp_best_loss"] is None
    done = ramp_figures(ramp_arm([5.0, 3.0, 4.0], "completed", spikes=(2,)), 1.2, 1, 1e4)
    assert done["ramp_censored"] is True and done["ramp_divergence_lr"] == 1e4 and done["ramp_divergence_step"] == 3
    assert done["ramp_best_lr"] == pytest.approx(1e-3) and done["ramp_best_loss"] == 3.0 and done["ramp_spikes"] == 1
    assert ramp_figures(ramp_arm([], "completed"), 1.2, 1, 1e4) == {}
    rising = ramp_figures(ramp_arm([2.0, 3.0, 4.0], "completed"), 1.2, 2, 1e4)   # best at step 0: window [2]
    assert rising["ramp_best_loss"] == 2.0 and rising["ramp_best_lr"] == pytest.approx(1e-3)
    late = ramp_figures(ramp_arm([math.nan, 50.0], "diverged", 1), 1.2, 1, 1e4)   # nothing finite before the onset
    assert late["ramp_divergence_step"] == 0 and late["ramp_best_loss"] == 50.0   # the best of all steps


def test_ramp_onset_after_a_non_finite_initial_stretch():
    """Losses NaN, 4, 9, NaN with factor 2: the initial loss is the first finite one (4, limit 8); back
    from step 3: 9 > 8, then 4 <= 8, so the onset is step 2 (LR of step 1's update, 10^-2)."""
    figures = ramp_figures(ramp_arm([math.nan, 4.0, 9.0, math.nan], "diverged", 3), 2.0, 1, 1e4)
    assert figures["ramp_divergence_step"] == 2 and figures["ramp_divergence_lr"] == pytest.approx(1e-2)


def test_shock_figures_by_hand():
    """Shock at step 3, smoothing 2: pre-shock loss mean(2.2, 2.0) = 2.1. After: 3.0, 2.6, 2.2, 2.0,
    3.5: rolling means (full windows of 2) 2.8, 2.4, 2.1 -> back at 2.1 after 4 steps; peak 3.0 before
    recovery (the 3.5 after it is not counted), excess 0.9. Spikes after the shock: steps 4, 6."""
    losses = [4.0, 3.0, 2.2, 2.0, 3.0, 2.6, 2.2, 2.0, 3.5]
    spikes = [False, True, False, True, True, False, True, False, False]
    figures = shock_figures(losses, spikes, shock_step=3, smoothing=2, status="completed")
    assert figures == {"shock_step": 3, "shock_pre_loss": pytest.approx(2.1), "shock_peak_excess": pytest.approx(0.9),
                       "shock_recovery_steps": 4, "shock_recovered": True, "shock_spikes": 2}


def test_shock_figures_that_never_recover_or_diverge():
    """Pre-shock (smoothing 3, shock at 2) mean(3, 2, 1) = 2: the losses after, 5, NaN, 4, never come
    back: the peak is infinite (a non-finite loss), recovery censored at the 3 steps left. A diverged arm
    whose rolling mean came back is still not recovered. Too short a run: no figures."""
    never = shock_figures([3.0, 2.0, 1.0, 5.0, math.nan, 4.0], [False] * 6, 2, 3, "diverged")
    assert never["shock_pre_loss"] == 2.0 and never["shock_peak_excess"] == math.inf
    assert never["shock_recovery_steps"] == 3 and never["shock_recovered"] is False
    back = shock_figures([2.0, 2.0, 3.0, 1.0, 1.0], [False] * 5, 1, 2, "diverged")
    assert back["shock_recovered"] is False and back["shock_recovery_steps"] == 3
    assert back["shock_peak_excess"] == pytest.approx(1.0)
    short = shock_figures([2.0, 2.0], [False, True], 2, 2, "completed")
    assert short == {"shock_step": 2, "shock_pre_loss": None, "shock_peak_excess": None,
                     "shock_recovery_steps": None, "shock_recovered": False, "shock_spikes": 0}


def test_shock_at_step_zero_and_windows_longer_than_what_is_left():
    """no_warmup (shock at 0), smoothing 3: pre-shock loss = the loss at step 0, 3. After it 4, 2.5:
    only 2 steps left, so windows of 2 count: means 4, 3.25 -> never at or below 3 -> censored at 2;
    with a last loss of 1.5 the mean of (4, 1.5) = 2.75 recovers at step 2."""
    stuck = shock_figures([3.0, 4.0, 2.5], [False] * 3, 0, 3, "completed")
    assert stuck["shock_pre_loss"] == 3.0 and stuck["shock_recovery_steps"] == 2 and not stuck["shock_recovered"]
    back = shock_figures([3.0, 4.0, 1.5], [False] * 3, 0, 3, "completed")
    assert back["shock_recovery_steps"] == 2 and back["shock_recovered"] and back["shock_peak_excess"] == 1.0
    nan_after = shock_figures([2.0, 2.0, math.nan], [False] * 3, 1, 2, "diverged")
    assert nan_after["shock_peak_excess"] == math.inf and nan_after["shock_recovery_steps"] == 1
    nan_before = shock_figures([math.nan, math.nan, 4.0], [False] * 3, 1, 2, "completed")
    assert nan_before["shock_pre_loss"] is None and nan_before["shock_peak_excess"] is None


def test_loss_vs_tokens_by_hand():
    """7 steps, 3 points: every ceil(7 / 3) = 3 steps; windows [0-2], [3-5], [6]; tokens at the window's
    last step (8 per step). Means 2, 5 (the NaN left out), and the lone last step; a window of only
    non-finite losses has no mean."""
    arm = {"series": {"loss": [1.0, 2.0, 3.0, 4.0, math.nan, 6.0, math.inf],
                      "tokens": [8 * (s + 1) for s in range(7)]}}
    assert loss_vs_tokens(arm, points=3) == [[24, 2.0], [48, 5.0], [56, None]]
    assert loss_vs_tokens(arm, points=7) == [[8 * (s + 1), v if math.isfinite(v) else None]
                                             for s, v in enumerate(arm["series"]["loss"])]
    assert loss_vs_tokens(arm, points=50)[:2] == [[8, 1.0], [16, 2.0]]   # more points than steps: one per step
    assert loss_vs_tokens({"series": {"loss": [], "tokens": []}}) == []
    assert len(loss_vs_tokens({"series": {"loss": [1.0] * 120, "tokens": list(range(120))}})) == 40   # every 3
    assert len(loss_vs_tokens({"series": {"loss": [1.0] * 51, "tokens": list(range(51))}})) == 26    # every 2


def test_finite_means_a_real_finite_number():
    assert _finite(1) and _finite(2.5) and not _finite(True) and not _finite(None) and not _finite(math.nan)
    assert not _finite(math.inf) and not _finite("3")


# ----------------------------------------------------------------------------- claims


def claim_record(**intervals) -> dict:
    """A record whose ``paired["gated"]`` holds, per figure, the interval (low, high) given."""
    return {"paired": {"gated": {name: {"reference": 1.0, "treatment": 2.0, "difference": 1.0, "ci_low": low,
                                        "ci_high": high, "p_value": 0.25, "n": 3}
                                 for name, (low, high) in intervals.items()}}}


def test_claim_verdicts_at_the_edges_of_the_margin():
    """Lower is better (m_act_mean, max_attn_logit, logit_max, heldout_loss): holds when the whole interval
    is at or below the margin, fails when it is entirely above. Higher is better (accuracy,
    divergence_step, critical_lr): holds when it is at or above -margin, fails when entirely below."""
    record = claim_record(m_act_mean=(-2.0, 0.5), max_attn_logit=(0.5, 0.9), logit_max=(-1.0, 0.4),
                          heldout_loss=(-0.1, 0.1), accuracy=(-0.5, 1.0), divergence_step=(-2.0, -0.5),
                          critical_lr=(-0.4, -0.1))
    margins = {"m_act_mean": 0.5, "max_attn_logit": 0.5, "accuracy": 0.5, "divergence_step": 0.5}
    rows = {r["figure"]: r for r in claim_rows(record, list(record["paired"]["gated"]), margins=margins)}
    assert rows["m_act_mean"]["holds"] is True        # high 0.5 <= margin 0.5
    assert rows["max_attn_logit"]["holds"] is None    # low 0.5 is not above the margin 0.5: undecided
    assert rows["logit_max"]["holds"] is None         # no margin given: 0, and the interval straddles it
    assert rows["heldout_loss"]["holds"] is None
    assert rows["accuracy"]["holds"] is True          # low -0.5 >= -0.5
    assert rows["divergence_step"]["holds"] is None   # high -0.5 is not below -0.5
    assert rows["critical_lr"]["holds"] is False      # entirely below 0
    assert rows["m_act_mean"]["margin"] == 0.5 and rows["logit_max"]["margin"] == 0.0
    assert {k: rows["accuracy"][k] for k in ("figure", "better", "missing", "reference", "treatment", "difference",
                                             "ci_low", "ci_high", "p_value", "n")} == {
        "figure": "accuracy", "better": "higher", "missing": False, "reference": 1.0, "treatment": 2.0,
        "difference": 1.0, "ci_low": -0.5, "ci_high": 1.0, "p_value": 0.25, "n": 3}
    lower_fails = claim_rows(claim_record(m_act_mean=(0.6, 0.9)), ["m_act_mean"], margins={"m_act_mean": 0.5})
    assert lower_fails[0]["holds"] is False
    higher_holds = claim_rows(claim_record(accuracy=(0.1, 0.2)), ["accuracy"])
    assert higher_holds[0]["holds"] is True


def test_a_claim_with_half_an_interval_is_undecided():
    """A record (edited by hand, or from another tool) with one end of the interval missing: no verdict,
    even when the end it has would decide (high -1 <= margin 0 for a lower-is-better figure)."""
    rows = claim_rows(claim_record(m_act_mean=(None, -1.0), accuracy=(1.0, None)), ["m_act_mean", "accuracy"])
    assert [row["holds"] for row in rows] == [None, None]

def test_a_claim_against_another_arm_and_one_that_expects_worse():
    """floored - gated per seed: m_act_mean 3, 4, 5 (mean 4, sd 1: 4 +- 4.303 / sqrt(3) = [1.516, 6.484]),
    accuracy -0.3, -0.4, -0.5 ([-0.648, -0.152]). Expecting floored worse than gated: M-Act higher
    (the interval is above 0: holds), accuracy lower (below 0: holds). Expecting it better: both fail."""
    arms = []
    for seed, (m_act, accuracy) in enumerate(((3.0, 0.3), (4.0, 0.4), (5.0, 0.5))):
        arms += [paired_arm("reference", seed, m_act_mean=9.0, accuracy=0.6),
                 paired_arm("gated", seed, m_act_mean=float(seed), accuracy=0.8),
                 paired_arm("floored", seed, m_act_mean=seed + m_act, accuracy=0.8 - accuracy)]
    record = {"arms": arms, "paired": paired_summary(arms)}
    worse = claim_rows(record, ["m_act_mean", "accuracy"], arm="floored", reference="gated", expect="worse")
    assert [(r["figure"], r["better"], r["holds"], r["arm"], r["against"]) for r in worse] == [
        ("m_act_mean", "higher", True, "floored", "gated"), ("accuracy", "lower", True, "floored", "gated")]
    assert worse[0]["ci_low"] == pytest.approx(4 - 2.484338, abs=1e-6) and worse[0]["reference"] == 1.0
    better = claim_rows(record, ["m_act_mean", "accuracy"], arm="floored", reference="gated")
    assert [(r["better"], r["holds"]) for r in better] == [("lower", False), ("higher", False)]
    against_reference = claim_rows(record, ["m_act_mean"], arm="floored")[0]   # the record's own paired table
    assert against_reference["against"] == "reference" and against_reference["difference"] == pytest.approx(-4.0)
    with pytest.raises(ValueError, match=re.escape("expect='wrose' is invalid: expected 'better' or 'worse'")):
        claim_rows(record, ["m_act_mean"], arm="floored", expect="wrose")
    header = claims_table(worse, arm="floored", reference="gated").splitlines()[0]
    assert re.split(r"\s{2,}", header) == ["figure", "claimed", "gated", "floored", "floored-gated", "95% CI",
                                           "sign-flip p", "n", "holds"]

def test_claims_of_another_arm_missing_figures_and_undirected_ones():
    record = claim_record(m_act_mean=(-2.0, -1.0), gate_score_mean=(0.1, 0.2))
    record["paired"]["other"] = {"m_act_mean": {**record["paired"]["gated"]["m_act_mean"], "ci_low": 1.0,
                                                "ci_high": 2.0}}
    assert claim_rows(record, ["m_act_mean"], arm="other")[0]["holds"] is False
    assert claim_rows(record, ["m_act_mean"])[0]["holds"] is True
    missing = claim_rows(record, ["f_attn_mean", "gate_score_mean"])
    assert missing == [{"figure": "f_attn_mean", "better": "lower", "n": 0, "holds": None, "missing": True},
                       {"figure": "gate_score_mean", "better": None, "n": 0, "holds": None, "missing": True}]
    assert claim_rows({}, ["m_act_mean"])[0]["missing"] and claim_rows({"paired": None}, ["m_act_mean"])[0]["missing"]


def test_claims_table_states_each_verdict():
    record = claim_record(m_act_mean=(-2.0, -1.0), heldout_loss=(0.5, 1.5), accuracy=(-0.1, 0.1))
    record["paired"]["gated"]["critical_lr"] = {"reference": 1.0, "treatment": 1.0, "difference": 0.0,
                                                "ci_low": None, "ci_high": None, "p_value": None, "n": 1}
    record["paired"]["gated"]["accuracy"]["n"] = 2   # two seeds are enough for an interval: undecided, not n<2
    rows = claim_rows(record, ["f_attn_mean", "m_act_mean", "heldout_loss", "accuracy", "critical_lr"])
    lines = claims_table(rows, title="M-Act claim").splitlines()
    assert lines[0] == "M-Act claim"
    assert re.split(r"\s{2,}", lines[1]) == [
        "figure", "claimed", "reference", "gated", "gated-reference", "95% CI", "sign-flip p", "n", "holds"]
    cells = {line.split()[0]: line for line in lines[3:]}
    assert cells["m_act_mean"].split()[-1] == "yes" and "[-2, -1]" in cells["m_act_mean"]
    assert cells["heldout_loss"].split()[-1] == "NO"
    assert cells["accuracy"].split()[-1] == "undecided"
    assert cells["critical_lr"].split() == ["critical_lr", "higher", "1", "1", "0", "-", "-", "1", "n<2"]
    assert cells["f_attn_mean"].split() == ["f_attn_mean", "lower", "-", "-", "-", "-", "-", "0", "not", "measured"]
    assert cells["m_act_mean"].split()[1:5] == ["lower", "1", "2", "1"] and cells["m_act_mean"].split()[-3:-1] == \
        ["0.25", "3"]
    assert claims_table(rows, arm="other").splitlines()[0].split()[3] == "other"


def test_held_out_lists_the_seeds_and_names_the_overlap():
    record = {"arms": [{"seed": 102}, {"seed": 100}, {"seed": 101}, {"seed": 100}]}
    assert held_out(record, discovery_seeds=[0, 1]) == [100, 101, 102]
    with pytest.raises(ValueError) as error:
        held_out({"arms": [{"seed": 3}, {"seed": 1}, {"seed": 100}]}, discovery_seeds={3, 0, 1})
    assert str(error.value) == ("seeds [1, 3] were used to discover this claim: a claim is asserted only on "
                                "held-out seeds (discovery seeds [0, 1, 3])")


# ----------------------------------------------------------------------------- quantization damage


def test_int8_fake_quant_by_hand():
    """Per tensor: amax 254 -> step 2: 254 -> 127 * 2, 6.4 -> round(3.2) * 2 = 6, -3 -> round(-1.5) = -2
    (half to even) -> -4, 0.9 -> round(0.45) = 0. Per row (dim -1): row [254, 6.4] keeps step 2, row
    [-3, 0.9] gets step 3 / 127: both exact to a rounding of 1/127 of 3. An all-zero row stays zero."""
    x = torch.tensor([[254.0, 6.4], [-3.0, 0.9], [0.0, 0.0]], dtype=torch.float64)
    per_tensor = fake_quant_int8(x)
    assert per_tensor.dtype == torch.float64
    assert per_tensor.tolist() == [[254.0, 6.0], [-4.0, 0.0], [0.0, 0.0]]
    per_row = fake_quant_int8(x, dim=-1)
    step = 3.0 / 127
    assert per_row[0].tolist() == [254.0, 6.0]
    assert per_row[1].tolist() == pytest.approx([-3.0, round(0.9 / step) * step])
    assert per_row[2].tolist() == [0.0, 0.0]
    per_column = fake_quant_int8(torch.tensor([[127.0, 1.0], [63.4, 0.5]]), dim=0)   # steps 1 and 1/127
    assert torch.allclose(per_column, torch.tensor([[127.0, 1.0], [63.0, 64 / 127]]))


def test_fake_quant_linear_by_hand():
    """W = I (exact in int8: amax 1, step 1/127). Input [127, 0.4, 0, -0.6]: per tensor step 1, so 0.4
    -> 0 and -0.6 -> -1; the output is the quantized input plus the bias. Of the 3 non-zero inputs
    one became zero; a second call adds up."""
    linear = nn.Linear(4, 4)
    with torch.no_grad():
        linear.weight.copy_(torch.eye(4))
        linear.bias.copy_(torch.tensor([0.0, 1.0, 0.0, 0.0]))
    fake = FakeQuantLinear(linear, None, None)
    out = fake(torch.tensor([[127.0, 0.4, 0.0, -0.6]]))
    assert out.tolist() == [[127.0, 1.0, 0.0, -1.0]]
    assert (int(fake.zeroed), int(fake.nonzero)) == (1, 3)
    fake(torch.tensor([[2.0, 0.0, 0.0, 0.0]]))
    assert (int(fake.zeroed), int(fake.nonzero)) == (1, 4)
    token = FakeQuantLinear(linear, 1, -1)   # per token: the row [127, 0.4, 0, -0.6] has step 1 too
    out = token(torch.tensor([[127.0, 0.4, 0.0, -0.6], [0.4, 0.0, 0.0, 0.0]]))   # row 2: step 0.4 / 127
    assert torch.allclose(out, torch.tensor([[127.0, 1.0, 0.0, -1.0], [0.4, 1.0, 0.0, 0.0]]))


class HandLM(nn.Module):
    """A GatedLM in miniature: embeddings (token 1 is [0, 4], token 0 is zero), one block with two
    Linears reading the same input (q: weight 2I; k: weight I, bias (1, -1), its output unused), an
    identity final norm and a tied head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(2, 2)
        block = nn.Module()
        block.q = nn.Linear(2, 2, bias=False)
        block.k = nn.Linear(2, 2)
        self.blocks = nn.ModuleList([block])
        self.norm = nn.Identity()
        self.lm_head = None
        with torch.no_grad():
            self.embed.weight.copy_(torch.tensor([[0.0, 0.0], [0.0, 4.0]]))
            block.q.weight.copy_(2 * torch.eye(2))
            block.k.weight.copy_(torch.eye(2))
            block.k.bias.copy_(torch.tensor([1.0, -1.0]))

    def forward(self, tokens):
        x = self.embed(tokens)
        x = self.blocks[0].q(x) + 0 * self.blocks[0].k(x)
        return self.norm(x) @ self.embed.weight.T


def test_per_linear_input_stats_and_damage_by_hand():
    """Tokens [0, 0, 0, 1]: q and k read [0]*7 + [4]: mean 0.5, centred seven -0.5 and one 3.5,
    variance 14/8, fourth moment 150.5/8, kurtosis 18.8125 / 3.0625 = 43/7, infinity norm 4. The head
    reads q's output (doubled: same kurtosis, infinity norm 8). Damage: a "quantized" q with twice the
    weight is off by ||2Wx - Wx|| / ||Wx|| = 1; a head with 1.5 times the weight by 0.5; k unchanged
    (weight and bias) by 0."""
    model = HandLM().eval()
    tokens = torch.tensor([[0, 0, 0, 1]])
    stats = linear_input_stats(model, tokens, ["blocks.0.q", "blocks.0.k", HEAD])
    assert stats == {"blocks.0.q": {"kurtosis": pytest.approx(43 / 7), "inf_norm": 4.0},
                     "blocks.0.k": {"kurtosis": pytest.approx(43 / 7), "inf_norm": 4.0},
                     HEAD: {"kurtosis": pytest.approx(43 / 7), "inf_norm": 8.0}}
    assert set(linear_input_stats(model, tokens)) == {"blocks.0.q", "blocks.0.k"}   # the block Linears by default
    doubled, same, head = nn.Linear(2, 2, bias=False), nn.Linear(2, 2), nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        doubled.weight.copy_(4 * torch.eye(2))
        same.weight.copy_(torch.eye(2))
        same.bias.copy_(model.blocks[0].k.bias)
        head.weight.copy_(1.5 * model.embed.weight)
    errors = per_linear_damage(model, {"blocks.0.q": doubled, "blocks.0.k": same, HEAD: head}, tokens)
    assert errors == {"blocks.0.q": pytest.approx(1.0), "blocks.0.k": 0.0, HEAD: pytest.approx(0.5)}
    assert not model.norm._forward_hooks and not model.blocks[0].q._forward_pre_hooks
    plain = nn.Sequential(nn.Linear(2, 2))   # no LM head (none asked): only the Linears named
    with torch.no_grad():
        plain[0].weight.copy_(torch.eye(2))
        plain[0].bias.zero_()
    assert per_linear_damage(plain, {"0": doubled}, torch.tensor([[3.0, 4.0]])) == {"0": pytest.approx(3.0)}  # 4I vs I


def test_relative_output_error_by_hand():
    assert relative_output_error(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0])) == pytest.approx(0.2)
    assert relative_output_error(torch.tensor([3.0, 4.0]), torch.tensor([0.0, 0.0])) == pytest.approx(1.0)
    assert relative_output_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert relative_output_error(torch.zeros(3), torch.tensor([0.0, 1e-3, 0.0])) == math.inf


class FixedLogits(nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, _tokens):
        return self.logits


def test_output_kl_by_hand():
    """Token 1: p = (1/2, 1/2) from logits (0, 0), q = (1/4, 3/4) from (0, log 3): KL = 1/2 log 2 +
    1/2 log(2/3) = 1/2 log(4/3). Tokens 2 and 3 identical: 0. Mean over the 3 tokens (not over the 2
    classes): log(4/3) / 6."""
    reference = FixedLogits(torch.tensor([[[0.0, 0.0], [1.0, 2.0], [1.0, 2.0]]]))
    quantized = FixedLogits(torch.tensor([[[0.0, math.log(3)], [1.0, 2.0], [1.0, 2.0]]]))
    assert output_kl(reference, quantized, None) == pytest.approx(math.log(4 / 3) / 6, rel=1e-6)
    assert output_kl(quantized, quantized, None) == 0.0


class Cast:
    def pop_stats(self):
        return {"overflow_fraction": 0.25, "underflow_fraction": 0.5, "other": 1.0}


def test_cast_counts_by_hand():
    """Two W8A8 Linears that zeroed 1 of 3 and 2 of 5 non-zero inputs: 3 / 8. The fp8 policy's own
    fractions are passed through."""
    fakes = [FakeQuantLinear(nn.Linear(2, 2), None, None) for _ in range(2)]
    fakes[0].zeroed, fakes[0].nonzero = torch.tensor(1), torch.tensor(3)
    fakes[1].zeroed, fakes[1].nonzero = torch.tensor(2), torch.tensor(5)
    assert _cast_counts([*fakes, nn.Linear(2, 2)], None) == {"activation_zeroed_fraction": 3 / 8}
    assert _cast_counts([FakeQuantLinear(nn.Linear(2, 2), None, None)], None) == {"activation_zeroed_fraction": 0.0}
    assert _cast_counts([nn.Linear(2, 2)], Cast()) == {"overflow_fraction": 0.25, "underflow_fraction": 0.5}
    assert _cast_counts([], None) == {}


def test_damage_is_quantized_minus_full_precision():
    """Loss 3.0 -> 3.5 (damage +0.5), perplexity 20 -> 33 (+13), accuracy 0.5 -> 0.25 (-0.25)."""
    full = {"heldout_loss": 3.0, "perplexity": 20.0, "accuracy": 0.5}
    assert damage({"heldout_loss": 3.5, "perplexity": 33.0, "accuracy": 0.25}, full) == {
        "damage_loss": 0.5, "damage_perplexity": 13.0, "damage_accuracy": -0.25}


def test_quant_figures_flatten_the_schemes_that_ran():
    quant = {"schemes": {"int8": {"damage_loss": 0.1, "damage_accuracy": -0.01, "kl": 0.02, "seconds": 1.0},
                         "nf4": {"skipped": "no bitsandbytes"},
                         "fp8": {"damage_loss": 0.3, "damage_accuracy": -0.03, "kl": 0.04}}}
    assert quant_figures(quant) == {"quant_int8_damage_loss": 0.1, "quant_int8_damage_accuracy": -0.01,
                                    "quant_int8_kl": 0.02, "quant_fp8_damage_loss": 0.3,
                                    "quant_fp8_damage_accuracy": -0.03, "quant_fp8_kl": 0.04}
    assert quant_figures(None) == {} and quant_figures({"schemes": None}) == {}
