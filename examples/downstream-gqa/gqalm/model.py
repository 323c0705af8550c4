"""A decoder-only language model with grouped-query attention and an optional per-head output gate.

    model = GroupedLM(vocab=257, width=64, layers=2, heads=4, kv_heads=2, context=64, gate=Gate())
    logits = model(tokens)              # tokens (B, S) -> logits (B, S, vocab)

Grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value heads (each key/value head
serves heads / kv_heads query heads). Positions are learned (one vector per position, added to the token
embedding). Blocks are pre-norm (RMSNorm), attention then a SiLU MLP. Each attention's output is
soft-capped to (-OUTPUT_CAP, OUTPUT_CAP) with a tanh written out in exponentials (``soft_cap``). The gate,
when there is one, multiplies each query head's attention output by floor + (1 - floor) * sigmoid(x W_g +
b_g), computed from the block's normalised input x: one score per channel ("elementwise") or one per head
("headwise").

What this model does in fp16 (the stability suites' precision ladder finds it): at a high learning rate
the ungated attention's output grows past 5.5 * OUTPUT_CAP within a few steps, where exp overflows fp16;
the capped value is still right, but its gradient is inf / inf = NaN at every step from then on, so the
loss scaler skips every remaining step and the fp16 run of the reference arm ends well above its fp32 run.
The gate keeps the gated arm's attention output small enough that it never overflows.

``build(config)`` is the factory the stability suites call (``model.factory = "gqalm.model:build"``):
once per arm, after seeding torch, with that arm's model config. It reads the sizes (``vocab_size``,
``d_model``, ``n_layers``, ``n_heads``, ``n_kv_heads``, ``context``) and the gate (``config.gate``: its
``position``, ``granularity`` and ``floor``); a gate setting this model does not have (a position other
than "none" or "G1", heads sharing one gate, another activation or mode) is refused with a ValueError.
Each attention calls ``self.observer(name, tensor)`` when the stability probes set it. Nothing here
imports stability.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

OUTPUT_CAP = 10.0   # each attention's output is soft-capped to (-OUTPUT_CAP, OUTPUT_CAP)


@dataclass(frozen=True)
class Gate:
    """The output gate of every attention: ``granularity`` "elementwise" (a score per channel) or
    "headwise" (a score per head); scores never fall below ``floor``."""

    granularity: str = "elementwise"
    floor: float = 0.0


class RMSNorm(nn.Module):
    """x / rms(x), times a learned gain per channel."""

    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


class GroupedAttention(nn.Module):
    """Causal grouped-query self-attention with an optional per-head output gate (``gate``: a Gate or None)."""

    def __init__(self, width: int, heads: int, kv_heads: int, gate: Gate | None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, width // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(width, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, width, bias=False)
        self.gate = gate
        if gate is not None:
            scores = heads * self.head_dim if gate.granularity == "elementwise" else heads
            self.gate_proj = nn.Linear(width, scores)
        self.observer = None   # observer(name, tensor), set while the stability probes look

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)       # (B, H, S, D)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)    # (B, KV, S, D)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)             # (B, H, S, D)
        logits = (q @ k.transpose(-1, -2)) * self.scale                                         # (B, H, S, S)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        logits = logits.masked_fill(~causal, float("-inf"))
        probs = logits.softmax(dim=-1)
        if self.observer is not None:
            self.observer("attn_logits", logits)
            self.observer("attn_probs", probs)
        y = (probs @ v).transpose(1, 2)                                                         # (B, S, H, D)
        if self.gate is not None:
            score = torch.sigmoid(self.gate_proj(x)).view(batch, length, self.heads, -1)        # (B, S, H, D or 1)
            score = self.gate.floor + (1.0 - self.gate.floor) * score
            if self.observer is not None:
                self.observer("gate_score", score.transpose(1, 2))                               # (B, H, S, D or 1)
            y = y * score
        return soft_cap(self.o_proj(y.reshape(batch, length, self.heads * self.head_dim)), OUTPUT_CAP)


def soft_cap(y: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(y / cap), the tanh written out as 1 - 2 / (exp(2 y / cap) + 1).

    In fp16, exp overflows once y / cap passes 5.5 (in fp32 once it passes 44): the value is still right,
    but its gradient is inf / inf = NaN."""
    return cap * (1.0 - 2.0 / (torch.exp(2.0 * y / cap) + 1.0))


class Block(nn.Module):
    """Pre-norm residual block: grouped-query attention, then a SiLU MLP."""

    def __init__(self, width: int, heads: int, kv_heads: int, gate: Gate | None):
        super().__init__()
        self.attn_norm, self.mlp_norm = RMSNorm(width), RMSNorm(width)
        self.attention = GroupedAttention(width, heads, kv_heads, gate)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.SiLU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GroupedLM(nn.Module):
    """Token embeddings plus learned positions, ``layers`` blocks, a final norm and an untied head."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, kv_heads: int, context: int,
                 gate: Gate | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.positions = nn.Parameter(torch.randn(context, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads, kv_heads, gate) for _ in range(layers))
        self.norm = RMSNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def gate_of(gate_config) -> Gate | None:
    """This model's gate for stability's gate config (None: the reference arm); ValueError for a setting
    it does not have."""
    if gate_config.position == "none":
        return None
    unsupported = {"position": (gate_config.position, "G1"), "activation": (gate_config.activation, "sigmoid"),
                   "mode": (gate_config.mode, "multiplicative"), "shared_heads": (gate_config.shared_heads, False)}
    for name, (value, supported) in unsupported.items():
        if value != supported:
            raise ValueError(f"gate.{name}={value!r} is not supported by this model: expected {supported!r}")
    return Gate(granularity=gate_config.granularity, floor=gate_config.floor)


def build(config) -> GroupedLM:
    """The model of one arm (stability's factory contract): sizes from ``config``, the gate from
    ``config.gate``."""
    model = GroupedLM(config.vocab_size, config.d_model, config.n_layers, config.n_heads, config.n_kv_heads,
                      config.context, gate=gate_of(config.gate))
    return model
