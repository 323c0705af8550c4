"""Run under torchrun by tests/test_distributed.py: trains tiny arms across the processes and writes
what each rank measured to OUT/rank<R>.json (the test compares it with a single-process run of TINY)."""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import replace

import torch

from stability.config import (
    DataConfig,
    DistributedConfig,
    FaultConfig,
    GateConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    ProbeConfig,
    RunConfig,
)
from stability.data import load_corpus, probe_batch
from stability.train import distributed, probes
from stability.train.trainer import ArmHooks, train

TINY = RunConfig(   # gated (so the gate score is probed), clipped (so the global norm steers the update)
    model=ModelConfig(d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, context=32, gate=GateConfig(position="G1")),
    data=DataConfig(batch_size=4, builtin_bytes=100_000),
    optim=OptimConfig(lr=3e-3, warmup_steps=5, grad_clip=0.5),
    probes=ProbeConfig(every=6, spike_window=20, spike_min_history=5, diverge_patience=10, eval_batches=2),
    steps=12,
)
BF16 = replace(TINY, precision=PrecisionConfig(dtype="bf16"), steps=6)
NAN_FAULT = FaultConfig(kind="nan", step=5, layer=1, rank=1)   # block 1's output NaN on rank 1 only, at step 5


def main(out: str) -> None:
    torch.set_num_threads(1)
    world = distributed.init("cpu")
    found: dict = {"rank": world.rank, "world_size": world.size}
    corpus = load_corpus(TINY.data, TINY.model.vocab_size, TINY.model.context)
    probe_x, _ = probe_batch(corpus, TINY.probes.probe_batch_size, TINY.model.context, TINY.data.bos)

    def unsharded_probes(model, _corpus, _record):   # rank 0: the unsharded copy of the trained weights
        found["unsharded_probes"] = probes.heavy_probes(model, probe_x)

    for name, run in (("fsdp", TINY), ("ddp", replace(TINY, distributed=DistributedConfig(strategy="ddp"))),
                      ("nan", replace(TINY, fault=NAN_FAULT)), ("bf16", BF16)):
        hooks = ArmHooks(on_trained=unsharded_probes if name == "fsdp" else None)
        record = train(run, arm="gated", corpus=corpus, hooks=hooks)
        found[name] = {key: record[key] for key in ("status", "diverged_at_step", "series", "events", "probes",
                                                    "final", "distributed")}
        print(f"rank {world.rank}: {name} trained", file=sys.stderr, flush=True)   # where a crash happened
    def ctrl_c_on_rank_1(step, _row):   # as if Ctrl-C reached process 1 alone, during step 3
        if world.rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGINT)

    record = train(replace(TINY, steps=8), arm="gated", corpus=corpus, hooks=ArmHooks(on_step=ctrl_c_on_rank_1))
    found["ctrl_c"] = {key: record[key] for key in ("status", "series")}
    with open(f"{out}/rank{world.rank}.json", "w") as handle:
        json.dump(found, handle)
    distributed.shutdown()
    print(f"rank {world.rank}: done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
    # Everything is written: leave without the interpreter's teardown, where gloo's worker threads can
    # still be destroyed while joinable and abort the process ("terminate called without an active
    # exception", seen once on a loaded 2-core machine).
    os._exit(0)
