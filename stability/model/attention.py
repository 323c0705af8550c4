"""Causal self-attention with the gate variants of Qiu et al. (2025) and three backends.

Shapes: x is (B, S, d_model); inside, q is (B, H, S, D) and k, v are (B, Hkv, S, D)
with H query heads, Hkv key/value heads (grouped-query attention) and head dim D.

The gate is ``act(x @ W_g)`` computed from the same normalised hidden state x that feeds
Q, K and V (no bias), and multiplies (or, in the additive variant, is added to) one
tensor of the attention:

    G1  the SDPA output of each head, before W_o   (the paper's recommendation)
    G2  the value projection output
    G3  the key projection output
    G4  the query projection output
    G5  the output of W_o

A floored gate (``gate.floor`` f > 0) scores ``f + (1 - f) * sigmoid(logit)``: it can never
close below f (the paper's control uses f = 0.5).

Attention soft-capping (``model.attn_softcap`` c > 0, Gemma 2) replaces the scaled scores s by
``c * tanh(s / c)`` before the mask and the softmax; it needs the explicit path.

Backends compute the same function: "torch" (fused ``scaled_dot_product_attention``),
"explicit" (materialises the probabilities; probes read them through ``observer``) and
"triton" (the fused kernel of ``stability.kernels``, with a plain G1 sigmoid gate fused in).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from stability.config import GateConfig, ModelConfig

Observer = Callable[[str, torch.Tensor], None]


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim with a learned gain (computed in fp32).

    ``plus_one``: the gain is ``1 + weight`` with ``weight`` starting at 0 (Qwen3-Next, Gemma), so
    weight decay pulls the gain towards 1 instead of 0."""

    def __init__(self, dim: int, eps: float = 1e-6, plus_one: bool = False):
        super().__init__()
        self.eps = eps
        self.plus_one = plus_one
        self.weight = nn.Parameter(torch.zeros(dim) if plus_one else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        gain = 1.0 + self.weight.float() if self.plus_one else self.weight.float()
        return (x32 * gain).to(x.dtype)


def rope_tables(context: int, rotary_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (context, rotary_dim / 2) for rotary position embeddings with base theta."""
    inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.outer(torch.arange(context, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (first half, second half) of the leading ``2 * cos.shape[-1]`` dims of x
    (B, heads, S, D); the remaining dims pass unrotated (partial rotary when fewer than D)."""
    seq, rotary = x.shape[-2], 2 * cos.shape[-1]
    cos, sin = cos[:seq].to(x.dtype), sin[:seq].to(x.dtype)
    rotated, passed = x[..., :rotary], x[..., rotary:]
    x1, x2 = rotated.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, passed], dim=-1)


def gate_width(config: ModelConfig) -> int:
    """Number of gate logits per token: the extra parameters are ``d_model * gate_width``."""
    gate = config.gate
    if not gate.enabled:
        return 0
    if gate.position == "G5":
        return config.d_model
    heads = config.n_kv_heads if gate.position in ("G2", "G3") else config.n_heads
    per_head = config.head_size if gate.granularity == "elementwise" else 1
    return per_head * (1 if gate.shared_heads else heads)


def gate_score(logits: torch.Tensor, gate: GateConfig) -> torch.Tensor:
    """The gate's value: ``act(logits)``, raised to ``floor + (1 - floor) * sigmoid`` for a floored gate."""
    if gate.activation == "silu":
        return F.silu(logits)
    score = torch.sigmoid(logits)
    return gate.floor + (1.0 - gate.floor) * score if gate.floor else score


def apply_gate(target: torch.Tensor, logits: torch.Tensor, gate: GateConfig) -> torch.Tensor:
    """``target * score`` or ``target + score`` (score from ``gate_score``); logits broadcast against target."""
    score = gate_score(logits, gate)
    return target * score if gate.mode == "multiplicative" else target + score


def explicit_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                       observer: Observer | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Causal attention that materialises the (B, H, S, S) probabilities, in fp32.

    ``softcap`` c > 0 turns the scaled scores s into ``c * tanh(s / c)``. The observer, when given,
    sees "attn_logits" (scaled scores before the cap and the mask) and "attn_probs"."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    seq = q.shape[-2]
    mask = torch.ones(seq, seq, dtype=torch.bool, device=q.device).tril()
    if observer is not None:
        observer("attn_logits", scores.masked_fill(~mask, float("-inf")))
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    if observer is not None:
        observer("attn_probs", probs)
    return (probs @ v.float()).to(q.dtype)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention through PyTorch's fused SDPA (grouped-query aware)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)


