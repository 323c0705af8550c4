"""Deliberate faults (``run.fault``), to prove the detectors: installed before the first step, so the
training loop never asks for them.

* "nan" / "inf": a forward hook makes block ``fault.layer``'s output NaN / Inf during step ``fault.step``
  (in process ``fault.rank`` only, when it is not -1): ``poison_block``;
* "lr_spike": the schedule's LR times ``fault.lr_factor`` at step ``fault.step``: ``LRSpike``;
* "kill", under torchrun: process ``fault.rank`` dies at once (SIGKILL) when step ``fault.step``'s
  forward starts, to prove a lost process stops the job: ``kill_process``.

The hooks read the step in flight from ``step_of()``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable
from typing import Any

import torch

from stability.config import RunConfig


@dataclasses.dataclass(frozen=True)
class LRSpike:
    """``schedule`` with its LR multiplied by ``factor`` at ``step`` alone."""

    schedule: Any
    step: int
    factor: float

    @property
    def name(self) -> str:
        return self.schedule.name

    def lr_at(self, step: int, run: RunConfig) -> float:
        lr = self.schedule.lr_at(step, run)
        return lr * self.factor if step == self.step else lr

    def batch_size_at(self, step: int, run: RunConfig) -> int:
        return self.schedule.batch_size_at(step, run)

    def describe(self) -> str:
        return f"{self.schedule.describe()}, LR x {self.factor:g} at step {self.step}"


def with_lr_spike(schedule, run: RunConfig):
    """The schedule the arm trains with: ``schedule``, spiked when ``fault.kind`` is "lr_spike"."""
    fault = run.fault
    return LRSpike(schedule, fault.step, fault.lr_factor) if fault.kind == "lr_spike" else schedule


def poison_block(model: torch.nn.Module, run: RunConfig, step_of: Callable[[], int], rank: int = 0):
    """A forward hook that turns block ``fault.layer``'s output NaN/Inf at ``fault.step`` (in process
    ``fault.rank`` only, when it is not -1); its handle, or None when there is no such fault."""
    fault = run.fault
    if fault.kind not in ("nan", "inf") or fault.rank not in (-1, rank):
        return None
    poison = float("nan") if fault.kind == "nan" else float("inf")

    def hook(_module, _inputs, output):
        if step_of() == fault.step:
            if isinstance(output, tuple):
                return (output[0] * poison, *output[1:])
            return output * poison
        return output

    return model.blocks[fault.layer].register_forward_hook(hook)


def kill_process(forward: torch.nn.Module, run: RunConfig, step_of: Callable[[], int], rank: int, processes: int):
    """A forward pre-hook, run before any other (FSDP's all-gathers, DDP's), that kills this process at
    ``fault.step`` when it is process ``fault.rank`` of a torchrun launch; its handle, or None."""
    fault = run.fault
    if fault.kind != "kill" or processes < 2 or rank != fault.rank:
        return None

    def hook(_module, _inputs):
        if step_of() == fault.step:
            os.kill(os.getpid(), signal.SIGKILL)

    return forward.register_forward_pre_hook(hook, prepend=True)


def install(model: torch.nn.Module, forward: torch.nn.Module, run: RunConfig, step_of: Callable[[], int],
            rank: int = 0, processes: int = 1) -> list:
    """The fault hooks of ``run`` on the model (``forward``: what the step calls, the model or its DDP
    wrapper); the handles to remove when the arm stops."""
    handles = (poison_block(model, run, step_of, rank), kill_process(forward, run, step_of, rank, processes))
    return [handle for handle in handles if handle is not None]
