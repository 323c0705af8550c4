"""Model factories for the tests of ``model.factory`` (importable as ``_factories``: tests/ is on the path).

``tiny_lm`` is "your own module": a small decoder written here, not by the harness, whose gated arm
gets the G1 gate from ``stability.model.inject.inject_gate``. The others are bad factories."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stability.config import ModelConfig
from stability.model.inject import inject_gate
from stability.model.lm import GatedLM


class SelfAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, d))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = SelfAttention(d, heads)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.ff(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Parameter(torch.zeros(config.context, config.d_model))
        self.layers = nn.ModuleList(Layer(config.d_model, config.n_heads) for _ in range(config.n_layers))
        self.out = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def tiny_lm(config: ModelConfig) -> nn.Module:
    model = TinyLM(config)
    if config.gate.enabled:
        inject_gate(model, config.gate, seed=0, n_heads=config.n_heads)
    return model


def harness_lm(config: ModelConfig) -> nn.Module:
    return GatedLM(config, seed=0)


def ignores_the_gate(config: ModelConfig) -> nn.Module:
    return TinyLM(config)


def not_a_module(config: ModelConfig):
    return {"model": "not a module"}


class Flat(nn.Module):
    """Embedding, one block of a Linear, a head of ``out`` logits: no attention anywhere."""

    def __init__(self, vocab: int, out: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.blocks = nn.ModuleList([nn.Linear(8, 8)])
        self.head = nn.Linear(8, out)

    def forward(self, tokens):
        return self.head(self.blocks[0](self.embed(tokens)))


def wrong_output(config: ModelConfig) -> nn.Module:
    return Flat(config.vocab_size, 8)  # (B, S, 8): too few logits


def no_attention(config: ModelConfig) -> nn.Module:
    model = Flat(config.vocab_size, config.vocab_size)
    if config.gate.enabled:
        inject_gate(model, config.gate, seed=0)
    return model


def reads_only_enabled(config: ModelConfig) -> nn.Module:
    """The paper's gate in every gated arm, whatever else ``config.gate`` says: a factory that reads only
    ``gate.enabled`` (every control arm would get the same gate)."""
    from dataclasses import replace

    from stability.config import GateConfig

    return GatedLM(replace(config, gate=GateConfig(position="G1") if config.gate.enabled else config.gate), seed=0)


class Unobserved(GatedLM):
    """The harness's model with its attention's calls of ``observer(name, tensor)`` for ``hidden`` dropped."""

    hidden = "gate_score"

    def set_observer(self, observer) -> None:
        super().set_observer(None if observer is None else (
            lambda layer, name, tensor: None if name == self.hidden else observer(layer, name, tensor)))


def hides_the_gate_score(config: ModelConfig) -> nn.Module:
    return Unobserved(config, seed=0)
