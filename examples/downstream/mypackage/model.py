"""A small decoder-only language model with its own attention and its own output gate.

    model = TinyLM(vocab=257, width=64, layers=2, heads=4, context=64, gated=True)
    logits = model(tokens)              # tokens (B, S) -> logits (B, S, vocab)

``build(config)`` is the factory the stability suites call (``model.factory = "mypackage.model:build"``
in this repository's ``[tool.stability]``): once per arm, after seeding torch, with that arm's model
config. It reads the sizes (``vocab_size``, ``d_model``, ``n_layers``, ``n_heads``, ``context``) and
``gate.enabled``: the gated arm gets the gate, the reference arm does not. Each attention calls
``self.observer(name, tensor)`` when the stability probes set it (the attention logits and probabilities,
the gate's scores), so F-Attn, the sink rate and the largest attention logit are measured for this model
too. Nothing here imports stability.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Attention(nn.Module):
    """Causal multi-head self-attention. With ``gated``, each head's output is multiplied elementwise by
    sigmoid(x W_g + b_g) before the output projection."""

    def __init__(self, width: int, heads: int, gated: bool):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.gate_proj = nn.Linear(width, width) if gated else None
        self.observer = None   # observer(name, tensor), set while the stability probes look

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        logits = (q @ k.transpose(-1, -2)) * self.scale                          # (B, H, S, S)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        logits = logits.masked_fill(~causal, float("-inf"))
        probs = logits.softmax(dim=-1)
        if self.observer is not None:
            self.observer("attn_logits", logits)
            self.observer("attn_probs", probs)
        y = (probs @ v).transpose(1, 2).reshape(batch, length, width)             # heads side by side
        if self.gate_proj is not None:
            score = torch.sigmoid(self.gate_proj(x))
            if self.observer is not None:
                self.observer("gate_score", score)
            y = y * score
        return self.out(y)


class Block(nn.Module):
    """Pre-norm residual block: attention, then an MLP."""

    def __init__(self, width: int, heads: int, gated: bool):
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads, gated)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm_1(x))
        return x + self.mlp(self.norm_2(x))


class TinyLM(nn.Module):
    """Token and learned position embeddings, ``layers`` blocks, a final norm and an untied head."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int, gated: bool = False):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, gated) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(config) -> TinyLM:
    """The model of one arm (stability's factory contract): sizes from ``config``, the gate when
    ``config.gate.enabled``."""
    return TinyLM(config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.context,
                  gated=config.gate.enabled)