class Attention(nn.Module):
    """Multi-head causal self-attention with an optional gate (see module docstring).

    ``gate_in_q`` (G1 elementwise only): no separate gate_proj; q_proj produces, per head, the query
    followed by that head's gate logits ([q_0, g_0, q_1, g_1, ...], each head_size wide), as Qwen3-Next
    lays them out. Without rotary tables (``cos is None``, the gpt2 family) positions come from elsewhere."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.gate = config.gate
        d, heads, kv_heads, head_dim = config.d_model, config.n_heads, config.n_kv_heads, config.head_size
        self.gate_in_q = config.gate_in_q and self.gate.enabled
        bias = config.bias
        self.q_proj = nn.Linear(d, heads * head_dim * (2 if self.gate_in_q else 1), bias=bias)
        self.k_proj = nn.Linear(d, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(d, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=bias)
        self.gate_proj = nn.Linear(d, gate_width(config), bias=False) \
            if self.gate.enabled and not self.gate_in_q else None
        self.q_norm = RMSNorm(head_dim, config.norm_eps, config.norm_plus_one) if config.qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.norm_eps, config.norm_plus_one) if config.qk_norm else None
        self.scale = 1.0 / math.sqrt(head_dim)
        self.backend = config.backend
        self.observer: Observer | None = None  # set by probes; forces the explicit backend

    def _heads(self, t: torch.Tensor, n_heads: int) -> torch.Tensor:
        """(B, S, n * D) -> (B, n, S, D): ``n_heads`` heads, or twice as many when q carries the gate."""
        batch, seq, _ = t.shape
        return t.view(batch, seq, -1, self.config.head_size).transpose(1, 2)

    def _gate_logits(self, x: torch.Tensor, n_heads: int) -> torch.Tensor:
        """Gate logits shaped to broadcast against a (B, n_heads, S, D) tensor."""
        logits = self.gate_proj(x)  # (B, S, gate_width)
        per_head = self.config.head_size if self.gate.granularity == "elementwise" else 1
        batch, seq, _ = logits.shape
        groups = 1 if self.gate.shared_heads else n_heads
        return logits.view(batch, seq, groups, per_head).transpose(1, 2)

    def _observe_gate(self, logits: torch.Tensor) -> None:
        if self.observer is not None:
            self.observer("gate_score", gate_score(logits, self.gate))

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        cfg, gate = self.config, self.gate
        q = self._heads(self.q_proj(x), cfg.n_heads)
        k = self._heads(self.k_proj(x), cfg.n_kv_heads)
        v = self._heads(self.v_proj(x), cfg.n_kv_heads)
        gate_logits = None
        if self.gate_in_q:  # heads interleaved as [q_0, g_0, q_1, g_1, ...]
            q, gate_logits = q[:, 0::2].contiguous(), q[:, 1::2].contiguous()
            self._observe_gate(gate_logits)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if gate.enabled and gate.position != "G5" and not self.gate_in_q:
            heads = cfg.n_kv_heads if gate.position in ("G2", "G3") else cfg.n_heads
            gate_logits = self._gate_logits(x, heads)
            self._observe_gate(gate_logits)
            # G3/G4 act after QK-norm: before it, a headwise gate would be normalised away exactly
            if gate.position == "G2":
                v = apply_gate(v, gate_logits, gate)
            elif gate.position == "G3":
                k = apply_gate(k, gate_logits, gate)
            elif gate.position == "G4":
                q = apply_gate(q, gate_logits, gate)
        if cos is not None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        fuse_gate = gate.position == "G1" and gate.activation == "sigmoid" and gate.mode == "multiplicative" \
            and not gate.floor
        if self.observer is not None or self.backend == "explicit" or cfg.attn_softcap:
            y = explicit_attention(q, k, v, self.scale, self.observer, cfg.attn_softcap)
        elif self.backend == "triton":
            from stability.kernels import gated_attention

            # (B, H or 1, S, D or 1) -> (B, H, S, D or 1), the shapes the kernel takes
            fused = gate_logits.expand(-1, q.shape[1], -1, -1) if fuse_gate else None
            y = gated_attention(q, k, v, gate=fused, causal=True, scale=self.scale)
        else:
            y = torch_attention(q, k, v, self.scale)
        already_gated = self.backend == "triton" and fuse_gate and self.observer is None
        if gate.position == "G1" and not already_gated:
            y = apply_gate(y, gate_logits, gate)

        batch, _, seq, _ = y.shape
        out = self.o_proj(y.transpose(1, 2).reshape(batch, seq, -1))
        if gate.position == "G5":
            logits = self.gate_proj(x)
            self._observe_gate(logits)
            out = apply_gate(out, logits, gate)
        return out
