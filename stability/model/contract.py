"""The contract of a model the harness did not write, checked once before anything trains.

    found = check_models(configs, seed, vocab_size, context)                  # any run: ConfigError or a summary
    found = check_models(configs, seed, vocab_size, context, suites=True)     # the stress suites: stricter

Each arm's model (``stability.model.build.build_model``: the factory's or the Hugging Face config's) is
built once and run on a (2, 8) batch of token ids (fewer positions when the context is shorter):

* always: the factory imports, returns an ``nn.Module`` (the gated arm with parameters the reference arm
  lacks), and maps the batch to logits (B, S, V) with V >= ``model.vocab_size``;
* for the stress suites (``suites=True``), a factory's model also
  - calls its observer in every block with "attn_logits" and "attn_probs", each (B, n_heads, S, S), and in
    a gated arm with "gate_score" (the gate's values, any shape holding B * S * k of them): the suites'
    figures (F-Attn, sink rate, largest attention logit, gate score) come from these calls;
  - honours its arm's gate: for each setting of ``config.gate`` in which the arm differs from the paper's
    gate (``GateConfig(position="G1")``: elementwise, head-specific, sigmoid, no floor), the model built
    with that setting back at the paper's value must differ (other parameter shapes, or other outputs
    from the same seed). A factory that reads only ``gate.enabled`` would otherwise give every control arm
    (headwise, floored, value gate) the same gate, silently.

Every problem is one ConfigError naming ``model.factory`` (or the arm's gate key) and what was expected.
A factory may refuse a setting it does not have by raising (ValueError, ...): that is the same one-line
error, naming the arm.
"""

from __future__ import annotations

from dataclasses import fields, replace

import torch

from stability.config import ConfigError, GateConfig, ModelConfig
from stability.model.build import WrappedLM, build_model

__all__ = ["GATE_KEYS", "PAPER_GATE", "check_models"]

PAPER_GATE = GateConfig(position="G1")
GATE_KEYS = tuple(f.name for f in fields(GateConfig))
BATCH, POSITIONS = 2, 8


def check_models(configs: list[ModelConfig], seed: int, vocab_size: int, context: int,
                 suites: bool = False) -> list[dict]:
    """Build and run each arm's model once (see the module docstring); ConfigError at the first problem.
    Returns per arm: {"arm": gate label, "parameters", "gate_parameters", "blocks", "observed": names}."""
    tokens = torch.arange(BATCH * min(context, POSITIONS), dtype=torch.long).view(BATCH, -1) % vocab_size
    found = []
    for config in configs:
        model = build_model(config, seed)
        if config.kind == "harness":
            continue  # the harness's own model: its config was validated
        what = model.what if isinstance(model, WrappedLM) else f"model.factory={config.factory!r}"
        strict = suites and config.kind == "factory"
        logits, observed = _run(model, tokens, what, observe=strict)
        if logits.dim() != 3 or logits.shape[:2] != tokens.shape or logits.shape[-1] < vocab_size:
            raise ConfigError(f"{what} returned logits of shape {tuple(logits.shape)}: expected (B, S, V) = "
                              f"{(*tokens.shape, 'V')} with V >= model.vocab_size={vocab_size}")
        if strict:
            _check_observed(observed, model, config, tokens, what)
            if config.gate.enabled:
                _check_gate_honoured(config, seed, tokens, what, model)
        found.append({"arm": config.gate.label, "parameters": model.num_parameters(),
                      "gate_parameters": model.num_gate_parameters(), "blocks": len(model.blocks),
                      "observed": sorted({name for _, name, _ in observed})})
    return found


def _run(model, tokens: torch.Tensor, what: str, observe: bool) -> tuple[torch.Tensor, list]:
    """The model's logits on ``tokens`` and, with ``observe``, its observer calls (block, name, tensor)."""
    observed: list = []
    if observe:
        model.set_observer(lambda block, name, tensor: observed.append((block, name, tensor.detach())))
    try:
        with torch.no_grad():
            logits = model(tokens)
    except Exception as error:  # noqa: BLE001 -- a model that cannot run is bad input
        raise ConfigError(f"{what} fails on a {tuple(tokens.shape)} batch of token ids: {type(error).__name__}: "
                          f"{_first_line(error)}") from None
    finally:
        if observe:
            model.set_observer(None)
    return logits, observed


def _check_observed(observed: list, model, config: ModelConfig, tokens: torch.Tensor, what: str) -> None:
    """Every block calls its observer with the attention logits and probabilities, a gated arm also with
    its gate's scores, each of the documented shape."""
    batch, length = tokens.shape
    square = (batch, config.n_heads, length, length)
    wanted = ("attn_logits", "attn_probs") + (("gate_score",) if config.gate.enabled else ())
    for block in range(len(model.blocks)):
        calls = {name: tensor for index, name, tensor in observed if index == block}
        for name in wanted:
            if name not in calls:
                raise ConfigError(
                    f"{what}: block {block} ({model.block_names[block]}) of the {config.gate.label} arm never "
                    f"calls observer({name!r}, tensor): expected each attention module to have an `observer` "
                    f"attribute and to call it with 'attn_logits' and 'attn_probs' {square}"
                    + (" and 'gate_score'" if config.gate.enabled else "") + " (docs/your-repository.md)")
        for name in ("attn_logits", "attn_probs"):
            if tuple(calls[name].shape) != square:
                raise ConfigError(f"{what}: observer({name!r}, tensor) got a tensor of shape "
                                  f"{tuple(calls[name].shape)}: expected (B, H, S, S) = {square} "
                                  f"(H = model.n_heads, the query heads)")
        if "gate_score" in calls and calls["gate_score"].numel() % (batch * length):
            raise ConfigError(f"{what}: observer('gate_score', tensor) got {calls['gate_score'].numel()} values for "
                              f"a {tuple(tokens.shape)} batch: expected B * S * k of them (one per token and head, "
                              f"or per token, head and channel)")


def _check_gate_honoured(config: ModelConfig, seed: int, tokens: torch.Tensor, what: str, built) -> None:
    """For each gate setting of this arm that differs from the paper's gate: the model built with that setting
    back at the paper's value differs (parameter shapes, or outputs computed the same way: no observer)."""
    gate = config.gate
    shapes = _shapes(built)
    with torch.no_grad():
        logits = built(tokens)
    for key in GATE_KEYS:
        if getattr(gate, key) == getattr(PAPER_GATE, key):
            continue
        try:
            other = replace(gate, **{key: getattr(PAPER_GATE, key)})
        except ConfigError:
            continue   # the setting cannot go back alone (a floor needs the sigmoid, G5 needs elementwise)
        model = build_model(replace(config, gate=other), seed)
        if _shapes(model) != shapes:
            continue
        with torch.no_grad():
            same = torch.equal(model(tokens), logits)
        if same:
            raise ConfigError(
                f"{what} does not honour gate.{key}={getattr(gate, key)!r} of the {gate.label} arm: it built the "
                f"same model as with gate.{key}={getattr(PAPER_GATE, key)!r} (same parameters, same outputs): "
                f"expected a model that reads config.gate.{key}, or a factory that raises for a setting it does "
                f"not have")


def _shapes(model) -> dict[str, tuple]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
