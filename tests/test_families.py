"""The harness's two architecture families and the Qwen3-Next attention options.

llama vs gpt2 differ where they should (parameters, positions), gate variants behave the same in
both, paired init shares every common parameter, and the harness's attention reproduces
transformers' Qwen3NextAttention (partial rotary, head_dim != d_model / n_heads, the gate inside
q_proj, (1 + w) QK-norm) within 1e-5 in fp32."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from stability.config import GATE_POSITIONS, ConfigError, GateConfig, ModelConfig
from stability.model.attention import Attention, apply_rope, rope_tables
from stability.model.lm import GatedLM

SMALL = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context=16)
GPT2 = replace(SMALL, family="gpt2", bias=True)


def tokens(batch: int = 2, seq: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_parameter_counts_differ_by_what_each_family_has():
    d, ctx, vocab, layers, ff = SMALL.d_model, SMALL.context, SMALL.vocab_size, SMALL.n_layers, 4 * SMALL.d_model
    llama, gpt2 = GatedLM(SMALL), GatedLM(GPT2)
    attention = d * d + 2 * d * (d // 2) + d * d           # q, k, v (2 KV heads of 8), o
    attention_bias = d + 2 * (d // 2) + d
    llama_block = attention + 3 * d * SMALL.ffn_dim + 2 * d  # SwiGLU's three matrices, two RMSNorm gains
    gpt2_block = attention + attention_bias + 2 * d * ff + ff + d + 2 * 2 * d  # GELU MLP + biases, 2 LayerNorms
    assert llama.num_parameters() == vocab * d + layers * llama_block + d  # tied head, final RMSNorm
    assert gpt2.num_parameters() == vocab * d + ctx * d + layers * gpt2_block + 2 * d + d * vocab  # positions, untied
    assert GPT2.ffn_dim == 4 * d and SMALL.ffn_dim == 96


def test_positions_are_learned_in_gpt2_and_rotary_in_llama():
    gpt2, llama = GatedLM(GPT2).eval(), GatedLM(SMALL).eval()
    assert gpt2.pos_embed.weight.shape == (GPT2.context, GPT2.d_model) and gpt2.rope_cos is None
    assert llama.pos_embed is None and llama.rope_cos.shape == (SMALL.context, SMALL.head_size // 2)
    assert not any("pos" in name for name, _ in llama.named_parameters())
    x = tokens()
    before = gpt2(x)
    with torch.no_grad():
        gpt2.pos_embed.weight[5] += 1.0  # position 5's embedding: causal, so only positions >= 5 may move
    after = gpt2(x)
    assert torch.equal(before[:, :5], after[:, :5])
    assert (before[:, 5:] - after[:, 5:]).abs().amax(dim=(0, 2)).min() > 0
    # llama: positions enter only through RoPE in attention, where q.k depends on the offset i - j alone
    q, k = torch.randn(1, 1, 1, SMALL.head_size).expand(1, 1, SMALL.context, -1), torch.randn(1, 1, 1, SMALL.head_size)
    q_rot = apply_rope(q, llama.rope_cos, llama.rope_sin)[0, 0]
    k_rot = apply_rope(k.expand(1, 1, SMALL.context, -1), llama.rope_cos, llama.rope_sin)[0, 0]
    scores = q_rot @ k_rot.T  # (i, j)
    assert torch.allclose(scores[3, 1], scores[9, 7], atol=1e-5) and torch.allclose(scores[5, 5], scores[0, 0], atol=1e-5)
    assert (scores[3, 1] - scores[3, 2]).abs() > 1e-4


@pytest.mark.parametrize("position", [p for p in GATE_POSITIONS if p != "none"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_every_gate_variant_works_in_both_families_with_paired_init(family, position):
    base = replace(SMALL, family=family, bias=family == "gpt2")
    gate = GateConfig(position=position)
    baseline, gated = GatedLM(base, seed=3), GatedLM(replace(base, gate=gate), seed=3)
    shared = dict(baseline.named_parameters())
    extra = [n for n, p in gated.named_parameters() if n not in shared]
    assert extra and all("gate_proj" in n for n in extra)
    for name, param in gated.named_parameters():
        if name in shared:
            assert torch.equal(param, shared[name]), name
    x = tokens()
    out = gated(x)
    assert out.shape == (2, 16, base.vocab_size) and torch.isfinite(out).all()
    assert not torch.allclose(out, baseline(x))  # the gate acts
    out.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None for n, p in gated.named_parameters() if "gate_proj" in n)


def test_pytorch_init_follows_the_layer_defaults_and_stays_paired():
    model = GatedLM(replace(GPT2, init="pytorch"), seed=1)
    bound = 1 / GPT2.d_model ** 0.5
    up = model.blocks[0].mlp.w_up
    assert up.weight.abs().max() <= bound and up.weight.abs().max() > 0.9 * bound
    assert up.bias.abs().max() <= bound and up.bias.abs().max() > 0  # PyTorch draws biases too
    assert 0.9 < model.embed.weight.std() < 1.1
    normal = GatedLM(GPT2, seed=1)
    assert normal.blocks[0].mlp.w_up.bias.abs().max() == 0 and normal.blocks[0].attn_norm.bias.abs().max() == 0
    gated = GatedLM(replace(GPT2, init="pytorch", gate=GateConfig(position="G1")), seed=1)
    assert torch.equal(gated.blocks[1].attn.q_proj.weight, model.blocks[1].attn.q_proj.weight)


def test_head_dim_can_differ_from_d_model_over_n_heads():
    config = replace(SMALL, d_model=48, n_heads=4, head_dim=32)
    model = GatedLM(config)
    attn = model.blocks[0].attn
    assert attn.q_proj.weight.shape == (4 * 32, 48) and attn.o_proj.weight.shape == (48, 4 * 32)
    assert model(tokens()).shape == (2, 16, config.vocab_size)
    with pytest.raises(ConfigError, match=r"model\.n_heads=5.*or set model\.head_dim"):
        replace(config, head_dim=0, n_heads=5)


def test_partial_rotary_rotates_only_the_leading_dims():
    x = torch.randn(1, 2, 6, 16)
    cos, sin = rope_tables(6, 4, 10000.0)  # rotary dim 4 of 16
    y = apply_rope(x, cos, sin)
    assert torch.equal(y[..., 4:], x[..., 4:])
    assert not torch.allclose(y[..., :4], x[..., :4])
    assert torch.allclose(y[..., :4].norm(dim=-1), x[..., :4].norm(dim=-1), atol=1e-6)  # a rotation
    with pytest.raises(ConfigError, match=r"model\.rope_fraction=0\.1 .*even number of dims >= 2 \(got 0\)"):
        replace(SMALL, rope_fraction=0.1)


def test_norm_plus_one_starts_at_zero_and_computes_the_same_function():
    plain, plus = GatedLM(replace(SMALL, qk_norm=True)), GatedLM(replace(SMALL, qk_norm=True, norm_plus_one=True))
    assert all(p.abs().max() == 0 for n, p in plus.named_parameters() if n.endswith("norm.weight"))
    x = tokens()
    assert torch.allclose(plus(x), plain(x), atol=1e-6)
    with pytest.raises(ConfigError, match=r"model\.norm_plus_one=True .*model\.family='gpt2'"):
        replace(GPT2, norm_plus_one=True)


def test_gate_in_q_interleaves_the_gate_per_head_and_keeps_the_query_rows_paired():
    gate = GateConfig(position="G1")
    separate = GatedLM(replace(SMALL, gate=gate), seed=2)
    fused = GatedLM(replace(SMALL, gate=gate, gate_in_q=True), seed=2)
    baseline = GatedLM(replace(SMALL, gate_in_q=True), seed=2)  # no gate: gate_in_q changes nothing
    assert torch.equal(baseline.blocks[0].attn.q_proj.weight, separate.blocks[0].attn.q_proj.weight)
    heads, dim = SMALL.n_heads, SMALL.head_size
    q_rows = fused.blocks[0].attn.q_proj.weight.view(heads, 2, dim, -1)
    assert torch.equal(q_rows[:, 0].reshape(heads * dim, -1), baseline.blocks[0].attn.q_proj.weight)
    assert fused.num_gate_parameters() == separate.num_gate_parameters() > 0
    with torch.no_grad():  # the same gate weights, placed inside q_proj, give the same model
        for block, other in zip(fused.blocks, separate.blocks, strict=True):
            rows = block.attn.q_proj.weight.view(heads, 2, dim, -1)
            rows[:, 1] = other.attn.gate_proj.weight.view(heads, dim, -1)
    x = tokens()
    assert torch.allclose(fused(x), separate(x), atol=1e-6)
    with pytest.raises(ConfigError, match=r"model\.gate_in_q=True .*G1-headwise"):
        replace(SMALL, gate_in_q=True, gate=GateConfig(position="G1", granularity="headwise"))


def test_harness_attention_matches_transformers_qwen3_next_attention():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    torch.manual_seed(0)
    hf_config = transformers.Qwen3NextConfig(
        hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=1,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.25})
    hf_config._attn_implementation = "eager"
    reference = qwen3_next.Qwen3NextAttention(hf_config, layer_idx=0).eval()
    with torch.no_grad():  # the (1 + w) norms start at w = 0: make them matter
        reference.q_norm.weight.normal_(0, 0.3)
        reference.k_norm.weight.normal_(0, 0.3)
    seq = 16
    config = ModelConfig(d_model=48, n_heads=4, n_kv_heads=2, head_dim=32, rope_fraction=0.25, qk_norm=True,
                         norm_plus_one=True, gate_in_q=True, gate=GateConfig(position="G1"), norm_eps=1e-6,
                         context=seq, rope_theta=10000.0)
    assert config.rotary_dim == 8
    ours = Attention(config).eval()
    ours.load_state_dict(reference.state_dict(), strict=True)  # same names and layouts, the gate inside q_proj
    x = torch.randn(2, seq, 48)
    cos, sin = qwen3_next.Qwen3NextRotaryEmbedding(hf_config)(x, torch.arange(seq)[None].expand(2, -1))
    mask = torch.full((seq, seq), float("-inf")).triu(1)[None, None]
    expected, _ = reference(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)
    got = ours(x, *rope_tables(seq, config.rotary_dim, config.rope_theta))
    assert (got - expected).abs().max().item() < 1e-5
    # and the match is not vacuous: full rotary, or the plain (w) norm, or no gate each break it
    for changed in (replace(config, rope_fraction=1.0), replace(config, norm_plus_one=False)):
        other = Attention(changed).eval()
        other.load_state_dict(reference.state_dict())
        assert (other(x, *rope_tables(seq, changed.rotary_dim, 10000.0)) - expected).abs().max() > 1e-3
