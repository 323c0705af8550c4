"""Each probe on hand-built tensors with a known answer."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stability.config import GateConfig, ModelConfig
from stability.model.lm import GatedLM
from stability.record import spike_score
from stability.train import probes


def test_first_token_share_of_a_map_with_half_on_token_zero_is_one_half():
    probs = torch.zeros(2, 3, 5, 5)
    probs[..., 0] = 0.5
    probs[..., 1] = 0.5
    assert torch.allclose(probes.first_token_share(probs), torch.full((3,), 0.5))


def test_first_token_share_averages_over_heads_and_queries():
    probs = torch.zeros(1, 2, 4, 4)
    probs[0, 0, :, 0] = torch.tensor([1.0, 0.5, 0.2, 0.1])  # head 0: queries 1..3 mean 0.8 / 3
    probs[0, 0, :, 1] = 1 - probs[0, 0, :, 0]
    probs[0, 1, 1:, 1] = 1.0  # head 1: nothing on token 0 except query 0, which can only see itself
    probs[0, 1, 0, 0] = 1.0
    per_head = probes.first_token_share(probs)   # F-Attn leaves query 0 out
    assert torch.allclose(per_head, torch.tensor([0.8 / 3, 0.0]))
    assert per_head.mean().item() == pytest.approx(0.4 / 3)
    alpha_0 = probes.first_token_share(probs, first_query=0)   # Gu et al.'s alpha_0 keeps it
    assert torch.allclose(alpha_0, torch.tensor([0.45, 0.25]))


def test_sink_rate_counts_heads_above_the_threshold():
    assert probes.sink_rate(torch.tensor([0.9, 0.31, 0.3, 0.05])) == pytest.approx(0.5)
    assert probes.sink_rate(torch.tensor([0.1, 0.2])) == 0.0


def test_massive_activation_reports_max_and_max_over_median():
    residual = torch.ones(1, 4, 25)
    residual[0, 0, 3] = -1000.0
    peak, ratio = probes.massive_activation(residual)
    assert peak == 1000.0 and ratio == pytest.approx(1000.0)


def test_max_attention_logit_ignores_masked_entries():
    logits = torch.tensor([[[[2.0, float("-inf")], [7.5, -3.0]]]])
    assert probes.max_attention_logit(logits) == 7.5


def test_logit_health_gives_max_abs_logit_and_mean_log_partition():
    logits = torch.zeros(1, 2, 4)
    logits[0, 1, 2] = -9.0
    peak, log_z = probes.logit_health(logits)
    expected = (math.log(4) + math.log(3 + math.exp(-9))) / 2
    assert peak == 9.0 and log_z == pytest.approx(expected, rel=1e-6)


def test_kurtosis_is_three_for_a_gaussian_and_large_with_an_outlier():
    gaussian = torch.randn(200_000, generator=torch.Generator().manual_seed(0))
    assert probes.kurtosis(gaussian) == pytest.approx(3.0, abs=0.05)
    spiky = torch.zeros(1000)
    spiky[0] = 1.0
    assert probes.kurtosis(spiky) > 900


def test_spike_detector_flags_a_jump_of_k_sigma_and_not_noise():
    detector = probes.SpikeDetector(window=20, k=6.0, min_history=10)
    values = [2.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(30)]
    flags = [detector.update(v) for v in values]
    assert not any(flags)
    assert detector.update(2.5)  # far above 6 sigma of the noise
    assert not detector.update(float("nan"))


def test_spike_detector_waits_for_min_history():
    detector = probes.SpikeDetector(window=20, k=1.0, min_history=5)
    assert [detector.update(v) for v in (1.0, 1.0, 1.0, 1.0, 100.0)] == [False] * 5


def test_spike_score_is_a_percentage():
    assert spike_score([True, False, False, False]) == 25.0
    assert spike_score([]) == 0.0


def test_grad_norms_give_global_then_per_group_l2():
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    norms = probes.grad_norms({"first": [a], "second": [b]})
    assert norms.tolist() == pytest.approx([5.0, 3.0, 4.0])


def test_first_nonfinite_module_finds_the_earliest_offender_in_forward_order():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    with torch.no_grad():
        model[1].weight.fill_(float("inf"))
    assert probes.first_nonfinite_module(model, lambda: model(torch.ones(1, 2))) == "1"
    with torch.no_grad():
        model[1].weight.fill_(1.0)
    assert probes.first_nonfinite_module(model, lambda: model(torch.ones(1, 2))) is None
    assert not any(m._forward_hooks for m in model)  # hooks removed: healthy steps pay nothing


def test_layer_of_reads_the_block_index():
    assert probes.layer_of("blocks.3.attn.q_proj") == 3
    assert probes.layer_of("embed") is None and probes.layer_of(None) is None


def test_heavy_probes_on_a_model_with_a_planted_sink_and_massive_activation():
    """Plant a huge value in layer 1's residual stream and a key bias toward token 0."""
    config = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, context=16)
    model = GatedLM(config, seed=0)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 256
    before = probes.heavy_probes(model, tokens)
    with torch.no_grad():
        model.blocks[1].mlp.w_down.weight[5].fill_(50.0)  # channel 5 of layer 1's output becomes massive
    after = probes.heavy_probes(model, tokens)
    assert after["layers"][1]["m_act"] > 20 * before["layers"][1]["m_act"]
    assert after["layers"][0]["m_act"] == pytest.approx(before["layers"][0]["m_act"])
    assert after["m_act_mean"] == pytest.approx((after["layers"][0]["m_act"] + after["layers"][1]["m_act"]) / 2)
    for layer in after["layers"]:
        assert 0.0 < layer["f_attn"] <= 1.0 and 0.0 <= layer["sink_rate"] <= 1.0
    assert set(after["linear_inputs"]) >= {"blocks.0.attn.q_proj", "blocks.1.mlp.w_down"}
    assert after["gate_score_mean"] is None  # a baseline model has no gate
    assert not any(b.attn.observer for b in model.blocks)


