"""Build the model of one arm, whoever wrote it: the harness, Hugging Face, or you.

``build_model(model_config, seed)`` returns an ``nn.Module`` the trainer and the probes can use:

* ``model.source="harness"``: ``stability.model.lm.GatedLM`` (families "llama" and "gpt2");
* ``model.source="hf"``: a Hugging Face causal LM (``stability.model.hf``), wrapped in ``WrappedLM``;
* ``model.factory="package.module:function"``: your function, wrapped in ``WrappedLM``.

What the trainer and probes use (``GatedLM`` has it; ``WrappedLM`` provides it for the others):
``model(tokens)`` -> logits (B, S, V); ``model.blocks`` (the residual blocks, in order: their
outputs are the residual stream, where M-Act is measured and faults are injected);
``model.block_names`` (their module names); ``model.set_observer(fn)`` (attention probes: fn(layer,
name, tensor) with name "attn_logits", "attn_probs" or "gate_score"); ``num_parameters()``,
``num_gate_parameters()`` and ``describe()`` (what the record says about the model).

The factory contract. ``function(config: ModelConfig) -> nn.Module`` is called once per arm with
that arm's config (``config.gate.enabled`` says whether to build the gate; ``stability.model.inject.
inject_gate`` adds a G1 gate to Llama/Qwen-style attention) after ``torch.manual_seed(seed)``.
The module maps token ids (B, S) to logits (B, S, vocab_size) (a tensor, or an object with
``.logits`` such as a transformers output). Blocks: its ``blocks`` attribute if it has one, else
the parents of its attention modules (modules with ``q_proj`` and ``o_proj``), else its longest
``nn.ModuleList``. Attention probes: a transformers model gets them through
``stability.model.hf.set_probe_observer``; any other module gets them when its attention modules have an
``observer`` attribute and call ``observer(name, tensor)`` with "attn_logits" (B, H, S, S, masked
with -inf), "attn_probs" (B, H, S, S) and "gate_score" as ``stability.model.attention.Attention`` does;
otherwise F-Attn, sink rate and max attention logit are absent from the record. Paired init: the
gated arm's shared parameters are copied from the reference arm's model built with the same seed,
so every parameter with the same name and shape starts identical whatever the factory does.
"""

from __future__ import annotations

import torch
from torch import nn

from stability.config import ConfigError, GateConfig, ModelConfig
from stability.config.extensions import NotFound, import_target
from stability.model.lm import GatedLM

__all__ = ["WrappedLM", "build_model", "load_factory"]


def load_factory(path: str):
    """The function named by ``"package.module:function"``; a ConfigError naming it when it cannot be had."""
    module_name, _, function_name = path.partition(":")
    try:
        function = import_target(path)
    except NotFound:
        function = None
    except Exception as error:  # noqa: BLE001 -- any import failure is the user's bad input
        raise ConfigError(f"model.factory={path!r} does not import: {type(error).__name__}: {error}") from None
    if not callable(function) or not function_name.strip():
        raise ConfigError(f"model.factory={path!r}: module {module_name!r} has no function {function_name!r}")
    return function


class WrappedLM(nn.Module):
    """A model the harness did not write, seen through the interface of the module docstring."""

    def __init__(self, inner: nn.Module, source: str, what: str, extra: dict | None = None):
        super().__init__()
        from stability.model.hf import is_hf_model
        from stability.model.inject import attention_modules

        self.inner = inner
        self.source, self.what, self.extra = source, what, dict(extra or {})
        self.hf = is_hf_model(inner)
        attention = [name for name, _ in attention_modules(inner)]
        self.attention_names = ["inner." + n for n in attention]
        self.block_names = _find_blocks(inner, attention, what)

    @property
    def blocks(self) -> list[nn.Module]:
        return [self.get_submodule(name) for name in self.block_names]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out = self.inner(input_ids=tokens) if self.hf else self.inner(tokens)
        logits = out if torch.is_tensor(out) else getattr(out, "logits", None)
        if logits is None and isinstance(out, (tuple, list)) and out and torch.is_tensor(out[0]):
            logits = out[0]
        if logits is None:
            raise TypeError(f"{self.what} returned {type(out).__name__}: expected logits (B, S, V) or an object "
                            f"with .logits")
        return logits

    def set_observer(self, observer) -> None:
        from stability.model.hf import set_probe_observer
        from stability.model.inject import G1Gate

        blocks = self.blocks
        if self.hf:
            set_probe_observer(self.inner, [self.get_submodule(n) for n in self.attention_names], observer)
        for index, block in enumerate(blocks):
            for module in block.modules():
                if hasattr(module, "observer") and (not self.hf or isinstance(module, G1Gate)):
                    module.observer = None if observer is None else (
                        lambda name, tensor, index=index: observer(index, name, tensor))

    def gate_modules(self) -> list[nn.Module]:
        from stability.model.inject import G1Gate

        found = []
        for module in self.modules():
            if isinstance(module, G1Gate):
                found.append(module)
            elif getattr(module, "gate_proj", None) is not None and hasattr(module, "observer"):
                found.append(module.gate_proj)  # the harness's own Attention inside a factory model
        return found

    def num_gate_parameters(self) -> int:
        return sum(p.numel() for m in self.gate_modules() for p in m.parameters())

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def describe(self) -> dict:
        attention = getattr(getattr(self.inner, "config", None), "_attn_implementation", None)
        return {"source": self.source, "class": type(self.inner).__name__, "what": self.what,
                "blocks": len(self.block_names), "attention_modules": len(self.attention_names),
                "attention_implementation": attention, **self.extra}


