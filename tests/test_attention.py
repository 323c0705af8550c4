"""Every attention variant against a straightforward, independent computation; backends agree."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from stability.config import GateConfig, ModelConfig
from stability.model.attention import Attention, gate_width, rope_tables
from stability.model.lm import GatedLM

BASE = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, context=16, vocab_size=257)

VARIANTS = [GateConfig()] + [
    GateConfig(position=p, granularity=g, activation=a, mode=m, shared_heads=s)
    for p in ("G1", "G2", "G3", "G4")
    for g in ("elementwise", "headwise")
    for a, m in (("sigmoid", "multiplicative"), ("silu", "additive"))
    for s in (False, True)
] + [GateConfig(position="G5"), GateConfig(position="G5", activation="silu", mode="additive")] + [
    GateConfig(position="G1", floor=0.5), GateConfig(position="G2", granularity="headwise", floor=0.25)]


def reference_attention(module: Attention, x: torch.Tensor) -> torch.Tensor:
    """Per-head loops with complex-number RoPE and an explicit softmax, in float64."""
    cfg, gate = module.config, module.gate
    x = x.double()
    batch, seq, _ = x.shape
    heads, kv_heads, dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_size
    w = {name: p.detach().double() for name, p in module.named_parameters()}
    act = (lambda t: gate.floor + (1 - gate.floor) / (1 + torch.exp(-t))) if gate.activation == "sigmoid" \
        else (lambda t: t / (1 + torch.exp(-t)))
    combine = (lambda t, g: t * act(g)) if gate.mode == "multiplicative" else (lambda t, g: t + act(g))

    def split(t, n):  # (B, S, n*D) -> list of n tensors (B, S, D)
        return [t[..., h * dim:(h + 1) * dim] for h in range(n)]

    def gate_for(head, n_heads):  # logits of one head, (B, S, D or 1)
        logits = x @ w["gate_proj.weight"].T
        per = dim if gate.granularity == "elementwise" else 1
        index = 0 if gate.shared_heads else head
        return logits[..., index * per:(index + 1) * per]

    q, k, v = split(x @ w["q_proj.weight"].T, heads), split(x @ w["k_proj.weight"].T, kv_heads), \
        split(x @ w["v_proj.weight"].T, kv_heads)
    if gate.position == "G2":
        v = [combine(v[h], gate_for(h, kv_heads)) for h in range(kv_heads)]
    if gate.position == "G3":
        k = [combine(k[h], gate_for(h, kv_heads)) for h in range(kv_heads)]
    if gate.position == "G4":
        q = [combine(q[h], gate_for(h, heads)) for h in range(heads)]

    positions = torch.arange(seq, dtype=torch.float64)
    freqs = cfg.rope_theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    rotation = torch.polar(torch.ones(seq, dim // 2, dtype=torch.float64), positions[:, None] * freqs[None, :])

    def rope(t):
        z = torch.complex(t[..., : dim // 2], t[..., dim // 2:]) * rotation
        return torch.cat([z.real, z.imag], dim=-1)

    outputs = []
    for h in range(heads):
        kv = h // (heads // kv_heads)
        qh, kh, vh = rope(q[h]), rope(k[kv]), v[kv]
        out = torch.zeros(batch, seq, dim, dtype=torch.float64)
        for i in range(seq):
            scores = torch.stack([(qh[:, i] * kh[:, j]).sum(-1) / math.sqrt(dim) for j in range(i + 1)], dim=-1)
            if cfg.attn_softcap:
                scores = cfg.attn_softcap * torch.tanh(scores / cfg.attn_softcap)
            probs = torch.exp(scores - scores.max(-1, keepdim=True).values)
            probs = probs / probs.sum(-1, keepdim=True)
            out[:, i] = sum(probs[:, j, None] * vh[:, j] for j in range(i + 1))
        if gate.position == "G1":
            out = combine(out, gate_for(h, heads))
        outputs.append(out)
    y = torch.cat(outputs, dim=-1) @ w["o_proj.weight"].T
    if gate.position == "G5":
        y = combine(y, x @ w["gate_proj.weight"].T)
    return y


def make_attention(gate: GateConfig, backend: str = "torch", seed: int = 0, softcap: float = 0.0) -> Attention:
    model = GatedLM(replace(BASE, gate=gate, backend=backend, attn_softcap=softcap), seed=seed)
    attention = model.blocks[0].attn
    with torch.no_grad():  # larger gate weights so the gate really moves values away from 0.5
        if attention.gate_proj is not None:
            attention.gate_proj.weight.mul_(20)
    return attention


@pytest.mark.parametrize("gate", VARIANTS, ids=lambda g: g.label)
def test_every_variant_matches_the_straightforward_computation(gate):
    attention = make_attention(gate)
    x = torch.randn(2, 9, BASE.d_model, generator=torch.Generator().manual_seed(1))
    cos, sin = rope_tables(BASE.context, BASE.rotary_dim, BASE.rope_theta)
    got = attention(x, cos, sin).double()
    want = reference_attention(attention, x)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("gate", [GateConfig(), GateConfig(position="G1"), GateConfig(position="G1",
                         granularity="headwise"), GateConfig(position="G3", activation="silu", mode="additive")],
                         ids=lambda g: g.label)
def test_torch_and_explicit_backends_agree(gate):
    x = torch.randn(3, 16, BASE.d_model, generator=torch.Generator().manual_seed(2))
    cos, sin = rope_tables(BASE.context, BASE.rotary_dim, BASE.rope_theta)
    fused = make_attention(gate, "torch")(x, cos, sin)
    explicit = make_attention(gate, "explicit")(x, cos, sin)
    assert torch.allclose(fused, explicit, atol=1e-5), (fused - explicit).abs().max()


@pytest.mark.parametrize("gate", [GateConfig(), GateConfig(position="G1", floor=0.5)], ids=lambda g: g.label)
def test_soft_capped_scores_match_the_straightforward_computation(gate):
    """cap * tanh(s / cap) on the scores, with a cap that bites (scores of up to ~8 here, cap 2)."""
    attention = make_attention(gate, softcap=2.0)
    with torch.no_grad():  # large q, k weights so the scores reach past the cap
        attention.q_proj.weight.mul_(30)
        attention.k_proj.weight.mul_(30)
    x = torch.randn(2, 9, BASE.d_model, generator=torch.Generator().manual_seed(4))
    cos, sin = rope_tables(BASE.context, BASE.rotary_dim, BASE.rope_theta)
    got = attention(x, cos, sin).double()
    assert torch.allclose(got, reference_attention(attention, x), atol=2e-5, rtol=1e-4)
    uncapped = replace(attention.config, attn_softcap=0.0)
    attention.config = uncapped  # the same weights without the cap give another output: the cap bites
    assert (attention(x, cos, sin).double() - got).abs().max() > 1e-3


def test_a_floored_gate_never_closes_below_its_floor():
    attention = make_attention(GateConfig(position="G1", floor=0.5))
    seen = []
    attention.observer = lambda name, tensor: seen.append(tensor) if name == "gate_score" else None
    with torch.no_grad():
        attention.gate_proj.weight.mul_(-50)  # logits far below 0: a plain sigmoid would be ~0
        attention(torch.randn(2, 9, BASE.d_model), *rope_tables(BASE.context, BASE.rotary_dim, BASE.rope_theta))
    assert seen and seen[0].min() >= 0.5 and seen[0].min() < 0.5 + 1e-3


def test_gate_changes_the_output():
    """The gated variant must not silently compute the baseline."""
    x = torch.randn(2, 8, BASE.d_model, generator=torch.Generator().manual_seed(3))
    cos, sin = rope_tables(BASE.context, BASE.rotary_dim, BASE.rope_theta)
    base = make_attention(GateConfig())(x, cos, sin)
    gated = make_attention(GateConfig(position="G1"))(x, cos, sin)
    assert (base - gated).abs().max() > 1e-3


@pytest.mark.parametrize("granularity", ["elementwise", "headwise"])
def test_extra_parameters_match_the_paper(granularity):
    """Qiu et al.: elementwise G1 adds d_model*H*D per layer, headwise adds d_model*H."""
    config = ModelConfig(d_model=64, n_layers=3, n_heads=4, n_kv_heads=2)
    d_model, heads, dim = config.d_model, config.n_heads, config.head_size
    per_layer = d_model * heads * dim if granularity == "elementwise" else d_model * heads
    expected = per_layer * config.n_layers
    gated = GatedLM(replace(config, gate=GateConfig(position="G1", granularity=granularity)))
    assert gated.num_parameters() - GatedLM(config).num_parameters() == expected
    assert gate_width(replace(config, gate=GateConfig(position="G1", granularity=granularity))) * d_model \
        * config.n_layers == expected


def test_shared_parameters_start_identical_across_arms():
    """Paired arms differ only by the gate: every shared parameter has the same initial value."""
    base = GatedLM(BASE, seed=7).state_dict()
    gated = GatedLM(replace(BASE, gate=GateConfig(position="G1")), seed=7).state_dict()
    extra = set(gated) - set(base)
    assert extra and all("gate_proj" in name for name in extra)
    assert all(torch.equal(base[name], gated[name]) for name in base)
    other_seed = GatedLM(BASE, seed=8).state_dict()
    assert not torch.equal(base["blocks.0.attn.q_proj.weight"], other_seed["blocks.0.attn.q_proj.weight"])


def test_model_rejects_sequences_longer_than_its_context():
    model = GatedLM(BASE)
    with pytest.raises(ValueError, match=r"length 17 exceeds the 16 positions .*model.context=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    model.set_positions(32)  # the extrapolation probe extends the rotary tables ...
    assert model(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, BASE.vocab_size)
