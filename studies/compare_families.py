"""Does the sign of the gate's effect depend on the architecture family? Paired runs per family, on the CPU.

The regime: 4 layers, 128 wide, 4 heads, context 128, batch 8, the standard-library corpus
(``data.corpus=stdlib``), AdamW at LR 3e-2 held constant after 30 warm-up steps, weight decay 0.1,
no gradient clipping, 1500 steps; heavy probes at step 0 and at the end only. Per (family, seed):
reference (ungated) and G1-elementwise gated arms with the same data order and shared init.

Families (``--family``): "llama" (the harness's Llama-style model, N(0, 0.02) init), "gpt2" (GPT-2
style: LayerNorm, learned positions, GELU MLP, untied head, PyTorch's default init, as in the
observation that motivated this comparison) and "gpt2-normal" (the same GPT-2 model with the
llama family's N(0, 0.02) init, to tell the family from the init).

It is CPU-heavy (about 9 minutes of one core per arm), so it runs one (family, seed, arm) per call if
asked, keeps each arm's result as a small JSON file under reports/families/, and ``--merge`` pools the
seeds whose two arms are both there into the Markdown table::

    nice -n 10 python -m studies.compare_families --family llama --seed 3 --arm reference
    nice -n 10 python -m studies.compare_families --family llama --seed 3 --arm gated
    python -m studies.compare_families --merge --out reports/families-table.md

Paired statistics: ``stability.record.stats.paired_difference`` (difference = gated - reference per seed,
95% t-interval over seeds, exact sign-flip p).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from stability import config as cfg
from stability.config import REFERENCE_ARM, current_arm_name
from stability.record.stats import paired_difference

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "reports" / "families"
FAMILIES = {
    "llama": {"model.family": "llama", "model.init": "normal"},
    "gpt2": {"model.family": "gpt2", "model.init": "pytorch"},
    "gpt2-normal": {"model.family": "gpt2", "model.init": "normal"},
}
REGIME = {
    "model.n_layers": 4, "model.d_model": 128, "model.n_heads": 4, "model.n_kv_heads": 4, "model.context": 128,
    "data.corpus": "stdlib", "data.batch_size": 8, "optim.lr": 3e-2, "optim.lr_schedule": "constant",
    "optim.warmup_steps": 30, "optim.weight_decay": 0.1, "optim.grad_clip": 0.0, "steps": 1500,
    "probes.every": 100_000, "probes.eval_batches": 16, "probes.diverge_patience": 50,
}
SHOWN = (("heldout_loss", "held-out loss"), ("m_act_max", "M-Act max"), ("m_act_mean", "M-Act mean"),
         ("f_attn_mean", "F-Attn"), ("max_attn_logit", "max attn logit"), ("max_grad_norm", "max grad norm"),
         ("loss_spike_score", "loss spike %"), ("diverged", "diverged"))


def run_one(family: str, seed: int, arm: str, steps: int) -> Path:
    """Train one arm of one family at one seed and write its summary JSON; returns the path.

    The arms of a seed are paired as in ``run_pair`` (same batches, same shared init): each is
    ``config.arm_config(arm, seed)`` trained by ``stability.train.trainer.train``, so the two arms of a
    seed can run in separate processes."""
    torch.set_num_threads(1)
    config = cfg.resolve("smoke", {**REGIME, **FAMILIES[family], "steps": steps, "seeds": str(seed)})
    from stability.data import load_corpus
    from stability.record import env_info
    from stability.train.trainer import train

    run = config.arm_config(arm, seed)
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    started = time.time()
    record = train(run, corpus=corpus, arm=arm)
    summary = {"family": family, "seed": seed, "arm": arm, "steps": steps, "overrides": {**REGIME, **FAMILIES[family]},
               "wall_seconds": time.time() - started, "status": record["status"],
               "num_parameters": record["num_parameters"], "final": {k: record["final"].get(k) for k, _ in SHOWN},
               "corpus": {k: corpus.info.get(k) for k in ("kind", "python", "files", "train_bytes", "heldout_bytes",
                                                          "train_sha256")},
               "versions": {k: env_info("cpu").get(k) for k in ("python", "torch", "threads")}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{family}-seed{seed}-{arm}-steps{steps}.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return path


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def merge(steps: int) -> str:
    """The Markdown table of every kept result of ``steps`` steps."""
    arms: dict[tuple[str, int], dict] = {}
    for path in sorted(RESULTS.glob(f"*-steps{steps}.json")):
        item = json.loads(path.read_text())
        arm = current_arm_name(item["arm"])   # results kept before the reference arm was renamed say "baseline"
        arms.setdefault((item["family"], item["seed"]), {"seed": item["seed"], "arms": {}})["arms"][arm] = item
    results: dict[str, list[dict]] = {}
    for (family, _), pair in sorted(arms.items()):
        if {REFERENCE_ARM, "gated"} <= set(pair["arms"]):  # a seed counts once both of its arms are there
            results.setdefault(family, []).append(pair)
    lines = ["| family | figure | seeds | reference | gated | gated - reference [95% CI] | p | per-seed sign |",
             "|---|---|---|---|---|---|---|---|"]
    signs: dict[str, dict[str, str]] = {}
    for family in [f for f in FAMILIES if f in results]:
        items = sorted(results[family], key=lambda r: r["seed"])
        for key, label in SHOWN:
            pairs = [(r["seed"], r["arms"][REFERENCE_ARM]["final"].get(key), r["arms"]["gated"]["final"].get(key))
                     for r in items]
            pairs = [(s, float(b), float(g)) for s, b, g in pairs if b is not None and g is not None]
            if not pairs:
                continue
            stats = paired_difference([b for _, b, _ in pairs], [g for _, _, g in pairs])
            per_seed = "".join("+" if g > b else "-" if g < b else "0" for _, b, g in pairs)
            signs.setdefault(key, {})[family] = per_seed
            interval = f"[{_fmt(stats['ci_low'])}, {_fmt(stats['ci_high'])}]" if stats["ci_low"] is not None else ""
            lines.append(f"| {family} | {label} | {','.join(str(s) for s, _, _ in pairs)} | {_fmt(stats['reference'])} "
                         f"| {_fmt(stats['treatment'])} | {_fmt(stats['difference'])} {interval} "
                         f"| {_fmt(stats['p_value'])} | {per_seed} |")
    return "\n".join(lines) + "\n", signs, results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=tuple(FAMILIES))
    parser.add_argument("--seed", type=int, action="append", help="repeatable")
    parser.add_argument("--arm", choices=(REFERENCE_ARM, "gated"), action="append",
                        help="repeatable (default: both, one after the other)")
    parser.add_argument("--steps", type=int, default=REGIME["steps"])
    parser.add_argument("--merge", action="store_true", help="print (and --out: write) the table of kept results")
    parser.add_argument("--out", help="Markdown file for --merge")
    args = parser.parse_args(argv)
    if args.merge:
        table, _, _ = merge(args.steps)
        print(table)
        if args.out:
            Path(args.out).write_text(table)
        return 0
    if not args.family or not args.seed:
        parser.error("--family and --seed (or --merge) are required")
    for seed in args.seed:
        for arm in args.arm or (REFERENCE_ARM, "gated"):
            path = run_one(args.family, seed, arm, args.steps)
            print(f"{args.family} seed {seed} {arm}: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
