"""Inject the G1 gate into attention modules the harness did not write (Hugging Face models, your own).

An attention module qualifies when it has ``q_proj`` and ``o_proj`` Linears and its output
projection reads the heads' outputs concatenated head after head ((B, S, H * D), the layout of
Llama, Qwen2, Qwen3, Mistral and most decoder-only models). For each such module,
``inject_gate`` adds one bias-free Linear ``attn_gate`` (d_model -> H * D elementwise, or H
headwise) and two forward pre-hooks:

* on the attention module: remember its input hidden state x (the normalised residual stream
  that also feeds q, k and v);
* on ``o_proj``: replace its input y by ``y * sigmoid(x @ W_g)``, per head and channel
  (elementwise) or per head (headwise); ``gate.activation`` / ``gate.mode`` as in
  ``stability.model.attention.apply_gate``.

Why hooks and not the other two ways transformers offers. The attention-function registry
(``AttentionInterface``) is handed q, k, v and the mask but not the hidden state, so the gate's
input is not there. Replacing the attention class means re-writing each architecture's forward
(Llama's, Qwen3's with its QK-norm, ...) and keeping the copies in step with transformers. The
two hooks use only what every such module has (an input and an ``o_proj``), leave every
existing parameter name unchanged (so the reference and gated arms share names and values), and
work with whatever attention implementation (sdpa, eager, flash) the model runs. The hooks are
bound methods of the gate module, so ``copy.deepcopy`` of the model rebinds them to the copy.
"""

from __future__ import annotations

import zlib

import torch
from torch import nn

from stability.config import ConfigError, GateConfig
from stability.model.attention import apply_gate

__all__ = ["G1Gate", "attention_modules", "inject_gate"]


class G1Gate(nn.Linear):
    """The G1 gate of one attention module: ``act(x @ W_g)`` applied to o_proj's input (see module doc)."""

    def __init__(self, d_model: int, n_heads: int, head_dim: int, gate: GateConfig):
        self.n_heads, self.head_dim, self.gate = n_heads, head_dim, gate
        per_head = head_dim if gate.granularity == "elementwise" else 1
        super().__init__(d_model, per_head * (1 if gate.shared_heads else n_heads), bias=False)
        self.observer = None  # fn(name, tensor), set by the probes
        self._x: torch.Tensor | None = None

    def remember_input(self, _module, args, kwargs):
        """Forward pre-hook of the attention module: keep its hidden-state input."""
        self._x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

    def gate_output(self, _module, args):
        """Forward pre-hook of o_proj: gate the concatenated head outputs (B, S, H * D)."""
        y, x = args[0], self._x
        self._x = None
        if x is None:
            raise RuntimeError("the G1 gate saw o_proj run without its attention module's input")
        batch, seq, _ = y.shape
        logits = super().forward(x).view(batch, seq, -1, self.out_features // (1 if self.gate.shared_heads
                                                                                else self.n_heads))
        if self.observer is not None:
            score = torch.sigmoid(logits) if self.gate.activation == "sigmoid" else torch.nn.functional.silu(logits)
            self.observer("gate_score", score.transpose(1, 2))
        gated = apply_gate(y.view(batch, seq, self.n_heads, self.head_dim), logits, self.gate)
        return (gated.reshape(batch, seq, -1), *args[1:])


def attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module with ``q_proj`` and ``o_proj`` Linears, in registration order."""
    return [(name, module) for name, module in model.named_modules()
            if isinstance(getattr(module, "q_proj", None), nn.Linear)
            and isinstance(getattr(module, "o_proj", None), nn.Linear)]


def inject_gate(model: nn.Module, gate: GateConfig, seed: int, n_heads: int | None = None,
                init_std: float = 0.02, what: str = "model") -> list[G1Gate]:
    """Add a G1 gate to every attention module of ``model`` in place (see module docstring).

    Gate weights are N(0, init_std), each drawn from a generator seeded by (seed, parameter name),
    so they never touch the global RNG and the other parameters stay as built. ``n_heads`` is
    needed only when an attention module has no ``head_dim`` attribute. ``what`` names the model in
    errors. Returns the gates, in layer order; a ConfigError when there is nothing to gate."""
    if gate.position != "G1":
        raise ConfigError(f"gated_gate.position={gate.position!r} cannot be injected into {what}: expected 'G1' "
                          f"(the injected gate acts on the attention output before o_proj)")
    found = attention_modules(model)
    if not found:
        raise ConfigError(f"{what} ({type(model).__name__}) has no attention module with q_proj and o_proj "
                          f"Linears: the G1 gate cannot be injected (expected Llama/Qwen-style attention)")
    gates = []
    for name, attention in found:
        o_proj = attention.o_proj
        head_dim = getattr(attention, "head_dim", None) or (o_proj.in_features // n_heads if n_heads else None)
        if not head_dim or o_proj.in_features % head_dim:
            raise ConfigError(f"{what}: attention module {name!r} has no usable head_dim (o_proj reads "
                              f"{o_proj.in_features} features): the G1 gate cannot be injected")
        module = G1Gate(attention.q_proj.in_features, o_proj.in_features // head_dim, head_dim, gate)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(f"{name}.attn_gate.weight".encode()))
        with torch.no_grad():
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * init_std)
        module.to(o_proj.weight.device, o_proj.weight.dtype)
        attention.attn_gate = module
        attention.register_forward_pre_hook(module.remember_input, with_kwargs=True)
        o_proj.register_forward_pre_hook(module.gate_output)
        gates.append(module)
    return gates
