"""Training step time per precision recipe, side by side: fp32, the own fp8 emulation, torchao's
float8 recipes, torchao's MX formats (and on a GPU bf16 and real fp8).

    python benchmarks/bench_precision.py [--preset smoke] [--device cpu] [--steps 10] [--rounds 5] [--threads 1]

One model of the preset (the gated arm), one fixed batch; per recipe a fresh copy of the model
with its PrecisionPolicy and AdamW. A step is what the trainer does: forward, loss, backward,
unscale, optimizer step. Each round times ``--steps`` steps of every recipe in turn (so machine
noise hits all alike); the table gives the median ms per step over ``--rounds`` rounds and the
ratio to fp32, with the overflow / underflow counters of ``PrecisionPolicy.watch`` off ("step")
and on ("step + counting"). On a CPU, and on GPUs without the hardware, fp8 and MX are emulated:
the casts are real, the matmuls run in fp32. Nothing is asserted.

``--threads`` (default 1) sets torch's intra-op threads: on a CPU shared with other jobs a
2-thread region waits for a descheduled thread, which measures the neighbours, not the code.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from stability.config import PrecisionConfig, resolve
from stability.data import get_batch, load_corpus
from stability.model.lm import GatedLM, next_token_loss
from stability.precision import PrecisionPolicy
from stability.train.optimizer import make_optimizer

CPU_RECIPES = (("fp32", {}), ("fp8 own (current)", {"dtype": "fp8", "fp8_recipe": "own"}),
               ("fp8 torchao tensorwise", {"dtype": "fp8", "fp8_recipe": "tensorwise"}),
               ("fp8 torchao rowwise", {"dtype": "fp8", "fp8_recipe": "rowwise"}),
               ("fp8 torchao rowwise_with_gw_hp", {"dtype": "fp8", "fp8_recipe": "rowwise_with_gw_hp"}),
               ("mxfp8 torchao", {"dtype": "mxfp8"}), ("mxfp4 torchao", {"dtype": "mxfp4"}))
GPU_EXTRA = (("bf16 (autocast)", {"dtype": "bf16"}),)


def table(rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(str(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


class Variant:
    """One recipe: a model copy, its policy and optimizer; ``run(steps)`` trains on the fixed batch."""

    def __init__(self, name, precision, base_model, run, batch, count):
        self.name = name
        self.policy = PrecisionPolicy(precision, run.device)
        self.model = self.policy.prepare(copy.deepcopy(base_model))
        if count:
            self.policy.watch(self.model)
        self.optimizer = make_optimizer(self.model, run)
        self.batch = batch
        self.source = self.policy.describe()

    def run(self, steps: int) -> float:
        x, y = self.batch
        for _ in range(steps):
            with self.policy.autocast():
                logits = self.model(x)
            loss = next_token_loss(logits, y)
            self.policy.backward(loss)
            self.policy.unscale_(self.optimizer)
            self.policy.step(self.optimizer, grads_finite=True)
            self.optimizer.zero_grad(set_to_none=True)
        if x.is_cuda:
            torch.cuda.synchronize()
        self.policy.pop_stats()
        return loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: the preset's)")
    parser.add_argument("--steps", type=int, default=10, help="steps per recipe and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = {"device": args.device} if args.device else {}
    config = resolve(args.preset, overrides)
    run = config.arm_config("gated", 0)
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    batch = get_batch(corpus, "train", 0, run.data.batch_size, run.model.context, run.seed, run.data.bos,
                      torch.device(run.device))
    base = GatedLM(run.model, seed=0).to(run.device)
    recipes = CPU_RECIPES + (GPU_EXTRA if run.device.startswith("cuda") else ())
    variants = {}
    for name, fields in recipes:
        for count in (False, True):
            if fields.get("dtype", "fp32") == "fp32" and count:
                continue  # fp32 has nothing to count
            variants[(name, count)] = Variant(name, PrecisionConfig(**fields), base, run, batch, count)
    for variant in variants.values():
        variant.run(2)  # warm-up (first calls, lazy imports)
    times = {key: [] for key in variants}
    for _ in range(args.rounds):
        for key, variant in variants.items():
            t0 = time.perf_counter()
            variant.run(args.steps)
            times[key].append((time.perf_counter() - t0) / args.steps * 1000)
    ms = {key: statistics.median(values) for key, values in times.items()}
    fp32 = ms[("fp32", False)]
    device = torch.cuda.get_device_name() if run.device.startswith("cuda") else "CPU"
    print(f"{args.preset} model ({base.num_parameters()} parameters), batch {run.data.batch_size} x "
          f"{run.model.context}, {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"median of {args.rounds} rounds x {args.steps} steps\n")
    rows = [("recipe", "library / recipe", "emulated", "ms / step", "x fp32", "ms / step + counting",
             "x fp32 (counting)")]
    for name, _ in recipes:
        source = variants[(name, False)].source
        counted = ms.get((name, True))
        rows.append((name, f"{source['library']} {source['version']}: {source['recipe']}",
                     "yes" if source["emulated"] else "no", f"{ms[(name, False)]:.1f}",
                     f"{ms[(name, False)] / fp32:.2f}", "-" if counted is None else f"{counted:.1f}",
                     "-" if counted is None else f"{counted / fp32:.2f}"))
    print(table(rows))


if __name__ == "__main__":
    main()
