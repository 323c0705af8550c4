"""One arm across processes: PyTorch's FSDP2 (or DDP) when the command runs under torchrun.

    torchrun --nproc_per_node 2 -m stability.cli run --preset smoke      # see docs/distributed.md

``init(device)`` reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)
and starts the process group (gloo on the CPU, NCCL on CUDA); with WORLD_SIZE 1 or unset nothing
happens and ``current()`` stays None, so the single-process path is untouched. Under a process group
the trainer

* builds the model on every rank with the same seed (identical values, before any sharding), then
  ``wrap`` shards it: ``fully_shard`` on every block and on the root (FSDP2; bf16 through its
  ``MixedPrecisionPolicy``, gradients reduced in fp32), or one ``DistributedDataParallel`` replica;
* gives every rank its own contiguous rows of the global batch (``local_rows``): the global batch
  and the data order are the single-process run's;
* makes every decision on global values: ``reduce_step`` sums, in ONE all-reduce per step, the
  rank's share of the loss, the squared gradient norms of its shards and its stop request, so the
  loss, the gradient norm (clipping included), spikes, non-finite steps and Ctrl-C are the same on
  every rank;
* localises a non-finite step on every rank and ``first_rank_module`` names the first rank (and
  module) where it appeared.

Heavy probes and the held-out evaluation run through the sharded model on the full probe batch:
FSDP2 gathers each block's parameters for its forward, so every rank sees the full parameters layer
by layer and computes the single-process figures. ``full_model`` gathers one unsharded copy on rank
0 for the evaluations after training (quantization, extrapolation). Rank 0 alone writes records and
talks to MLflow (``is_writer``).
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import torch
from torch import nn

from stability.config import ConfigError, RunConfig
from stability.precision.formats import FORMATS


def precisions() -> tuple[str, ...]:
    """The training formats an arm can use under a process group (``Format.distributed``)."""
    return tuple(name for name, format in FORMATS.items() if format.distributed)


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place in the job: rank in 0..size-1, local rank on its node, the backend."""

    rank: int
    size: int
    local_rank: int
    backend: str

    def describe(self, run: RunConfig) -> dict:
        """What an arm record says about how it was trained across the processes."""
        shard = FORMATS[run.precision.dtype].shard_dtype
        return {"world_size": self.size, "backend": self.backend, "strategy": run.distributed.strategy,
                "param_dtype": run.precision.dtype if shard is not None and run.distributed.strategy == "fsdp"
                else "fp32",
                "reduce_dtype": "fp32", "torch": torch.__version__}


def launched() -> int:
    """WORLD_SIZE set by a launcher (torchrun), else 1."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is invalid: expected the process count "
                          f"torchrun sets") from None


def current() -> World | None:
    """The running process group as a ``World``; None in a single-process run."""
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    if torch.distributed.get_world_size() < 2:
        return None
    return World(torch.distributed.get_rank(), torch.distributed.get_world_size(),
                 int(os.environ.get("LOCAL_RANK", "0")), torch.distributed.get_backend())


def is_writer() -> bool:
    """Whether this process writes records and logs (rank 0, or the only process)."""
    world = current()
    return world is None or world.rank == 0


def init(device: str, timeout_s: float = 600.0) -> World | None:
    """Start the process group of a torchrun launch (gloo on the CPU, NCCL on CUDA); None when the
    command was started as one process. ``timeout_s``: how long a collective waits for a lost peer."""
    size = launched()
    if size < 2:
        return None
    if not torch.distributed.is_available():
        raise ConfigError(f"WORLD_SIZE={size} but this torch ({torch.__version__}) has no torch.distributed")
    if not torch.distributed.is_initialized():
        cuda = device.startswith("cuda")
        if cuda:
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if local_rank >= torch.cuda.device_count():
                raise ConfigError(f"device={device!r} is invalid for local rank {local_rank}: expected one GPU per "
                                  f"process (this node has {torch.cuda.device_count()}; NCCL takes no two ranks on "
                                  f"one GPU): launch at most that many processes per node")
            torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group("nccl" if cuda else "gloo",
                                             timeout=datetime.timedelta(seconds=timeout_s))
    return current()


def shutdown() -> None:
    """End the process group (if this process started one)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def check(run: RunConfig, world: World) -> None:
    """ConfigError (before any training) when ``run`` cannot train across ``world``'s processes."""
    if run.data.batch_size % world.size:
        raise ConfigError(f"data.batch_size={run.data.batch_size} is invalid under torchrun with {world.size} "
                          f"processes: expected a multiple of the process count (every rank reads an equal "
                          f"slice of the global batch)")
    if run.precision.dtype not in precisions():
        raise ConfigError(f"precision.dtype={run.precision.dtype!r} is invalid under torchrun: expected one of "
                          f"{precisions()} (fp16 loss scaling, fp8 and MX train in one process only)")
    if run.optim.optimizer != "adamw":
        raise ConfigError(f"optim.optimizer={run.optim.optimizer!r} is invalid under torchrun: expected 'adamw' "
                          f"(the 8-bit optimiser does not take sharded parameters)")
    if run.fault.rank >= world.size:
        raise ConfigError(f"fault.rank={run.fault.rank} is invalid: expected a rank below the {world.size} "
                          f"processes of this launch, or -1")


