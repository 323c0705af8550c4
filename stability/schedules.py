"""Per-step schedules: the learning rate and batch size the trainer uses at each step.

A schedule is any object with ``name``, ``lr_at(step, run)`` and ``batch_size_at(step, run)``;
the trainer asks it every step and never knows which stress it is running.
``Standard`` is the ordinary one: linear warmup, then cosine decay to
``min_lr_ratio * lr`` (or constant), with the configured batch size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stability.config import RunConfig


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

    name: str = "standard"

    def lr_at(self, step: int, run: RunConfig) -> float:
        return warmup_cosine(step, run)

    def batch_size_at(self, step: int, run: RunConfig) -> int:
        return run.data.batch_size

    def describe(self) -> str:
        return "warmup then cosine decay at the configured peak LR"