def test_every_model_figure_of_a_snapshot_is_in_the_figure_table_and_reaches_final():
    from stability.record import figures, final_figures, new_arm_record

    config = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, context=16, gate=GateConfig(position="G1"))
    snapshot = probes.heavy_probes(GatedLM(config, seed=0), torch.zeros(1, 8, dtype=torch.long))
    numbers = [k for k, v in snapshot.items() if isinstance(v, float)]
    assert numbers and all(figures.figure(k) is not None for k in numbers)
    assert list(snapshot["layers"][0]) == ["f_attn", "sink_rate", "max_attn_logit", "gate_score", "m_act",
                                           "m_act_ratio"] or set(snapshot["layers"][0]) == set(probes.LAYER_PROBES)
    arm = new_arm_record("gated", "G1", 0, "standard")
    arm["probes"].append({**snapshot, "step": 0})
    assert {k: final_figures(arm, 1)[k] for k in numbers} == {k: snapshot[k] for k in numbers}


def test_heavy_probes_leave_alone_what_no_probe_reads(monkeypatch):
    monkeypatch.setattr(probes, "LAYER_PROBES", {"m_act": probes.LAYER_PROBES["m_act"]})
    config = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, context=16, gate=GateConfig(position="G1"))
    snapshot = probes.heavy_probes(GatedLM(config, seed=0), torch.zeros(1, 8, dtype=torch.long))
    assert [list(layer) for layer in snapshot["layers"]] == [["m_act"], ["m_act"]]   # attention, gate: not read
    assert list(snapshot) == ["layers", "m_act_mean", "m_act_max", "logit_max", "log_z_mean", "linear_inputs", "hooked"]


def test_a_registered_layer_probe_is_measured_and_summarised(monkeypatch):
    from stability.record import figures

    monkeypatch.setattr(probes, "LAYER_PROBES", dict(probes.LAYER_PROBES))
    monkeypatch.setattr(figures, "FIGURES", dict(figures.FIGURES))
    with pytest.raises(ValueError, match="not in the figure table"):
        probes.register(probes.LayerProbe("row_max", "attn_probs", lambda p: p.max().item(), max="row_max_max"))
    figures.add(figures.Figure("row_max_max", None, "probability", "largest attention weight of any layer"))
    probes.register(probes.LayerProbe("row_max", "attn_probs", lambda p: p.max().item(), max="row_max_max"))
    with pytest.raises(ValueError, match="new name"):
        probes.register(probes.LayerProbe("row_max", "attn_probs", lambda p: p.max().item()))
    # the probe and its figure in one registration
    probes.register(probes.LayerProbe("row_min", "attn_probs", lambda p: p.min().item(), mean=figures.Figure(
        "row_min_mean", None, "probability", "smallest attention weight, mean over layers")))
    assert figures.figure("row_min_mean").unit == "probability" and probes.LAYER_PROBES["row_min"].mean == "row_min_mean"
    snapshot = probes.heavy_probes(GatedLM(ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, context=16),
                                           seed=0), torch.zeros(1, 8, dtype=torch.long))
    assert snapshot["row_max_max"] == max(layer["row_max"] for layer in snapshot["layers"]) == 1.0  # query 0
    assert snapshot["row_min_mean"] == sum(layer["row_min"] for layer in snapshot["layers"]) / 2


