"""Search the CPU-feasible config space for regimes where baseline and gated attention differ.

Each candidate regime is a preset ("smoke" or "ci") plus dotted overrides. For each regime the
script runs ``run_pair`` (both arms, same seeds, same data order) and prints one Markdown row:
the overrides, the seeds, the steps, the wall time and, per figure, "baseline -> gated,
difference [95% CI] p" (paired over seeds: t-interval and exact sign-flip p, see
``stability.stats``). With one seed there is no interval.

A regime with ``lr_grid`` is an LR sweep: one ``run_pair`` per peak LR, then per arm and seed
the LR sensitivity of Wortsman et al. (2023), ``mean_eta[min(loss(eta), loss_init) -
min_eta loss(eta)]`` on the held-out loss (a diverged run counts as ``loss_init``), and the
critical LR (smallest LR at which the arm diverged; the grid maximum times 2 when none did),
compared between arms like the other figures.

Usage (from the repository root, inside the virtualenv)::

    python benchmarks/find_effects.py --stage coarse                 # first pass, 1 seed
    python benchmarks/find_effects.py --stage confirm --seeds 0,1,2  # the chosen regimes
    python benchmarks/find_effects.py --regime deep_hot --seeds 0,1,2
    python benchmarks/find_effects.py --list

Rows are appended to ``--table`` (default ``reports/find_effects/table.md``, git-ignored) and the
per-regime summaries to ``--jsonl``; ``reports/effects.md`` is written by hand from them.
The machine is shared: the script pins torch to ``--threads`` (default 1) and runs one arm at a time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from stability import config as cfg
from stability.experiment import FIGURES, paired_summary, run_pair
from stability.stats import paired_difference

# Figures shown in the table, in order, with a short column name.
SHOWN = (
    ("f_attn_mean", "F-Attn"), ("sink_rate_mean", "sink rate"), ("m_act_mean", "M-Act mean"),
    ("m_act_max", "M-Act max"), ("loss_spike_score", "loss spike %"), ("grad_spike_score", "grad spike %"),
    ("max_grad_norm", "max grad norm"), ("heldout_loss", "held-out loss"), ("max_attn_logit", "max attn logit"),
    ("diverged", "diverged"),
)
EXTRA_FIGURES = {**FIGURES, "diverged": "lower", "min_train_loss": "lower"}

# A long-training, no-regulariser stress base on the smoke model (64 wide, ctx 64): the knobs the
# literature links to sinks and massive activations (no weight decay, beta2 0.999, no clipping).
STRESS = {"optim.weight_decay": 0.0, "optim.betas": "0.9,0.999", "optim.grad_clip": 0.0}
NOPROBE = {"probes.every": 100000}  # heavy probes at step 0 and at the end only
# The "ci" model and optimiser as the ci preset defined them when this search ran (commit 0e782d8's
# config.py). The preset has since changed, so the ci regimes below spell them out on top of "smoke"
# (checked: seed-0 baseline of ci_150 and seed-3 baseline of ci_150_stress reproduce bit for bit).
CI_MODEL = {"model.d_model": 128, "model.n_layers": 4, "model.n_heads": 4, "model.n_kv_heads": 2,
            "model.context": 128, "data.builtin_bytes": 2_000_000, "optim.warmup_steps": 30,
            "optim.weight_decay": 0.1, "optim.betas": "0.9,0.95", "optim.grad_clip": 1.0,
            "probes.spike_window": 50, "probes.diverge_patience": 20, "probes.eval_batches": 8}

REGIMES: dict[str, dict] = {
    # ---------------------------------------------------------------- coarse pass (1 seed)
    "smoke_300": {"preset": "smoke", "overrides": {"steps": 300, **NOPROBE}},
    "smoke_300_lr1e-2": {"preset": "smoke", "overrides": {"steps": 300, "optim.lr": 1e-2, **NOPROBE}},
    "stress_300": {"preset": "smoke", "overrides": {"steps": 300, **STRESS, **NOPROBE}},
    "stress_300_lr1e-2": {"preset": "smoke", "overrides": {"steps": 300, "optim.lr": 1e-2, **STRESS, **NOPROBE}},
    "stress_300_lr1e-2_nowarm_const": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "optim.warmup_steps": 0, "optim.lr_schedule": "constant",
        **STRESS, **NOPROBE}},
    "stress_300_lr3e-2_nowarm": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 3e-2, "optim.warmup_steps": 0, **STRESS, **NOPROBE}},
    "stress_300_nobos": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "data.bos": False, **STRESS, **NOPROBE}},
    "stress_300_qknorm": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "model.qk_norm": True, **STRESS, **NOPROBE}},
    "stress_300_fp16": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "precision.dtype": "fp16", **STRESS, **NOPROBE}},
    "stress_300_fp8": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "precision.dtype": "fp8", **STRESS, **NOPROBE}},
    "stress_deep6_300": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "model.n_layers": 6, **STRESS, **NOPROBE}},
    "stress_ctx128_300": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, "model.context": 128, "data.batch_size": 4, **STRESS, **NOPROBE}},
    "stress_1000": {"preset": "smoke", "overrides": {"steps": 1000, "optim.lr": 1e-2, **STRESS, **NOPROBE}},
    "ci_150_stress": {"preset": "smoke", "overrides": {
        **CI_MODEL, "steps": 150, "optim.lr": 1e-2, "data.batch_size": 8, **STRESS, **NOPROBE}},
    "ci_150": {"preset": "smoke", "overrides": {
        **CI_MODEL, "steps": 150, "optim.lr": 1e-2, "data.batch_size": 8, **NOPROBE}},
    # ---------------------------------------------------------------- LR sweeps (critical LR)
    "lrsweep_smoke": {"preset": "smoke", "overrides": {"steps": 150, "optim.warmup_steps": 0, **NOPROBE},
                      "lr_grid": (1e-2, 3e-2, 1e-1)},
}

STAGES = {
    "coarse": ["smoke_300", "smoke_300_lr1e-2", "stress_300", "stress_300_lr1e-2",
               "stress_300_lr1e-2_nowarm_const", "stress_300_lr3e-2_nowarm", "stress_300_nobos",
               "stress_300_qknorm", "stress_300_fp16", "stress_300_fp8", "stress_deep6_300",
               "stress_ctx128_300", "stress_1000", "ci_150_stress", "lrsweep_smoke"],
    # chosen after the coarse pass. The sign-flip p of n seeds cannot go below 2 / 2**n (3 seeds:
    # p >= 0.25; 6 seeds: p >= 0.031). As run for reports/effects.md (seeds in brackets):
    # ci_150 [0-5], ci_150_stress [0-5], stress_300_lr1e-2 [0-5], stress_ctx128_300 [0-3],
    # stress_300_lr3e-2_nowarm [0-3]; pool runs of one regime made in pieces with --merge.
    "confirm": ["ci_150", "ci_150_stress", "stress_300_lr1e-2", "stress_ctx128_300",
                "stress_300_lr3e-2_nowarm"],
}


# ----------------------------------------------------------------------------- formatting

def _num(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if magnitude >= 1000 or magnitude < 0.01:
        return f"{value:.2e}"
    return f"{value:.3g}"


def cell(entry: dict | None, n_seeds: int | None = None) -> str:
    """'b -> g, d [lo, hi] p=..' for one paired figure ('n/a' when absent)."""
    if not entry or entry.get("n", 0) == 0:
        return "n/a"
    text = f"{_num(entry['baseline'])} → {_num(entry['gated'])}, Δ {_num(entry['difference'])}"
    if entry.get("ci_low") is not None:
        excludes = entry["ci_low"] > 0 or entry["ci_high"] < 0
        interval = f"[{_num(entry['ci_low'])}, {_num(entry['ci_high'])}]"
        text += f" {'**' + interval + '**' if excludes else interval} p={entry['p_value']:.3g}"
    if n_seeds is not None and entry["n"] != n_seeds:
        text += f" (n={entry['n']})"
    return text


def overrides_text(overrides: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in overrides.items() if k not in NOPROBE)


def table_header(figures=SHOWN) -> str:
    names = ["regime", "preset + overrides", "seeds", "steps", "wall s"] + [label for _, label in figures]
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


def table_row(summary: dict, figures=SHOWN) -> str:
    paired = summary["paired"]
    cells = [summary["name"], f"{summary['preset']}: `{overrides_text(summary['overrides'])}`",
             ",".join(map(str, summary["seeds"])), str(summary["steps"]), f"{summary['wall_seconds']:.0f}"]
    cells += [cell(paired.get(figure), len(summary["seeds"])) for figure, _ in figures]
    return "| " + " | ".join(cells) + " |"


# ----------------------------------------------------------------------------- running

def _arm_status(record: dict) -> str:
    return ", ".join(f"{a['arm'][0]}{a['seed']}:{a['status'][:4]}"
                     + (f"@{a['diverged_at_step']}" if a["diverged_at_step"] is not None else "")
                     for a in record["arms"])


def _arms_for_summary(record: dict) -> list[dict]:
    """Arm records with 'diverged' as a number so it can be paired like the other figures."""
    arms = []
    for arm in record["arms"]:
        final = dict(arm["final"])
        final["diverged"] = float(arm["status"] == "diverged")
        arms.append({"arm": arm["arm"], "seed": arm["seed"], "final": final})
    return arms


def run_regime(name: str, spec: dict, seeds: tuple[int, ...]) -> dict:
    overrides = {**spec["overrides"], "seeds": seeds}
    started = time.perf_counter()
    if "lr_grid" in spec:
        return run_lr_sweep(name, spec, overrides, started)
    config = cfg.resolve(spec["preset"], overrides)
    record = run_pair(config)
    summary = {
        "name": name, "preset": spec["preset"], "overrides": spec["overrides"], "seeds": list(seeds),
        "steps": config.run.steps, "wall_seconds": time.perf_counter() - started,
        "paired": paired_summary(_arms_for_summary(record), EXTRA_FIGURES),
        "arms": _arm_status(record),
        "per_seed": {f"{a['arm']}{a['seed']}": {k: v for k, v in a["final"].items() if k in EXTRA_FIGURES}
                     for a in _arms_for_summary(record)},
        "gate_score_mean": [a["final"].get("gate_score_mean") for a in record["arms"] if a["arm"] == "gated"],
        "per_layer_f_attn": {f"{a['arm']}{a['seed']}": [round(layer.get("f_attn", float("nan")), 4)
                                                        for layer in a["probes"][-1]["layers"]]
                             for a in record["arms"] if a["probes"]},
        "per_layer_m_act": {f"{a['arm']}{a['seed']}": [round(layer.get("m_act", float("nan")), 2)
                                                       for layer in a["probes"][-1]["layers"]]
                            for a in record["arms"] if a["probes"]},
    }
    return summary


def run_lr_sweep(name: str, spec: dict, overrides: dict, started: float) -> dict:
    """One run_pair per LR; then LR sensitivity and critical LR per (arm, seed), paired over seeds."""
    grid = tuple(spec["lr_grid"])
    losses: dict[tuple[str, int], dict[float, float]] = {}
    diverged: dict[tuple[str, int], dict[float, bool]] = {}
    initial: dict[tuple[str, int], float] = {}
    per_lr_paired = {}
    steps = None
    statuses = []
    for lr in grid:
        config = cfg.resolve(spec["preset"], {**overrides, "optim.lr": lr})
        steps = config.run.steps
        record = run_pair(config)
        statuses.append(f"lr={lr:g}: {_arm_status(record)}")
        per_lr_paired[str(lr)] = paired_summary(_arms_for_summary(record), EXTRA_FIGURES)
        for arm in record["arms"]:
            key = (arm["arm"], arm["seed"])
            first = next((v for v in arm["series"]["loss"] if math.isfinite(v)), float("nan"))
            initial[key] = initial.get(key, first)
            is_div = arm["status"] == "diverged"
            diverged.setdefault(key, {})[lr] = is_div
            loss = arm["final"].get("heldout_loss", float("nan"))
            losses.setdefault(key, {})[lr] = float("nan") if is_div or not math.isfinite(loss) else loss
    sensitivity, critical = {}, {}
    for key, by_lr in losses.items():
        init = initial[key]
        capped = {lr: (min(v, init) if math.isfinite(v) else init) for lr, v in by_lr.items()}
        best = min(capped.values())
        sensitivity[key] = sum(v - best for v in capped.values()) / len(capped)
        divs = [lr for lr in grid if diverged[key][lr]]
        critical[key] = min(divs) if divs else 2 * max(grid)
    seeds = sorted({seed for _, seed in losses})
    paired = {
        "lr_sensitivity": paired_difference([sensitivity[("baseline", s)] for s in seeds],
                                            [sensitivity[("gated", s)] for s in seeds]),
        "critical_lr": paired_difference([critical[("baseline", s)] for s in seeds],
                                         [critical[("gated", s)] for s in seeds]),
    }
    for lr in grid:
        for figure in ("heldout_loss", "diverged", "loss_spike_score", "m_act_mean", "f_attn_mean"):
            if figure in per_lr_paired[str(lr)]:
                paired[f"{figure}@lr={lr:g}"] = per_lr_paired[str(lr)][figure]
    return {"name": name, "preset": spec["preset"], "overrides": spec["overrides"], "lr_grid": list(grid),
            "seeds": seeds, "steps": steps, "wall_seconds": time.perf_counter() - started,
            "paired": paired, "arms": " | ".join(statuses)}


def sweep_rows(summary: dict) -> str:
    """A small table for an LR sweep: one row per figure."""
    title = (f"LR sweep `{summary['name']}` ({summary['preset']}: `{overrides_text(summary['overrides'])}`, "
             f"grid {summary['lr_grid']}, seeds {summary['seeds']}, {summary['steps']} steps, "
             f"{summary['wall_seconds']:.0f} s)")
    lines = [title, "", "| figure | baseline → gated, Δ [95% CI] p |", "|---|---|"]
    lines += [f"| {figure} | {cell(entry)} |" for figure, entry in summary["paired"].items()]
    return "\n".join(lines)


def _per_seed_values(summary: dict) -> dict[str, dict]:
    """{"baseline0": {figure: value}} from a summary; older summaries without ``per_seed`` give
    F-Attn and M-Act back from their per-layer lists (the other figures are then missing)."""
    if "per_seed" in summary:
        return summary["per_seed"]
    out = {}
    for key, f_attn in summary.get("per_layer_f_attn", {}).items():
        m_act = summary["per_layer_m_act"][key]
        out[key] = {"f_attn_mean": sum(f_attn) / len(f_attn), "m_act_mean": sum(m_act) / len(m_act),
                    "m_act_max": max(m_act)}
    return out


def merge(name: str, jsonl: Path) -> dict:
    """Pool every stored run of regime ``name`` (same overrides, different seeds) into one summary."""
    runs = [s for s in map(json.loads, jsonl.read_text().splitlines()) if s["name"] == name]
    values: dict[str, dict] = {}
    for summary in runs:
        values.update(_per_seed_values(summary))
    seeds = sorted({int(k[len("baseline"):]) for k in values if k.startswith("baseline")})
    paired = {}
    for figure in EXTRA_FIGURES:
        pairs = [(values[f"baseline{s}"].get(figure), values.get(f"gated{s}", {}).get(figure)) for s in seeds]
        pairs = [(b, g) for b, g in pairs if b is not None and g is not None]
        if pairs:
            paired[figure] = paired_difference([b for b, _ in pairs], [g for _, g in pairs])
    return {"name": name + " (pooled)", "preset": runs[0]["preset"], "overrides": runs[0]["overrides"],
            "seeds": seeds, "steps": runs[0]["steps"], "wall_seconds": sum(r["wall_seconds"] for r in runs),
            "paired": paired}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=sorted(STAGES), help="a named list of regimes")
    parser.add_argument("--regime", action="append", default=[], help="a regime name (repeatable)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", default="reports/find_effects/table.md")
    parser.add_argument("--jsonl", default="reports/find_effects/summaries.jsonl")
    parser.add_argument("--list", action="store_true", help="print the regimes and exit")
    parser.add_argument("--merge", metavar="REGIME", help="pool the stored seeds of a regime and print its row")
    args = parser.parse_args(argv)
    if args.merge:
        print(table_header())
        print(table_row(merge(args.merge, Path(args.jsonl))))
        return 0
    if args.list:
        for name, spec in REGIMES.items():
            print(f"{name}: {spec['preset']} {spec['overrides']}" + (f" lr_grid={spec['lr_grid']}"
                                                                      if "lr_grid" in spec else ""))
        return 0
    names = (STAGES[args.stage] if args.stage else []) + args.regime
    unknown = [n for n in names if n not in REGIMES]
    if unknown or not names:
        parser.error(f"unknown or no regimes: {unknown}; see --list")
    torch.set_num_threads(args.threads)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    table, jsonl = Path(args.table), Path(args.jsonl)
    table.parent.mkdir(parents=True, exist_ok=True)
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    print(table_header(), flush=True)
    total = time.perf_counter()
    for name in names:
        summary = run_regime(name, REGIMES[name], seeds)
        text = sweep_rows(summary) if "lr_grid" in summary else table_row(summary)
        print(text, flush=True)
        print(f"  arms: {summary['arms']}", file=sys.stderr, flush=True)
        with table.open("a") as handle:
            handle.write(text + "\n")
        with jsonl.open("a") as handle:
            handle.write(json.dumps(summary, default=str) + "\n")
    print(f"total {time.perf_counter() - total:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
