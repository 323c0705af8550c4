"""The harness's own small decoder-only language model, in two architecture families.

``model.family="llama"`` (Llama / Qwen style): RMSNorm pre-norm blocks, rotary positions (optionally
partial), SwiGLU MLP, tied or untied head. ``model.family="gpt2"``: LayerNorm (gain and bias) pre-norm
blocks, learned absolute position embeddings, GELU MLP (4x wide), untied head. Both use the same
grouped-query attention with the optional gate (``stability.model.attention``), optional QK-norm and
optional Linear biases, so every gate variant works the same way in either family.

Initialisation is keyed by parameter name: every parameter draws from its own generator
seeded by (seed, name), so a baseline and a gated model built with the same seed start
with identical values in every parameter they share; only the gate weights differ (with
``gate_in_q`` the gate rows of q_proj draw from their own generator and the query rows
equal the reference arm's q_proj). ``model.init``: "normal" is N(0, init_std) with the output
projections scaled by 1/sqrt(2 n_layers), biases 0; "pytorch" is PyTorch's default layer
init (Linear weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)), embeddings N(0, 1)).
Norm gains start at 1 (at 0 with ``norm_plus_one``), norm biases at 0.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from stability.config import ModelConfig
from stability.model.attention import Attention, RMSNorm, rope_tables


class SwiGLU(nn.Module):
    """``W_down(silu(W_gate x) * W_up x)``; the MLP of Llama-style blocks."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        super().__init__()
        self.w_gate = nn.Linear(d_model, d_ff, bias=bias)
        self.w_up = nn.Linear(d_model, d_ff, bias=bias)
        self.w_down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class GeluMLP(nn.Module):
    """``W_down(gelu(W_up x))``; the MLP of GPT-2 blocks (tanh approximation, as GPT-2)."""

    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.w_up = nn.Linear(d_model, d_ff, bias=bias)
        self.w_down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.gelu(self.w_up(x), approximate="tanh"))


def make_norm(config: ModelConfig) -> nn.Module:
    """The family's norm over d_model: RMSNorm (llama) or LayerNorm with gain and bias (gpt2)."""
    if config.family == "gpt2":
        return nn.LayerNorm(config.d_model, eps=config.norm_eps)
    return RMSNorm(config.d_model, config.norm_eps, config.norm_plus_one)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x)). Output is the residual stream."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = make_norm(config)
        self.attn = Attention(config)
        self.mlp_norm = make_norm(config)
        self.mlp = GeluMLP(config.d_model, config.ffn_dim, config.bias) if config.family == "gpt2" \
            else SwiGLU(config.d_model, config.ffn_dim, config.bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class GatedLM(nn.Module):
    """Token ids (B, S) -> next-token logits (B, S, vocab_size)."""

    def __init__(self, config: ModelConfig, seed: int = 0):
        super().__init__()
        self.config = config
        gpt2 = config.family == "gpt2"
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.context, config.d_model) if gpt2 else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = make_norm(config)
        tied = config.tie_embeddings and not gpt2
        self.lm_head = None if tied else nn.Linear(config.d_model, config.vocab_size, bias=False)
        if not gpt2:
            cos, sin = rope_tables(config.context, config.rotary_dim, config.rope_theta)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = self.rope_sin = None
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Each parameter from its own generator seeded by (seed, name); see the module docstring."""
        for name, param in self.named_parameters():
            if name.endswith(("norm.weight", "norm.bias")):
                plus_one = getattr(self.get_submodule(name.rpartition(".")[0]), "plus_one", False)
                param.fill_(1.0 if name.endswith("weight") and not plus_one else 0.0)
                continue
            if name.endswith("attn.q_proj.weight") and self.config.gate_in_q and self.config.gate.enabled:
                query, gate = (self._draw(name, (param.shape[0] // 2, param.shape[1]), seed, key)
                               for key in (name, name + ":gate"))
                heads = self.config.n_heads
                values = torch.stack([query.view(heads, -1, param.shape[1]), gate.view(heads, -1, param.shape[1])],
                                     dim=1).reshape(param.shape)  # per head: its query rows, then its gate rows
            else:
                values = self._draw(name, param.shape, seed, name)
            param.copy_(values.to(param.device, param.dtype))

    def _draw(self, name: str, shape, seed: int, key: str) -> torch.Tensor:
        """Initial values of the parameter ``name`` (of ``shape``) from the generator of (seed, key)."""
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
        std = self.config.init_std
        if self.config.init == "pytorch":
            if "embed" in name:
                return torch.randn(shape, generator=generator)
            fan_in = self.get_parameter(name.rpartition(".")[0] + ".weight").shape[1]
            return (torch.rand(shape, generator=generator) * 2 - 1) / math.sqrt(fan_in)
        if name.endswith(".bias"):
            return torch.zeros(shape)
        scale = std / math.sqrt(2 * self.config.n_layers) if name.endswith(("o_proj.weight", "w_down.weight")) \
            else std
        return torch.randn(shape, generator=generator, dtype=torch.float32) * scale
    def set_positions(self, length: int, theta: float | None = None) -> None:
        """Rebuild the rotary tables for ``length`` positions with base ``theta`` (default model.rope_theta):
        the length-extrapolation probe reads sequences longer than the training context this way."""
        cos, sin = rope_tables(length, self.config.rotary_dim, theta or self.config.rope_theta)
        self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.config.context if self.rope_cos is None else self.rope_cos.shape[0]
        if tokens.shape[1] > positions:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the {positions} positions of the model "
                             f"(model.context={self.config.context})")
        x = self.embed(tokens)
        if self.pos_embed is not None:
            x = x + self.pos_embed.weight[: tokens.shape[1]]
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

    @property
    def block_names(self) -> list[str]:
        return [f"blocks.{i}" for i in range(len(self.blocks))]

    def num_gate_parameters(self) -> int:
        """Weights of the gate (with gate_in_q: the gate rows inside q_proj)."""
        if self.config.gate_in_q and self.config.gate.enabled:
            return sum(b.attn.q_proj.weight.numel() // 2 for b in self.blocks)
        return sum(p.numel() for p in self.gate_parameters())

    def describe(self) -> dict:
        """What the record says about this model."""
        return {"source": "harness", "class": type(self).__name__, "family": self.config.family,
                "attention_backend": self.config.backend}

    def gate_parameters(self) -> list[nn.Parameter]:
        """The gate's own weights (with gate_in_q they live inside q_proj and are not listed)."""
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
