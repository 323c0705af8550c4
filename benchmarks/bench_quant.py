"""Post-training quantization cost: evaluation time per scheme, and the cost of the
kurtosis / infinity-norm probes on the Linear inputs.

    python benchmarks/bench_quant.py [--preset smoke] [--steps N] [--rounds 5] [--arm gated] [--threads 1]

Trains one arm of the preset (``--steps`` overrides its length), then for each scheme of
``SCHEMES`` times, as medians over ``--rounds``: building the quantized copy, the
held-out evaluation (the trainer's ``evaluate`` on the preset's eval batches), the KL on the
probe batch and the per-Linear damage pass; the full-precision evaluation is the first row.
Then a probe-batch forward without hooks, with infinity-norm pre-hooks only, and with the
kurtosis + infinity-norm pre-hooks that ``evaluate_schemes`` records, side by side (rounds
alternate, so machine noise hits all alike). Prints Markdown tables; nothing is asserted.

``--threads`` (default 1) sets torch's intra-op threads: on a CPU shared with other jobs, a
2-thread OpenMP region waits for a descheduled thread and a 2 ms forward can take 180 ms, which
measures the neighbours, not the code (0 leaves torch's default).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from stability.config import REFERENCE_ARM, resolve
from stability.data import eval_batches, load_corpus, probe_batch
from stability.evaluate import quantize as q
from stability.train.evaluate import evaluate
from stability.train.trainer import ArmHooks, train


def timed(fn, rounds: int):
    """(median seconds, last result) of ``rounds`` calls."""
    times, result = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def table(rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(str(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arm", default="gated", choices=(REFERENCE_ARM, "gated"))
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    config = resolve(args.preset, {"steps": args.steps} if args.steps else {})
    run = config.arm_config(args.arm, 0)
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    box = {}
    t0 = time.perf_counter()
    keep_model = ArmHooks(on_trained=lambda model, _corpus, _record: box.setdefault("model", model))
    train(run, corpus=corpus, arm=args.arm, hooks=keep_model)
    print(f"trained {args.arm} arm of {args.preset}: {run.steps} steps in {time.perf_counter() - t0:.1f} s, "
          f"torch threads {torch.get_num_threads()}\n")
    reference = q.full_precision_copy(box["model"])
    batches = eval_batches(corpus, run.probes.eval_batches, run.data.batch_size, run.model.context,
                           run.data.bos, run.device)
    probe_x, _ = probe_batch(corpus, run.probes.probe_batch_size, run.model.context, run.data.bos, run.device)
    policy = q._fp32_policy(run.device)
    tokens = sum(y.numel() for _, y in batches)

    full_s, full = timed(lambda: evaluate(reference, batches, policy), args.rounds)
    rows = [("scheme", "quantize s", f"evaluate s ({tokens} tokens)", "KL s", "per-Linear s", "total s",
             "eval / fp32 eval", "damage loss", "KL")]
    rows.append(("fp32 (reference)", "-", f"{full_s:.3f}", "-", "-", f"{full_s:.3f}", "1.0", "-", "-"))
    names = q.target_linears(reference)
    for scheme in q.SCHEMES:
        try:
            with q._quiet_bitsandbytes():
                build_s, (quantized, _) = timed(lambda s=scheme: q.quantize_model(reference, s), args.rounds)
                eval_s, figures = timed(lambda m=quantized: evaluate(m, batches, policy), args.rounds)
                kl_s, kl = timed(lambda m=quantized: q.output_kl(reference, m, probe_x), args.rounds)
                modules = q._linear_modules(quantized, names)
                lin_s, _ = timed(lambda mods=modules: q.per_linear_damage(reference, mods, probe_x),
                                 args.rounds)
        except Exception as error:  # noqa: BLE001 - a scheme this machine cannot run is a row, not a crash
            rows.append((scheme, f"skipped: {type(error).__name__}: {error}", "", "", "", "", "", "", ""))
            continue
        total = build_s + eval_s + kl_s + lin_s
        rows.append((scheme, f"{build_s:.3f}", f"{eval_s:.3f}", f"{kl_s:.3f}", f"{lin_s:.3f}", f"{total:.3f}",
                     f"{eval_s / full_s:.1f}", f"{figures['heldout_loss'] - full['heldout_loss']:+.2e}",
                     f"{kl:.2e}"))
    print(f"Evaluation time per scheme ({args.preset}, {args.arm} arm, medians of {args.rounds}):\n")
    print(table(rows))

    def bare():
        with torch.no_grad():
            reference(probe_x)

    def inf_norm_only():
        out = {}
        q._capture_inputs(reference, names, probe_x,
                          lambda name, x: out.__setitem__(name, x.detach().float().abs().max().item()))
        return out

    def kurtosis_and_inf_norm():
        return q.linear_input_stats(reference, probe_x, names)

    cases = {"forward, no hooks": bare, "forward + inf-norm pre-hooks": inf_norm_only,
             "forward + kurtosis + inf-norm pre-hooks": kurtosis_and_inf_norm}
    samples = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm-up
    for _ in range(max(args.rounds, 5) * 4):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    base = statistics.median(samples["forward, no hooks"])
    rows = [("probe-batch forward", "median ms", "overhead vs no hooks")]
    for name, times in samples.items():
        ms = statistics.median(times) * 1e3
        overhead = "-" if name == "forward, no hooks" else f"{ms / (base * 1e3) - 1:+.0%}"
        rows.append((name, f"{ms:.2f}", overhead))
    print(f"\nProbe cost ({len(names)} Linears, probe batch {tuple(probe_x.shape)}, medians of "
          f"{len(samples['forward, no hooks'])}):\n")
    print(table(rows))


if __name__ == "__main__":
    main()