def wrap(model: nn.Module, run: RunConfig, world: World) -> nn.Module:
    """Shard ``model`` in place with FSDP2 (and return it), or return its DDP wrapper. Every rank must hold
    the same values in ``model`` (built with the same seed) when this is called."""
    if run.distributed.strategy == "ddp":
        import inspect

        devices = [world.local_rank] if run.device.startswith("cuda") else None
        # the buffers (rotary tables) are equal on every rank: no broadcast before each forward
        params = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
        quiet = {"forward_sync_buffers": False} if "forward_sync_buffers" in params else {"broadcast_buffers": False}
        return torch.nn.parallel.DistributedDataParallel(model, device_ids=devices, **quiet)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    shard = FORMATS[run.precision.dtype].shard_dtype
    policy = MixedPrecisionPolicy(param_dtype=shard, reduce_dtype=torch.float32 if shard is not None else None)
    reshard = run.distributed.reshard_after_forward
    for block in model.blocks:
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    return model


def local_rows(x: torch.Tensor, world: World) -> torch.Tensor:
    """This rank's contiguous rows of a global batch (B, ...): rows rank*B/W .. (rank+1)*B/W - 1."""
    if x.shape[0] % world.size:
        raise ConfigError(f"batch size {x.shape[0]} is invalid under torchrun with {world.size} processes: "
                          f"expected a multiple of the process count (check the schedule's batch sizes)")
    rows = x.shape[0] // world.size
    return x[world.rank * rows:(world.rank + 1) * rows]


def reduce_step(loss: torch.Tensor, squares: torch.Tensor, stop: bool, sharded: bool,
                world: World) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """One all-reduce per step: (global loss, global squared norms, whether any rank asked to stop).

    ``loss``: this rank's mean loss over its rows (equal row counts, so the global mean is the mean
    over ranks). ``squares``: squared gradient norms of what this rank holds (shards under FSDP: the
    global square is their sum; full gradients under DDP: every rank holds the same, so they are
    averaged like the loss). A NaN or Inf on any rank makes the global values non-finite."""
    scale = 1.0 / world.size
    packed = torch.cat([(loss.detach().float() * scale).reshape(1),
                        squares.float() if sharded else squares.float() * scale,
                        torch.tensor([1.0 if stop else 0.0], device=squares.device)])
    torch.distributed.all_reduce(packed)
    return packed[0], packed[1:-1], bool(packed[-1].item() > 0)


def reduce_squares(squares: torch.Tensor, sharded: bool, world: World) -> torch.Tensor:
    """Global squared norms from each rank's (see ``reduce_step``): summed over shards, averaged over replicas."""
    squares = squares.float() if sharded else squares.float() / world.size
    torch.distributed.all_reduce(squares)
    return squares


def first_rank_module(module: str | None, world: World) -> tuple[int | None, str | None, list]:
    """(rank, module) of the lowest rank whose forward found a non-finite module, and every rank's finding."""
    found: list = [None] * world.size
    torch.distributed.all_gather_object(found, module)
    for rank, name in enumerate(found):
        if name is not None:
            return rank, name, found
    return None, None, found


def reduce_counts(tally) -> None:
    """Sum a precision tally's counts (``stability.precision.counting.Tally``) over ranks, in place."""
    counts = tally._counts if tally._counts is not None else torch.zeros(3, dtype=torch.int64)
    packed = torch.cat([counts.to(torch.float64).cpu(), torch.tensor([float(tally.values)], dtype=torch.float64)])
    if torch.distributed.get_backend() == "nccl":
        packed = packed.cuda()
    torch.distributed.all_reduce(packed)
    packed = packed.cpu()
    tally._counts = packed[:3].to(torch.int64)
    tally.values = int(packed[3].item())


def full_model(model: nn.Module, run: RunConfig, build) -> nn.Module | None:
    """An unsharded copy of a sharded ``model`` on rank 0 (None on the others); every rank must call it.
    ``build()`` makes a fresh model of the same structure to load the gathered weights into."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    inner = model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
    state = get_model_state_dict(inner, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if torch.distributed.get_rank() != 0:
        return None
    copy = build()
    copy.load_state_dict(state)
    return copy.to(run.device)
