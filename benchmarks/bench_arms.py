"""What N arms and the extrapolation probe cost: two tables, measured side by side, nothing asserted.

    python benchmarks/bench_arms.py [--preset ci] [--steps 0] [--seeds 0,1,2] [--rounds 2]

1. Arms: the wall time of ``run_pair`` with the two default arms against the five arms of
   ``arms=controls`` (the reference arm, G1, G1 headwise, floored G1, G2), same preset, seeds and steps; rounds
   alternate in ABBA order (2, 5, 5, 2, ...) so machine noise favours neither. Also the mean training
   time of each arm (its ``train_seconds``), which says what one more arm of each kind costs.
2. Extrapolation probe: one gated model trained ``--probe-steps`` steps, the mean wall time of one of
   those training steps, then ``evaluate_lengths`` at 1x, 2x and 4x the context (plain RoPE and
   NTK-aware; ``extrapolation.eval_batches`` held-out batches each) timed per point, and each
   point's time as a multiple of one training step.

``--steps`` shortens the preset's run (0: the preset's own). Torch runs on one thread.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from stability.cases.standard import run_pair
from stability.config import REFERENCE_ARM, resolve
from stability.data import load_corpus
from stability.evaluate.extrapolation import evaluate_lengths
from stability.report.tables import text_table
from stability.train.trainer import ArmHooks, train


def arms_table(preset: str, overrides: dict, rounds: int) -> str:
    configs = {2: resolve(preset, overrides), 5: resolve(preset, {**overrides, "arms": "controls"})}
    walls: dict[int, list[float]] = {2: [], 5: []}
    per_arm: dict[str, list[float]] = {}
    order = [n for r in range(rounds) for n in ((2, 5) if r % 2 == 0 else (5, 2))]
    for n in order:
        started = time.perf_counter()
        record = run_pair(configs[n], purpose="selfcheck")
        walls[n].append(time.perf_counter() - started)
        for arm in record["arms"]:
            per_arm.setdefault(arm["arm"], []).append(arm["timing"]["train_seconds"])
        print(f"  {n} arms: {walls[n][-1]:.1f} s", flush=True)
    config = configs[2]
    rows = [("arms", "runs (arms x seeds)", "wall s (mean of rounds)", "per run s", "vs 2 arms")]
    two = statistics.mean(walls[2])
    for n in (2, 5):
        wall = statistics.mean(walls[n])
        runs = n * len(config.seeds)
        rows.append((str(n), str(runs), f"{wall:.1f}", f"{wall / runs:.2f}", f"{wall / two:.2f}x"))
    arm_rows = [("arm", "variant", "train s per run (mean)", "vs reference")]
    base = statistics.mean(per_arm[REFERENCE_ARM])
    for name in configs[5].arm_names:
        mean = statistics.mean(per_arm[name])
        arm_rows.append((name, configs[5].arm_config(name, 0).variant, f"{mean:.2f}", f"{mean / base:.2f}x"))
    return "\n".join([text_table(rows), "", text_table(arm_rows)])


def probe_table(preset: str, overrides: dict, steps: int) -> str:
    config = resolve(preset, {**overrides, "steps": steps, "seeds": "0", "probes.every": 10 ** 6,
                              "extrapolation.factors": "2,4"})
    run = config.arm_config("gated", 0)
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    kept = {}
    record = train(run, corpus=corpus,
                   hooks=ArmHooks(on_trained=lambda model, _corpus, _record: kept.setdefault("model", model)))
    step = record["timing"]["train_seconds"] / record["final"]["steps_completed"]
    result = evaluate_lengths(kept["model"], corpus, run, config.extrapolation)
    tokens = config.extrapolation.eval_batches * run.data.batch_size
    rows = [("point", "length", "held-out tokens", "seconds", "x training step")]
    for point in result["points"]:
        rows.append((f"{point['rope']} x{point['factor']:g}", str(point["length"]), str(tokens * point["length"]),
                     f"{point['seconds']:.3f}", f"{point['seconds'] / step:.1f}"))
    rows.append(("all points", "-", "-", f"{result['seconds']:.3f}", f"{result['seconds'] / step:.1f}"))
    return (f"one training step: {step * 1000:.1f} ms (mean of {record['final']['steps_completed']} steps, batch "
            f"{run.data.batch_size} x context {run.model.context})\n" + text_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--steps", type=int, default=0, help="train this many steps per arm (0: the preset's)")
    parser.add_argument("--seeds", default="", help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds of the arms comparison")
    parser.add_argument("--probe-steps", type=int, default=60, help="training steps before the probe is timed")
    parser.add_argument("--only", choices=("arms", "probe"), help="run one of the two tables")
    args = parser.parse_args()
    torch.set_num_threads(1)
    overrides = {"stress.threads": 1}
    if args.steps:
        overrides["steps"] = args.steps
    if args.seeds:
        overrides["seeds"] = args.seeds
    config = resolve(args.preset, overrides)
    print(f"preset {args.preset}, {config.run.steps} steps, seeds {config.seeds}, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, 1 thread, load {os.getloadavg()[0]:.1f}", flush=True)
    if args.only != "probe":
        print("\n" + arms_table(args.preset, overrides, args.rounds), flush=True)
    if args.only != "arms":
        print("\n" + probe_table(args.preset, overrides, args.probe_steps), flush=True)


if __name__ == "__main__":
    main()