def test_spike_detector_waits_for_ten_values_by_default():
    detector = probes.SpikeDetector(window=20, k=1.0)
    assert not any(detector.update(1.0) for _ in range(10))
    assert detector.update(1.5)   # the 11th value is judged on the 10 before it


def test_layer_groups_split_embeddings_blocks_and_the_rest():
    model = nn.Module()
    model.embed = nn.Embedding(3, 2)
    model.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2, bias=False)])
    model.norm = nn.LayerNorm(2)
    groups = probes.layer_groups(model)
    assert list(groups) == ["embed", "layer0", "layer1", "head"]
    assert groups["layer0"] == [model.blocks[0].weight, model.blocks[0].bias]
    assert groups["layer1"] == [model.blocks[1].weight] and groups["embed"] == [model.embed.weight]
    assert groups["head"] == [model.norm.weight, model.norm.bias]


def test_grad_norms_stay_on_the_parameters_device():
    a, b = nn.Parameter(torch.zeros(2, device="meta")), nn.Parameter(torch.zeros(1, device="meta"))
    assert probes.grad_norms({"first": [a], "second": [b]}).device.type == "meta"   # no gradient yet
    assert probes.grad_norms({"first": [a], "second": [b]}).shape == (3,)
    a.grad, b.grad = torch.zeros(2, device="meta"), torch.zeros(1, device="meta")
    assert probes.grad_norms({"first": [a], "second": [b]}).device.type == "meta"
    cpu = nn.Parameter(torch.zeros(1))
    assert probes.grad_norms({"first": [cpu], "second": []}).tolist() == [0.0, 0.0, 0.0]


def test_grad_norms_skip_parameters_without_a_gradient():
    a, b, c = (nn.Parameter(torch.zeros(1)) for _ in range(3))
    a.grad, c.grad = torch.tensor([6.0]), torch.tensor([8.0])
    assert probes.grad_norms({"first": [a, b], "second": [c]}).tolist() == pytest.approx([10.0, 6.0, 8.0])


def test_nonfinite_grad_modules_name_the_parameters_with_nan_or_inf_gradients():
    model = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1), nn.Linear(1, 1))
    model[0].weight.grad = torch.tensor([[1.0]])
    model[1].weight.grad = torch.tensor([[float("inf")]])
    model[1].bias.grad = torch.tensor([float("nan")])
    assert probes.nonfinite_grad_modules(model) == ["1.weight", "1.bias"]


class Pair(nn.Module):
    """A module whose output is a tuple (output, extra), like an attention layer returning its weights."""

    def __init__(self, first: float, second: float):
        super().__init__()
        self.first, self.second = first, second

    def forward(self, x):
        return x * self.first, x * self.second


def test_first_nonfinite_module_reads_the_first_element_of_a_tuple_output_and_every_row():
    x = torch.ones(2, 3)
    parent = nn.Module()
    parent.extra_bad = Pair(1.0, float("nan"))   # only the extra element is non-finite: not an offender
    parent.out_bad = Pair(float("inf"), 1.0)
    assert probes.first_nonfinite_module(parent, lambda: parent.extra_bad(x)) is None
    assert probes.first_nonfinite_module(parent, lambda: parent.out_bad(x)) == "out_bad"
    rows = nn.Module()
    rows.scale = nn.Linear(3, 3)
    with torch.no_grad():
        rows.scale.weight.fill_(1.0)
        rows.scale.bias.fill_(0.0)
    assert probes.first_nonfinite_module(rows, lambda: rows.scale(torch.tensor([[1.0, 1, 1], [1, float("inf"), 1]]))) \
        == "scale"   # only the second row is non-finite


def test_massive_activation_of_a_mostly_zero_residual_has_an_infinite_ratio():
    residual = torch.zeros(1, 3, 4)
    residual[0, 1, 2] = 5.0
    assert probes.massive_activation(residual) == (5.0, math.inf)


def test_first_token_share_needs_more_query_positions_than_it_leaves_out():
    with pytest.raises(ValueError, match="probs has 1 query positions: F-Attn needs more than 1"):
        probes.first_token_share(torch.ones(1, 2, 1, 1))   # 2 heads, 1 query
    assert probes.first_token_share(torch.ones(1, 2, 1, 1), first_query=0).tolist() == [1.0, 1.0]


def test_kurtosis_of_a_constant_is_nan():
    assert math.isnan(probes.kurtosis(torch.full((5,), 3.0)))
