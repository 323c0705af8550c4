"""Per-step schedules: the learning rate and batch size the trainer uses at each step.

A schedule is any object with ``name``, ``lr_at(step, run)``, ``batch_size_at(step, run)`` and
``describe()`` (the ``Schedule`` protocol); the trainer asks it every step and never knows which
stress it is running. Every schedule here is a small frozen dataclass: its fields are its whole
state, so a schedule plus a ``RunConfig`` determine the run. The stress cases' schedules are their
settings too: ``StressConfig.ramp`` is an ``ExponentialRamp``, ``.batch`` a ``BatchRamp``, ``.shock`` a
``Shock`` (``--set stress.shock.at_step=30``), each validated once, here.

* ``Standard``: linear warmup, then cosine decay to ``min_lr_ratio * lr`` (or constant), with the
  configured batch size.
* ``ExponentialRamp``: the LR range test; the LR rises exponentially from ``start_lr`` to ``end_lr``
  over the run, no warmup; the arm is expected to diverge on the way.
* ``BatchRamp``: the batch size doubles every ``double_every`` steps up to ``max_size``; the
  standard LR is scaled by the batch growth per ``lr_rule`` ("none", "sqrt", "linear").
* ``Shock``: the standard LR times ``factor`` from step ``at_step`` to the end ("jump"), or the peak
  LR from step 0 with no warmup ("no_warmup").

The learning-rate sweep and the precision ladder are experiment-level stresses (several runs,
each with ``Standard``): see ``stability.cases.stress``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol, runtime_checkable

from stability.config.errors import ConfigError, check, is_number, positive_finite
from stability.config.run import RunConfig

LR_SCALING_RULES = ("none", "linear", "sqrt")
SHOCK_KINDS = ("jump", "no_warmup")


@runtime_checkable
class Schedule(Protocol):
    """What the trainer needs of a schedule: the LR and the batch size at each step."""

    name: str

    def lr_at(self, step: int, run: RunConfig) -> float: ...

    def batch_size_at(self, step: int, run: RunConfig) -> int: ...

    def describe(self) -> str: ...


def warmup_cosine(step: int, run: RunConfig) -> float:
    """Learning rate at ``step`` for the run's optimiser settings (warmup then cosine or constant)."""
    optim = run.optim
    if optim.warmup_steps and step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    if optim.lr_schedule == "constant":
        return optim.lr
    decay_steps = max(1, run.steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / decay_steps)
    floor = optim.min_lr_ratio * optim.lr
    return floor + (optim.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class Standard:
    """Warmup then cosine (or constant) at the configured peak LR and batch size."""

    name: ClassVar[str] = "standard"

    def lr_at(self, step: int, run: RunConfig) -> float:
        return warmup_cosine(step, run)

    def batch_size_at(self, step: int, run: RunConfig) -> int:
        return run.data.batch_size

    def describe(self) -> str:
        return "warmup then cosine decay at the configured peak LR"


@dataclass(frozen=True)
class ExponentialRamp:
    """LR range test: ``lr(step) = start_lr * (end_lr / start_lr) ** (step / (run.steps - 1))``, no
    warmup, configured batch size. The LR at which the arm diverges is the figure of interest.
    ``stress.ramp``: the lr_ramp case's settings."""

    start_lr: float = 1e-4
    end_lr: float = 10.0
    name: ClassVar[str] = "lr_ramp"

    def __post_init__(self) -> None:
        check(positive_finite(self.start_lr), "stress.ramp.start_lr", self.start_lr, "a positive finite learning rate")
        check(is_number(self.end_lr) and self.start_lr < self.end_lr, "stress.ramp.end_lr", self.end_lr,
              f"a finite learning rate above stress.ramp.start_lr={self.start_lr!r}")

    def lr_at(self, step: int, run: RunConfig) -> float:
        fraction = step / max(1, run.steps - 1)
        return self.start_lr * (self.end_lr / self.start_lr) ** fraction

    def batch_size_at(self, step: int, run: RunConfig) -> int:
        return run.data.batch_size

    def describe(self) -> str:
        return f"LR rising exponentially from {self.start_lr:g} to {self.end_lr:g} over the run, no warmup"


def lr_scale(rule: str, growth: float) -> float:
    """LR multiplier for a batch ``growth`` times the configured one under ``rule``."""
    if rule == "none":
        return 1.0
    if rule == "linear":
        return float(growth)
    if rule == "sqrt":
        return math.sqrt(growth)
    raise ConfigError(f"lr_rule={rule!r} is invalid: expected one of {LR_SCALING_RULES}")


@dataclass(frozen=True)
class BatchRamp:
    """Batch size ``data.batch_size * 2 ** (step // double_every)``, capped at ``max_size``;
    LR: the standard warmup/cosine LR times ``lr_scale(lr_rule, batch / data.batch_size)``.
    ``stress.batch``: the batch_ramp case's settings."""

    double_every: int = 50
    max_size: int = 256
    lr_rule: str = "sqrt"
    name: ClassVar[str] = "batch_ramp"

    def __post_init__(self) -> None:
        check(isinstance(self.double_every, int) and self.double_every > 0, "stress.batch.double_every",
              self.double_every, "a positive integer")
        check(isinstance(self.max_size, int) and self.max_size > 0, "stress.batch.max_size", self.max_size,
              "a positive integer")
        check(self.lr_rule in LR_SCALING_RULES, "stress.batch.lr_rule", self.lr_rule, f"one of {LR_SCALING_RULES}")

    def batch_size_at(self, step: int, run: RunConfig) -> int:
        base = run.data.batch_size
        return max(base, min(self.max_size, base * 2 ** (step // self.double_every)))

    def lr_at(self, step: int, run: RunConfig) -> float:
        growth = self.batch_size_at(step, run) / run.data.batch_size
        return warmup_cosine(step, run) * lr_scale(self.lr_rule, growth)

    def describe(self) -> str:
        return (f"batch size doubling every {self.double_every} steps up to {self.max_size}, "
                f"LR scaled by rule {self.lr_rule!r}")


@dataclass(frozen=True)
class Shock:
    """"jump": the standard LR times ``factor`` from step ``at_step`` to the end of the run.
    "no_warmup": the standard schedule with the warmup removed (peak LR at step 0; the shock is at 0).
    ``stress.shock``: the shock case's settings."""

    kind: str = "jump"
    at_step: int = 100
    factor: float = 10.0
    name: ClassVar[str] = "shock"

    def __post_init__(self) -> None:
        check(self.kind in SHOCK_KINDS, "stress.shock.kind", self.kind, f"one of {SHOCK_KINDS}")
        check(isinstance(self.at_step, int) and self.at_step >= 0, "stress.shock.at_step", self.at_step,
              "a non-negative step")
        check(positive_finite(self.factor), "stress.shock.factor", self.factor, "a positive finite factor")

    @property
    def shock_step(self) -> int:
        return 0 if self.kind == "no_warmup" else self.at_step

    def lr_at(self, step: int, run: RunConfig) -> float:
        if self.kind == "no_warmup":
            return warmup_cosine(step, replace(run, optim=replace(run.optim, warmup_steps=0)))
        lr = warmup_cosine(step, run)
        return lr * self.factor if step >= self.at_step else lr

    def batch_size_at(self, step: int, run: RunConfig) -> int:
        return run.data.batch_size

    def describe(self) -> str:
        if self.kind == "no_warmup":
            return "the standard schedule without warmup: peak LR from step 0"
        return f"LR multiplied by {self.factor:g} from step {self.at_step} to the end"
