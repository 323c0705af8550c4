"""How a step's figures become global: one process (identity operations) or every rank of a torchrun
launch (``stability.train.distributed``'s all-reduces). The trainer talks to one reducer and never asks
which:

    reducer = reducer_for(run)                           # SingleProcess(), or ProcessGroup(world, run)
    forward = reducer.wrap(model)                    # the model, sharded (FSDP2) or wrapped (DDP)
    x = reducer.local_rows(x)                        # this process's rows of the global batch
    figures = reducer.step_figures(loss, squares, stop)   # [loss, grad norm, per-layer grad norms]
    norms = reducer.norms(update_squares)            # [update norm, per-layer update norms]
    reducer.stop_requested(stop)                     # Ctrl-C here (or on any rank) asks the arm to stop

``squares`` are squared norms laid out like ``probes.GradNorms``: entry 0 global, then one per layer
group. The single-process path computes exactly what it computed before any process group existed.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from stability.config import ConfigError, RunConfig
from stability.train import distributed
from stability.train.checkpoint import NO_BUNDLES, NO_CHECKPOINTS


def reducer_for(run: RunConfig) -> SingleProcess | ProcessGroup:
    """The reducer of this process: ``ProcessGroup`` under a process group (ConfigError when ``run`` cannot
    train across its processes), else ``SingleProcess``."""
    world = distributed.current()
    if world is None:
        return SingleProcess()
    distributed.check(run, world)
    return ProcessGroup(world, run)


class SingleProcess:
    """One process: every figure is already global."""

    rank, size = 0, 1

    def supported(self, hooks):
        """The arm hooks this reducer can serve: all of them."""
        return hooks

    def describe(self) -> dict | None:
        """How the processes trained the arm, for its record: None in one process."""
        return None

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def local_rows(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def step_figures(self, loss: torch.Tensor, squares: torch.Tensor, stop: bool) -> list[float]:
        """[loss, gradient norm, per-layer gradient norms] as floats: the one host sync of a step."""
        return torch.cat([loss.detach().float().reshape(1), squares.sqrt()]).tolist()

    def stop_requested(self, stop: bool) -> bool:
        return stop

    def norms(self, squares: torch.Tensor) -> list[float]:
        return squares.sqrt().tolist()

    def precision_tally(self, tally) -> None:
        """Sum a precision tally over the processes: nothing to sum."""

    def first_nonfinite(self, module: str | None) -> tuple[str | None, dict]:
        """(module, what the non-finite event adds): the module this process found, nothing added."""
        return module, {}

    def full_model(self, model: nn.Module, build) -> nn.Module:
        """The trained model, unsharded: the model itself."""
        return model


class ProcessGroup:
    """Every rank of a torchrun launch (``world``): the global loss, norms and stop request come from
    all-reduces, so every rank makes the same decisions (see ``stability.train.distributed``)."""

    def __init__(self, world: distributed.World, run: RunConfig):
        self.world, self.run = world, run
        self.rank, self.size = world.rank, world.size
        self.sharded = run.distributed.strategy == "fsdp"
        self.stop_all = False   # whether any rank asked to stop, as of the last step's all-reduce

    def supported(self, hooks):
        """``hooks`` without checkpoints and replay bundles (single-process only); ConfigError when they
        resume an arm."""
        if hooks.checkpoints.resume_state is not None:
            raise ConfigError("resuming an arm is single-process only: expected a run started without torchrun")
        return dataclasses.replace(hooks, checkpoints=NO_CHECKPOINTS, bundles=NO_BUNDLES)

    def describe(self) -> dict | None:
        return self.world.describe(self.run)

    def wrap(self, model: nn.Module) -> nn.Module:
        """Shard the model (every rank built the same values from the same seed), or wrap it in DDP."""
        return distributed.wrap(model, self.run, self.world)

    def local_rows(self, x: torch.Tensor) -> torch.Tensor:
        return distributed.local_rows(x, self.world)

    def step_figures(self, loss: torch.Tensor, squares: torch.Tensor, stop: bool) -> list[float]:
        """One all-reduce: the global loss and gradient norms, and whether any rank asked to stop."""
        loss_all, squares, self.stop_all = distributed.reduce_step(loss, squares, stop, self.sharded, self.world)
        return torch.cat([loss_all.reshape(1), squares.sqrt()]).tolist()

    def stop_requested(self, stop: bool) -> bool:
        """Any rank's Ctrl-C, as of this step's all-reduce (a later one is seen at the next step)."""
        return self.stop_all

    def norms(self, squares: torch.Tensor) -> list[float]:
        return distributed.reduce_squares(squares, self.sharded, self.world).sqrt().tolist()

    def precision_tally(self, tally) -> None:
        distributed.reduce_counts(tally)

    def first_nonfinite(self, module: str | None) -> tuple[str | None, dict]:
        """The module of the lowest rank that found one, and every rank's finding."""
        rank, module, found = distributed.first_rank_module(module, self.world)
        return module, {"rank": rank, "rank_modules": found}

    def full_model(self, model: nn.Module, build) -> nn.Module | None:
        """An unsharded copy on rank 0 (None on the others); every rank must call it."""
        return distributed.full_model(model, self.run, build)
