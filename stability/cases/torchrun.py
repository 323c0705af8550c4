"""One training command across the processes torchrun started: the launcher side of
``stability.train.distributed`` (which shards one arm over the processes). The CLI parses the command and
calls ``under_torchrun`` with the resolved config; rank 0 leads (run directory, records, MLflow), the others
follow (they only train) and ``leave`` without the interpreter's teardown."""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

import torch

from stability import config as cfg
from stability.cases.case import cpu_threads
from stability.cases.experiment import Interrupted, load_inputs
from stability.record.rundir import new_run_dir
from stability.train import distributed


def under_torchrun(config: cfg.ExperimentConfig, out: str | None, label: str, lead, follow,
                   resume: str | None = None) -> int:
    """A training command under torchrun: every process trains every arm of ``config`` (sharded, see
    ``stability.train.distributed``); rank 0 alone makes the run directory (under ``out``, named by ``label``),
    writes the records and talks to MLflow (``lead(config, run_dir)``), the others only train
    (``follow(config)``). A lost process stops the job: the others end, with the records so far kept by rank 0.
    ``resume`` (a run to resume) is refused: checkpoints and resuming are single-process only."""
    if resume:
        raise cfg.ConfigError(f"--resume {resume!r} is invalid under torchrun: expected a run started in one "
                              f"process (checkpoints and resuming are single-process only)")
    world = distributed.init(config.run.device)

    def stop(_signum, _frame):
        # torchrun ends the processes with SIGTERM (when one is lost, or when it is stopped itself). While an
        # arm trains this is a Ctrl-C: every rank stops after the same step. Otherwise nothing happens, so a
        # record being written is not cut short (a collective with a lost peer raises anyway; torchrun
        # kills what is still running 30 s later).
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            signal.raise_signal(signal.SIGINT)
    signal.signal(signal.SIGTERM, stop)
    try:
        for name in config.arm_names:
            distributed.check(config.arm_config(name, config.seeds[0]), world)
        if world.rank == 0:
            load_inputs(config)   # a tokenizer cache is written once, by rank 0, before the others read it
        torch.distributed.barrier()
        if world.rank != 0:
            try:
                with cpu_threads(config.stress.threads):
                    follow(config)
            except Interrupted:
                leave(130)
            leave(0)
        print(f"torchrun: {world.size} processes, distributed.strategy={config.run.distributed.strategy}, "
              f"backend {world.backend}; rank 0 writes the records", flush=True)
        return lead(config, new_run_dir(out, label))
    finally:
        distributed.shutdown()


def leave(code: int) -> NoReturn:
    """End a process other than rank 0 with exit status ``code``: its process group shut down, its output
    flushed, and without the interpreter's teardown. A follower that tore down while rank 0 still ran (writing
    the records) was aborted at exit now and then by a thread of gloo's ("terminate called without an
    active exception", after destroy_process_group had returned: 3 of about 140 launches on 2 busy cores),
    which failed the whole launch. A follower holds nothing that its teardown would save."""
    distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
