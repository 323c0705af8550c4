"""What proves that a run's stresses and measurements were applied, kept while it trains.

Nothing here changes what the run computes, and a healthy step pays O(1) Python work for it (no host sync):

* ``SteppedLR``: the LR of each of the optimiser's parameter groups at the moment it steps (a step pre-hook),
  which the step compares with the LR it logs (``lr_off_log``);
* ``LinearFormats``: during each training forward, every nn.Linear call and what it ran in (its output's
  dtype, or its class for fp8 and MX: ``Format.ran_as``), against what a Linear call of the run's
  ``precision.dtype`` must run in, as ``stability.precision.rules`` states it (never read from the format class
  that applies it), for the Linears the format declares it covers (``Format.covers``; the others are its
  high-precision Linears, counted but never judged);
* ``probe_targets`` and ``probe_steps_missed``: the modules the heavy probes must hook, from the model's
  structure, and the steps the config names for them that have no snapshot.

The arm record keeps what they find under ``applied`` (``stability.record.schema.Applied``), and the run's
figures are read from it (``stability.record.summary.applied_figures``).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from stability.config import PrecisionConfig
from stability.precision.rules import runs_in


class SteppedLR:
    """The LR of each parameter group of ``optimizer`` when it steps, read by a step pre-hook, so that a change
    of ``group["lr"]`` for one step is seen even when it is undone after the step. ``take()`` returns what the
    last step read (None: the optimiser did not step since the previous ``take``)."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.seen: list | None = None
        self.handle = optimizer.register_step_pre_hook(self._read)

    def _read(self, optimizer, _args, _kwargs) -> None:
        self.seen = [group["lr"] for group in optimizer.param_groups]

    def take(self) -> list | None:
        seen, self.seen = self.seen, None
        return seen

    def remove(self) -> None:
        self.handle.remove()


def lr_off_log(logged: float, seen: list | None, stepped: bool) -> bool:
    """Whether a step's optimiser did not step with the logged LR: it stepped (``seen``: the LRs its groups held)
    with another one, or the precision policy says it stepped (``stepped``) and it never did. Equal means
    exactly equal: the group LRs are assigned the logged value."""
    if seen is None:
        return stepped
    return any(lr != logged for lr in seen)


class LinearFormats:
    """Forward hooks on every nn.Linear of ``model`` (made after the format ``fmt`` converted it) that count,
    while ``training()`` is active, each call and whether it ran in ``runs_in``: the rule that
    ``stability.precision.rules`` states for the run's ``precision`` (its ``dtype``; fp8: and recipe).
    ``pop()`` returns the counts since the last pop: (calls, calls in the format, {Linear the format covers:
    (calls not in it, what the first of them ran in)}). A format whose rule is None has its calls counted, none
    judged."""

    def __init__(self, model: nn.Module, fmt, precision: PrecisionConfig):
        self.format = fmt
        self.runs_in = runs_in(precision)   # the stated rule, never an attribute of the class that applies it
        self.active = False
        self.calls, self.in_format, self.off = 0, 0, {}
        linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
        judged = self.runs_in is not None
        self.linears = len(linears)
        self.high_precision = [name for name, module in linears if not fmt.covers(module)]
        self.handles = [module.register_forward_hook(self._hook(name, judged and fmt.covers(module)))
                        for name, module in linears]

    def describe(self) -> dict:
        """What the record says before the first step (``stability.record.schema.LinearCalls``)."""
        return {"runs_in": self.runs_in, "linears": self.linears, "high_precision": self.high_precision}

    def _hook(self, name: str, covered: bool):
        def count(module, _args, output):
            if not self.active:
                return
            self.calls += 1
            ran_as = self.format.ran_as(module, output)
            if ran_as == self.runs_in:
                self.in_format += 1
            elif covered:
                calls, first = self.off.get(name, (0, ran_as))
                self.off[name] = (calls + 1, first)
        return count

    @contextlib.contextmanager
    def training(self):
        """Count the Linear calls of the block (a training forward; never the probes' or evaluation's)."""
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def pop(self) -> tuple[int, int, dict[str, tuple[int, str]]]:
        counts = (self.calls, self.in_format, self.off)
        self.calls, self.in_format, self.off = 0, 0, {}
        return counts

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def probe_targets(model: nn.Module) -> list[str]:
    """The modules the heavy probes must hook, from the model's structure: its blocks (``model.block_names``)
    and every nn.Linear."""
    return [*model.block_names, *(name for name, module in model.named_modules() if isinstance(module, nn.Linear))]


def probe_steps_missed(steps: list[int], snapshots: list[int], every: int, last_counts: bool) -> list[int]:
    """The steps among ``steps`` (those trained) that the config names for the heavy probes, every ``every``-th
    from 0 and the last one trained when ``last_counts`` (the arm completed or diverged: its final snapshot),
    that have no snapshot among ``snapshots`` (their steps)."""
    named = {step for step in steps if step % every == 0}
    if last_counts and steps:
        named.add(steps[-1])
    elif steps:
        named.discard(steps[-1])   # a run stopped in its last step (Ctrl-C, an error) may not have probed it
    return sorted(named - set(snapshots))
