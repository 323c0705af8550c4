"""A small decoder-only language model in the style of Llama / Qwen.

RMSNorm pre-norm blocks, rotary positions, SwiGLU MLP, grouped-query attention with the
optional gate (``stability.attention``), optional QK-norm, tied or untied embeddings.

Initialisation is keyed by parameter name: every parameter draws from its own generator
seeded by (seed, name), so a baseline and a gated model built with the same seed start
with identical values in every parameter they share; only the gate weights differ.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from stability.attention import Attention, RMSNorm, rope_tables
from stability.config import ModelConfig


class SwiGLU(nn.Module):
    """``W_down(silu(W_gate x) * W_up x)``; the MLP of Llama-style blocks."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=False)
        self.w_up = nn.Linear(d_model, d_ff, bias=False)
        self.w_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x)). Output is the residual stream."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = SwiGLU(config.d_model, config.ffn_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class GatedLM(nn.Module):
    """Token ids (B, S) -> next-token logits (B, S, vocab_size)."""

    def __init__(self, config: ModelConfig, seed: int = 0):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.context, config.head_dim, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Normal(0, init_std) weights, output projections scaled by 1/sqrt(2 * n_layers), unit norm gains."""
        std = self.config.init_std
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            scale = std / math.sqrt(2 * self.config.n_layers) if name.endswith(("o_proj.weight", "w_down.weight")) \
                else std
            values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * scale
            param.copy_(values.to(param.device, param.dtype))

    def set_positions(self, length: int, theta: float | None = None) -> None:
        """Rebuild the rotary tables for ``length`` positions with base ``theta`` (default model.rope_theta):
        the length-extrapolation probe reads sequences longer than the training context this way."""
        cos, sin = rope_tables(length, self.config.head_dim, theta or self.config.rope_theta)
        self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.rope_cos.shape[0]:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the {self.rope_cos.shape[0]} positions of "
                             f"the rotary tables (model.context={self.config.context})")
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        x = self.norm(x)
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, weight)

    def set_observer(self, observer) -> None:
        """Give every attention layer an observer ``fn(layer, name, tensor)``; None removes it."""
        for index, block in enumerate(self.blocks):
            block.attn.observer = None if observer is None else (
                lambda name, tensor, index=index: observer(index, name, tensor))

    def gate_parameters(self) -> list[nn.Parameter]:
        return [b.attn.gate_proj.weight for b in self.blocks if b.attn.gate_proj is not None]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of logits (B, S, V) against targets (B, S), in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean squared log-partition ``mean(logsumexp(logits)^2)`` over positions of (B, S, V) logits, in fp32:
    the auxiliary loss of PaLM (Chowdhery et al. 2022), added with a small coefficient (``optim.z_loss``)."""
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
