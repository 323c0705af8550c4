"""Treatments: what an arm does to its model beyond the built-in gate and stabilizers, by name.

    @register("lm_head_cap", "30 tanh(logits / 30) on the output logits")
    def lm_head_cap(model, config):          # model: the built nn.Module; config: the arm's ModelConfig
        ...                                  # change it in place: a forward hook, a swapped submodule

    --set arms.capped.treatments=lm_head_cap        # an arm that applies it (ArmConfig.treatments)

``build_model`` applies an arm's treatments (``model.treatments``), in order, to the model it has built
from the arm's seed, before the trainer moves, rounds or shards it: every rank of a torchrun job and
every Ray worker applies them to its own copy (the module defining them is an extension: entry point
or ``plugins``, docs/extending.md). Parameters the reference arm's model also has start from the same values;
a treatment's own parameters are drawn after them. A treatment changes the model; a change of the loss
or the optimiser is the built-in stabilizers' business (``z_loss``), not this registry's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from stability.config import ConfigError, ModelConfig


@dataclass(frozen=True)
class Treatment:
    """A named change to an arm's model: ``apply(model, config)`` edits ``model`` in place; ``description``
    says what it does (the record's model description lists the names)."""

    name: str
    apply: Callable[[nn.Module, ModelConfig], None]
    description: str


TREATMENTS: dict[str, Treatment] = {}   # name -> treatment, in the order registered


def register(name: str, description: str):
    """Decorator: ``apply(model, config)`` becomes the treatment ``name`` (a name not taken)."""
    def add(apply: Callable[[nn.Module, ModelConfig], None]):
        if name in TREATMENTS:
            raise ValueError(f"treatment {name!r} is registered already")
        TREATMENTS[name] = Treatment(name, apply, description)
        return apply
    return add


def check_treatments(names, field: str = "model.treatments") -> None:
    """ConfigError naming ``field`` and the first name no extension registered."""
    unknown = [name for name in names if name not in TREATMENTS]
    if unknown:
        raise ConfigError(f"{field}={tuple(names)!r} is invalid: {unknown[0]!r} is not a registered treatment: "
                          f"expected names from {tuple(TREATMENTS)} (stability.model.treatments.register, loaded "
                          f"as an extension: docs/extending.md)")


def apply_treatments(model: nn.Module, config: ModelConfig) -> nn.Module:
    """``model`` with ``config.treatments`` applied in order."""
    check_treatments(config.treatments)
    for name in config.treatments:
        TREATMENTS[name].apply(model, config)
    return model
