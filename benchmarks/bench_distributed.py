"""Step time of one arm in one process against two processes (FSDP2 and DDP, torchrun, gloo), side by side.

    python benchmarks/bench_distributed.py [--preset smoke] [--steps 60] [--rounds 2]

Each round runs ``stability run --preset P --set seeds=0`` three ways, in ABBA-like rotating order so
machine noise favours none: one process, ``torchrun --nproc_per_node 2`` with FSDP2, and the same with
DDP. Per way it prints the mean training time per step (the arm records' ``train_seconds`` / steps,
probes and evaluation excluded) and its ratio to one process, and the largest difference of a
per-step loss from the one-process run's. On a CPU the processes share the cores and gloo moves the
shards through memory: the point of the two-process runs is that they compute the same thing, not speed.
Nothing is asserted. Each process runs torch on one thread.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile

import torch

from stability.report.tables import text_table

WAYS = {"1 process": [], "FSDP2, 2 processes": ["--set", "distributed.strategy=fsdp"],
        "DDP, 2 processes": ["--set", "distributed.strategy=ddp"]}


def run_once(way: str, preset: str, steps: int, out: str) -> dict:
    """The case record of one ``stability run`` done ``way``."""
    command = ["-m", "stability.cli", "run", "--preset", preset, "--set", "seeds=0", "--set", f"steps={steps}",
               "--out", out, "--no-track", "--quiet", *WAYS[way]]
    launcher = [sys.executable] if way == "1 process" else [sys.executable, "-m", "torch.distributed.run",
                                                            "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(launcher + command, env=env, check=True, capture_output=True)
    (path,) = [p for p in glob.glob(f"{out}/*/*.json") if not p.endswith("manifest.json")]
    with open(path) as handle:
        return json.load(handle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    per_step: dict[str, list[float]] = {way: [] for way in WAYS}
    losses: dict[str, list[float]] = {}
    order = list(WAYS)
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for index, way in enumerate(order if round_ % 2 == 0 else order[::-1]):
                record = run_once(way, args.preset, args.steps, f"{tmp}/{round_}-{index}")
                for arm in record["arms"]:
                    per_step[way].append(arm["timing"]["train_seconds"] / len(arm["series"]["loss"]))
                losses[way] = [x for arm in record["arms"] for x in arm["series"]["loss"]]
    base = sum(per_step["1 process"]) / len(per_step["1 process"])
    rows = []
    for way, times in per_step.items():
        mean = sum(times) / len(times)
        gap = max(abs(a - b) for a, b in zip(losses[way], losses["1 process"]))
        rows.append([way, f"{1000 * mean:.1f}", f"{mean / base:.2f}", f"{gap:.2e}"])
    print(f"stability run --preset {args.preset}, {args.steps} steps, 2 arms, {args.rounds} round(s); "
          f"torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} CPU cores")
    print(text_table([["way", "ms per step", "x 1 process", "max |loss - 1 process|"], *rows]))


if __name__ == "__main__":
    main()
