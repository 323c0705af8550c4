"""Probe overhead: training steps with the every-step probes against bare steps, side by side.

    python benchmarks/bench_probes.py [--preset smoke] [--steps 40] [--rounds 5]

Both loops run the same model, batches and optimizer; rounds alternate in ABBA order
(probed, bare, bare, probed, ...) so machine noise and warm caches favour neither. The probed step adds what the
trainer adds every step: global and per-layer gradient norms kept on device, one host
sync for loss and norms, the loss and grad-norm spike detectors, clipping from the
computed norm. The heavy probes (every K steps) are timed separately per snapshot.
Prints a Markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stability.config import resolve
from stability.data import get_batch, load_corpus, probe_batch
from stability.model.lm import GatedLM, next_token_loss
from stability.train import probes
from stability.train.optimizer import make_optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--steps", type=int, default=40, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    config = resolve(args.preset)
    run = config.arm_config("gated", 0)
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    model = GatedLM(run.model, seed=0)
    optimizer = make_optimizer(model, run)
    grad_norms = probes.GradNorms(probes.layer_groups(model))
    params = list(model.parameters())
    clip = run.optim.grad_clip
    batches = [get_batch(corpus, "train", i, run.data.batch_size, run.model.context, 0) for i in range(args.steps)]

    def bare_step(x, y):
        loss = next_token_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    loss_spikes = probes.SpikeDetector(run.probes.spike_window, run.probes.spike_k, run.probes.spike_min_history)
    grad_spikes = probes.SpikeDetector(run.probes.spike_window, run.probes.spike_k, run.probes.spike_min_history)

    def probed_step(x, y):
        loss = next_token_loss(model(x), y)
        loss.backward()
        norms = grad_norms()
        figures = torch.cat([loss.detach().reshape(1), norms]).tolist()
        if figures[1] > clip:
            torch._foreach_mul_([p.grad for p in params if p.grad is not None], clip / (figures[1] + 1e-6))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_spikes.update(figures[0])
        grad_spikes.update(figures[1])
        return figures[0]

    times = {"bare": [], "probed": []}
    order = (("bare", bare_step), ("probed", probed_step))
    for round_ in range(args.rounds + 1):  # the first round warms up and is dropped
        for name, step in (order if round_ % 2 else order[::-1]):  # ABBA: neither always goes first
            start = time.perf_counter()
            for x, y in batches:
                step(x, y)
            times[name].append((time.perf_counter() - start) / args.steps)
    bare = statistics.median(times["bare"][1:])
    probed = statistics.median(times["probed"][1:])

    probe_x, _ = probe_batch(corpus, run.probes.probe_batch_size, run.model.context)
    heavy = []
    for _ in range(5):
        start = time.perf_counter()
        probes.heavy_probes(model, probe_x)
        heavy.append(time.perf_counter() - start)
    heavy_time = statistics.median(heavy)

    print(f"preset {args.preset}: d_model {run.model.d_model}, {run.model.n_layers} layers, batch "
          f"{run.data.batch_size} x {run.model.context} tokens, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds of {args.steps} steps\n")
    print("| step | median ms | overhead vs bare |")
    print("|---|---|---|")
    print(f"| bare (forward, backward, clip, AdamW) | {bare * 1e3:.2f} | - |")
    print(f"| with every-step probes | {probed * 1e3:.2f} | {100 * (probed / bare - 1):+.1f}% |")
    amortised = heavy_time / run.probes.every
    print(f"| heavy probe snapshot (one per {run.probes.every} steps) | {heavy_time * 1e3:.2f} per snapshot | "
          f"{100 * amortised / bare:+.1f}% amortised |")


if __name__ == "__main__":
    main()
