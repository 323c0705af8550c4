"""Training-step time of a Hugging Face Llama against the harness's own model at the same size, and the
cost of the heavy probes on HF models.

    python benchmarks/bench_hf.py [--preset smoke] [--steps 20] [--rounds 4] [--device cpu]
    python benchmarks/bench_hf.py --set model.d_model=128 --set model.n_layers=4 --set model.context=128

Models: the gated arm of the preset (G1 elementwise) built three ways at the same width, depth, heads,
KV heads, MLP width, vocabulary and batch: the harness's llama family (``model.source=harness``), HF
``LlamaForCausalLM`` with the injected gate (``model.source=hf``, sdpa attention) and HF
``Qwen3ForCausalLM`` (QK-norm). A step is what the trainer does: forward, loss, backward, AdamW step.
Rounds alternate the models in ABBA order so machine noise favours none. On the CPU the times are
the process's CPU time (``time.process_time``, one thread), which a busy shared machine does not
inflate; on CUDA they are wall times after a synchronize. The heavy probes
(``stability.train.probes.heavy_probes``: one forward through the eager probe attention with hooks) are timed
per snapshot on the probe batch. Prints a Markdown table with ratios to the harness's model; nothing
is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stability.cli.options import parse_sets
from stability.config import resolve
from stability.data import get_batch, load_corpus, probe_batch
from stability.model.build import build_model
from stability.model.lm import next_token_loss
from stability.train import probes
from stability.train.optimizer import make_optimizer

SOURCES = (("harness (llama family)", {}), ("HF LlamaForCausalLM", {"model.source": "hf"}),
           ("HF Qwen3ForCausalLM", {"model.source": "hf", "model.hf_config": "qwen3"}))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _clock(device: str) -> float:
    """CPU time of this process on the CPU (contention-proof for one thread), wall time on CUDA."""
    return time.perf_counter() if device.startswith("cuda") else time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--probes", type=int, default=5, help="heavy-probe snapshots timed per model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    entries = []
    for label, sets in SOURCES:
        config = resolve(args.preset, {**parse_sets(args.set), **sets, "device": args.device})
        run = config.arm_config("gated", 0)
        corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
        model = build_model(run.model, 0).to(args.device)
        entries.append({"label": label, "run": run, "corpus": corpus, "model": model,
                        "optimizer": make_optimizer(model, run), "times": [], "probe_times": []})

    def steps(entry, start):
        run, model, optimizer = entry["run"], entry["model"], entry["optimizer"]
        _sync(args.device)
        t0 = _clock(args.device)
        for step in range(start, start + args.steps):
            x, y = get_batch(entry["corpus"], "train", step, run.data.batch_size, run.model.context, 0,
                             device=args.device)
            loss = next_token_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        _sync(args.device)
        entry["times"].append((_clock(args.device) - t0) / args.steps)

    for entry in entries:  # warm-up: first-call costs (allocations, kernels) out of the timed rounds
        steps(entry, 0)
        entry["times"].clear()
    for number in range(args.rounds):
        order = entries if number % 2 == 0 else entries[::-1]
        for entry in order:
            steps(entry, 1000 * (number + 1))
    for entry in entries:
        run = entry["run"]
        x, _ = probe_batch(entry["corpus"], run.probes.probe_batch_size, run.model.context, device=args.device)
        for _ in range(args.probes):
            t0 = _clock(args.device)
            probes.heavy_probes(entry["model"], x)
            _sync(args.device)
            entry["probe_times"].append(_clock(args.device) - t0)

    reference = statistics.median(entries[0]["times"])
    run = entries[0]["run"]
    clock = "wall time" if args.device.startswith("cuda") else "CPU time"
    print(f"### Step {clock}, {args.device}, {args.threads} thread(s): d_model {run.model.d_model}, "
          f"{run.model.n_layers} layers, {run.model.n_heads} heads / {run.model.n_kv_heads} KV, context "
          f"{run.model.context}, batch {run.data.batch_size}, G1 elementwise gate; median of {args.rounds} rounds x "
          f"{args.steps} steps (ABBA)\n")
    print("| model | parameters | step ms (median) | step ms (min-max) | vs harness | heavy probes ms | "
          "probes / step |")
    print("|---|---|---|---|---|---|---|")
    for entry in entries:
        median = statistics.median(entry["times"])
        probe = statistics.median(entry["probe_times"])
        print(f"| {entry['label']} | {entry['model'].num_parameters():,} | {1000 * median:.1f} | "
              f"{1000 * min(entry['times']):.1f}-{1000 * max(entry['times']):.1f} | {median / reference:.2f}x | "
              f"{1000 * probe:.1f} | {probe / median:.2f} |")


if __name__ == "__main__":
    main()