def _find_blocks(inner: nn.Module, attention: list[str], what: str) -> list[str]:
    """Names (prefixed "inner.") of the residual blocks of ``inner`` (see the factory contract)."""
    named = {id(m): n for n, m in inner.named_modules()}
    blocks = getattr(inner, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, list, tuple)) and len(blocks) and all(id(b) in named for b in blocks):
        return ["inner." + named[id(b)] for b in blocks]
    parents = list(dict.fromkeys(name.rpartition(".")[0] for name in attention))
    if parents and all(parents):
        return ["inner." + name for name in parents]
    lists = [(len(m), n) for n, m in inner.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ConfigError(f"{what} returned a {type(inner).__name__} with no blocks: expected a `blocks` "
                          f"attribute, attention modules with q_proj/o_proj, or an nn.ModuleList of layers")
    _, name = max(lists, key=lambda item: (item[0], -len(item[1])))
    return [f"inner.{name}.{i}" for i in range(len(inner.get_submodule(name)))]


def _call_factory(function, config: ModelConfig):
    try:
        return function(config)
    except ConfigError:
        raise
    except Exception as error:  # noqa: BLE001 -- a factory that fails on the config is bad input
        raise ConfigError(f"model.factory={config.factory!r} failed for the {config.gate.label} arm: "
                          f"{type(error).__name__}: {error}") from None


def _factory_model(config: ModelConfig, seed: int) -> nn.Module:
    """The factory's model for this arm, checked, with the shared parameters of the reference arm."""
    function = load_factory(config.factory)
    torch.manual_seed(seed)
    model = _call_factory(function, config)
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model.factory={config.factory!r} returned {type(model).__name__}: expected a "
                          f"torch.nn.Module mapping token ids (B, S) to logits (B, S, vocab_size)")
    if config.gate.enabled:
        from dataclasses import replace

        torch.manual_seed(seed)
        ungated = _call_factory(function, replace(config, gate=GateConfig()))
        reference = dict(ungated.named_parameters())
        extra = [n for n, p in model.named_parameters() if n not in reference or reference[n].shape != p.shape]
        if not extra:
            raise ConfigError(f"model.factory={config.factory!r} built the same parameters with and without "
                              f"the gate: expected the gated arm's model to carry a gate when config.gate.enabled "
                              f"(e.g. stability.model.inject.inject_gate)")
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in reference and reference[name].shape == param.shape:
                    param.copy_(reference[name])
    return model


def build_model(config: ModelConfig, seed: int) -> nn.Module:
    """The model of one arm (its gate is ``config.gate``, its treatments ``config.treatments``), on the CPU, in
    fp32 (see module docstring)."""
    model = _build(config, seed)
    if config.treatments:
        from stability.model.treatments import apply_treatments

        apply_treatments(model, config)
    return model


def _build(config: ModelConfig, seed: int) -> nn.Module:
    if config.kind == "factory":
        inner = _factory_model(config, seed)
        if isinstance(inner, GatedLM):
            return inner
        return WrappedLM(inner, "factory", f"model.factory={config.factory!r}", {"factory": config.factory})
    if config.kind == "hf":
        from stability.model.hf import build_hf_model

        inner = build_hf_model(config, seed)
        return WrappedLM(inner, "hf", f"model.hf_config={config.hf_config!r}", {"hf_config": config.hf_config})
    return GatedLM(config, seed=seed)
