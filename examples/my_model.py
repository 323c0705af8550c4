"""An example of ``model.factory``: a small decoder written outside the harness, gated by injection.

    PYTHONPATH=examples stability run --preset smoke --set model.factory=my_model:build --no-track

``build(config)`` is called once per arm with that arm's ``ModelConfig`` (sizes, and ``config.gate``:
enabled for the gated arm) after ``torch.manual_seed(seed)``; it returns an ``nn.Module`` mapping
token ids (B, S) to logits (B, S, vocab_size). Its attention modules have ``q_proj`` and ``o_proj``
and feed ``o_proj`` the heads concatenated head after head, so ``stability.model.inject.inject_gate`` can
add the G1 gate; its blocks are found as the parents of those attention modules.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stability.config import ModelConfig
from stability.model.inject import inject_gate


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = (proj(x).view(batch, seq, self.n_heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attention = CausalSelfAttention(d_model, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class MyLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.positions = nn.Parameter(torch.randn(config.context, config.d_model) * 0.02)
        self.layers = nn.ModuleList(Block(config.d_model, config.n_heads) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions[: tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build(config: ModelConfig) -> nn.Module:
    """The model of one arm: the gated arm gets the G1 gate before each attention's o_proj."""
    model = MyLM(config)
    if config.gate.enabled:
        inject_gate(model, config.gate, seed=0, n_heads=config.n_heads)
    return model
