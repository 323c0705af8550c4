"""Search the CPU-feasible config space for regimes where the arms differ from the reference arm.

Each candidate regime is a preset ("smoke" or "ci") plus dotted overrides, which may select arms
(``"arms": "controls"``) and turn on the extrapolation probe. For each regime the script runs
``run_pair`` (every arm, same seeds, same data order) and prints one Markdown row per treatment
arm: the overrides, the seeds, the steps, the wall time and, per figure, "reference -> arm,
difference [95% CI] p" (paired over seeds: t-interval and exact sign-flip p, see
``stability.record.stats``). With one seed there is no interval. A regime may also name ``contrasts``,
pairs of arms compared with each other the same way (e.g. the floored gate against the gate).

Held-out protocol. A regime's ``discovery`` seeds are searched; its ``held_out`` seeds, written
here before they are run, confirm (or not) what the discovery seeds suggested. ``--stage`` and
``--seeds discovery`` / ``--seeds held_out`` run them; ``--long REGIME`` prints the pooled long-form
table (one row per arm and figure) that reports/*.md quote.

A regime with ``lr_grid`` is an LR sweep: one ``run_pair`` per peak LR, then per arm and seed
the LR sensitivity of Wortsman et al. (2023), ``mean_eta[min(loss(eta), loss_init) -
min_eta loss(eta)]`` on the held-out loss (a diverged run counts as ``loss_init``), and the
critical LR (smallest LR at which the arm diverged; the grid maximum times 2 when none did),
compared between arms like the other figures.

Usage (from the repository root, inside the virtualenv)::

    python -m studies.find_effects --stage coarse                 # first pass, 1 seed
    python -m studies.find_effects --stage confirm --seeds 0,1,2  # the chosen regimes
    python -m studies.find_effects --regime deep_hot --seeds 0,1,2
    python -m studies.find_effects --regime controls_ci_150 --seeds discovery
    python -m studies.find_effects --long controls_ci_150 --seeds held_out
    python -m studies.find_effects --list

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
from stability.cases.standard import run_pair
from stability.record import REFERENCE_ARM, Status, usable_value
from stability.record import figures as fig
from stability.record.stats import paired_difference

# Figures shown in the table, in order, with a short column name.
SHOWN = (
    ("f_attn_mean", "F-Attn"), ("sink_rate_mean", "sink rate"), ("m_act_mean", "M-Act mean"),
    ("m_act_max", "M-Act max"), ("loss_spike_score", "loss spike %"), ("grad_spike_score", "grad spike %"),
    ("max_grad_norm", "max grad norm"), ("heldout_loss", "held-out loss"), ("max_attn_logit", "max attn logit"),
    ("diverged", "diverged"),
)
# the extrapolation probe's figures, shown for regimes that turn it on
EXTRAPOLATION_SHOWN = (
    ("extrap_gap_plain_x2", "gap x2 plain"), ("extrap_gap_plain_x4", "gap x4 plain"),
    ("extrap_gap_ntk_x2", "gap x2 NTK"), ("extrap_gap_ntk_x4", "gap x4 NTK"),
    ("extrap_f_attn_plain_x4", "F-Attn x4 plain"), ("extrap_sink_rate_plain_x4", "sink x4 plain"),
)

# A long-training, no-regulariser stress base on the smoke model (64 wide, ctx 64): the knobs the
# literature links to sinks and massive activations (no weight decay, beta2 0.999, no clipping).
STRESS = {"optim.weight_decay": 0.0, "optim.betas": "0.9,0.999", "optim.grad_clip": 0.0}
NOPROBE = {"probes.every": 100000}  # heavy probes at step 0 and at the end only
# The "ci" model and optimiser as the ci preset defined them when this search ran (commit 0e782d8's
# config.py). The preset has since changed, so the ci regimes below spell them out on top of "smoke"
# (checked: seed-0 reference arm of ci_150 and seed-3 reference arm of ci_150_stress reproduce bit for bit).
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
    # ---------------------------------------------------------------- the paper's controls (N arms)
    # ci_150 (the M-Act regime) with the reference arm, G1, G1 headwise, G1 floored at 0.5 and G2, and the
    # extrapolation probe at 2x and 4x the context (plain RoPE and NTK-aware)
    "controls_ci_150": {"preset": "smoke", "overrides": {
        **CI_MODEL, "steps": 150, "optim.lr": 1e-2, "data.batch_size": 8, **NOPROBE, "arms": "controls",
        "extrapolation.factors": "2,4", "extrapolation.eval_batches": 4},
        "contrasts": [("gated_floored", "gated"), ("gated_headwise", "gated"), ("gated_value", "gated")],
        "discovery": (0, 1, 2, 3, 4, 5), "held_out": (200, 201, 202, 203, 204, 205)},
    # the stabilizers alone and the gate, in the optimiser-stress regime where the gate helps the loss
    "stabilizers_stress_300": {"preset": "smoke", "overrides": {
        "steps": 300, "optim.lr": 1e-2, **STRESS, **NOPROBE, "arms": "stabilizers"},
        "discovery": (0, 1, 2)},
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
    # the controls and the extrapolation probe (reports/controls.md): run with --seeds discovery, then
    # --seeds held_out
    "controls": ["controls_ci_150"],
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
    """'b -> t, d [lo, hi] p=..' for one paired figure ('n/a' when absent)."""
    if not entry or entry.get("n", 0) == 0:
        return "n/a"
    text = f"{_num(entry['reference'])} → {_num(entry['treatment'])}, Δ {_num(entry['difference'])}"
    if entry.get("ci_low") is not None:
        excludes = entry["ci_low"] > 0 or entry["ci_high"] < 0
        interval = f"[{_num(entry['ci_low'])}, {_num(entry['ci_high'])}]"
        text += f" {'**' + interval + '**' if excludes else interval} p={entry['p_value']:.3g}"
    if n_seeds is not None and entry["n"] != n_seeds:
        text += f" (n={entry['n']})"
    return text


def overrides_text(overrides: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in overrides.items() if k not in NOPROBE)


def shown(summary: dict) -> tuple:
    extrapolating = any(k.startswith("extrapolation.") for k in summary["overrides"])
    return SHOWN + (EXTRAPOLATION_SHOWN if extrapolating else ())


def table_header(figures=SHOWN) -> str:
    names = ["regime", "arm", "preset + overrides", "seeds", "steps", "wall s"] + [label for _, label in figures]
    return "| " + " | ".join(names) + " |\n|" + "---|" * len(names)


def table_rows(summary: dict) -> str:
    """One row per treatment arm (and per contrast): 'reference -> arm' for every shown figure."""
    figures = shown(summary)
    rows = [table_header(figures)]
    for arm, paired in {**summary["paired"], **summary.get("contrasts", {})}.items():
        cells = [summary["name"], arm, f"{summary['preset']}: `{overrides_text(summary['overrides'])}`",
                 ",".join(map(str, summary["seeds"])), str(summary["steps"]), f"{summary['wall_seconds']:.0f}"]
        cells += [cell(paired.get(figure), len(summary["seeds"])) for figure, _ in figures]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def long_rows(summary: dict, figures=None) -> str:
    """The long-form table: one row per arm (or contrast) and figure, as reports/*.md quote it."""
    figures = figures or [name for name, _ in shown(summary)]
    rows = ["| regime | seeds | arm − reference | figure | reference | arm | Δ | 95% CI | sign-flip p | n |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    contrasts = {f"{a} − {b}": summary["contrasts"][f"{a}-{b}"] for a, b in summary.get("contrast_pairs", [])}
    tables = {f"{arm} − reference": paired for arm, paired in summary["paired"].items()} | contrasts
    seeds = ",".join(map(str, summary["seeds"]))
    for label, paired in tables.items():
        for figure in figures:
            entry = paired.get(figure)
            if not entry or not entry.get("n"):
                continue
            interval = "-" if entry["ci_low"] is None else f"[{_num(entry['ci_low'])}, {_num(entry['ci_high'])}]"
            p = "-" if entry["p_value"] is None else f"{entry['p_value']:.3g}"
            rows.append(f"| {summary['name']} | {seeds} | {label} | {figure} | {_num(entry['reference'])} | "
                        f"{_num(entry['treatment'])} | {_num(entry['difference'])} | {interval} | {p} | "
                        f"{entry['n']} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- running

def _arm_status(record: dict) -> str:
    return ", ".join(f"{a['arm']}{a['seed']}:{a['status'][:4]}"
                     + (f"@{a['diverged_at_step']}" if a["diverged_at_step"] is not None else "")
                     for a in record["arms"])


def per_seed_values(record: dict) -> dict[str, dict[str, dict]]:
    """{arm: {seed: {figure: usable value}}} for every figure of the table ('diverged' as 0/1)."""
    out: dict[str, dict[str, dict]] = {}
    for arm in record["arms"]:
        values = {name: usable_value(arm, name) for name in arm["final"] if fig.figure(name) is not None}
        values["diverged"] = float(arm["status"] == Status.DIVERGED)
        out.setdefault(arm["arm"], {})[str(arm["seed"])] = values
    return out


def pair(per_seed: dict, reference: str, arm: str) -> dict[str, dict]:
    """Per figure, ``arm - reference`` over the seeds where both have a value (``paired_difference``)."""
    seeds = sorted(set(per_seed.get(reference, {})) & set(per_seed.get(arm, {})), key=int)
    names = {name for s in seeds for side in (reference, arm) for name in per_seed[side][s]}
    out = {}
    for name in sorted(names):
        pairs = [(per_seed[reference][s].get(name), per_seed[arm][s].get(name)) for s in seeds]
        pairs = [(r, a) for r, a in pairs if r is not None and a is not None]
        if pairs:
            out[name] = paired_difference([r for r, _ in pairs], [a for _, a in pairs])
    return out


def summarise(name: str, spec: dict, per_seed: dict, steps: int, wall: float, statuses: str = "") -> dict:
    arms = [a for a in per_seed if a != REFERENCE_ARM]
    contrasts = spec.get("contrasts", [])
    return {"name": name, "preset": spec["preset"], "overrides": spec["overrides"],
            "seeds": sorted({int(s) for values in per_seed.values() for s in values}), "steps": steps,
            "wall_seconds": wall, "paired": {arm: pair(per_seed, REFERENCE_ARM, arm) for arm in arms},
            "contrast_pairs": [list(c) for c in contrasts],
            "contrasts": {f"{a}-{b}": pair(per_seed, b, a) for a, b in contrasts}, "arms": statuses,
            "per_seed": per_seed}


def run_regime(name: str, spec: dict, seeds: tuple[int, ...]) -> dict:
    overrides = {**spec["overrides"], "seeds": seeds}
    started = time.perf_counter()
    if "lr_grid" in spec:
        return run_lr_sweep(name, spec, overrides, started)
    config = cfg.resolve(spec["preset"], overrides)
    record = run_pair(config)
    summary = summarise(name, spec, per_seed_values(record), config.run.steps, time.perf_counter() - started,
                        _arm_status(record))
    summary["per_layer_f_attn"] = {f"{a['arm']}@{a['seed']}": [round(layer.get("f_attn", float("nan")), 4)
                                                               for layer in a["probes"][-1]["layers"]]
                                   for a in record["arms"] if a["probes"]}
    summary["per_layer_m_act"] = {f"{a['arm']}@{a['seed']}": [round(layer.get("m_act", float("nan")), 2)
                                                              for layer in a["probes"][-1]["layers"]]
                                  for a in record["arms"] if a["probes"]}
    summary["timing"] = {f"{a['arm']}@{a['seed']}": a["timing"] for a in record["arms"]}
    return summary


def run_lr_sweep(name: str, spec: dict, overrides: dict, started: float) -> dict:
    """One run_pair per LR; then LR sensitivity and critical LR per (arm, seed), paired over seeds."""
    grid = tuple(spec["lr_grid"])
    losses: dict[tuple[str, int], dict[float, float]] = {}
    diverged: dict[tuple[str, int], dict[float, bool]] = {}
    initial: dict[tuple[str, int], float] = {}
    per_lr = {}
    steps = None
    statuses = []
    for lr in grid:
        config = cfg.resolve(spec["preset"], {**overrides, "optim.lr": lr})
        steps = config.run.steps
        record = run_pair(config)
        statuses.append(f"lr={lr:g}: {_arm_status(record)}")
        per_lr[lr] = per_seed_values(record)
        for arm in record["arms"]:
            key = (arm["arm"], arm["seed"])
            first = next((v for v in arm["series"]["loss"] if math.isfinite(v)), float("nan"))
            initial[key] = initial.get(key, first)
            is_div = arm["status"] == Status.DIVERGED
            diverged.setdefault(key, {})[lr] = is_div
            loss = arm["final"].get("heldout_loss", float("nan"))
            losses.setdefault(key, {})[lr] = float("nan") if is_div or not math.isfinite(loss) else loss
    per_seed: dict[str, dict[str, dict]] = {}
    for key, by_lr in losses.items():
        init = initial[key]
        capped = {lr: (min(v, init) if math.isfinite(v) else init) for lr, v in by_lr.items()}
        best = min(capped.values())
        divs = [lr for lr in grid if diverged[key][lr]]
        values = {"lr_sensitivity": sum(v - best for v in capped.values()) / len(capped),
                  "critical_lr": min(divs) if divs else 2 * max(grid)}
        for lr in grid:
            for figure in ("heldout_loss", "diverged", "loss_spike_score", "m_act_mean", "f_attn_mean"):
                values[f"{figure}@lr={lr:g}"] = per_lr[lr][key[0]][str(key[1])].get(figure)
        per_seed.setdefault(key[0], {})[str(key[1])] = values
    summary = summarise(name, spec, per_seed, steps, time.perf_counter() - started, " | ".join(statuses))
    summary["lr_grid"] = list(grid)
    return summary


def sweep_rows(summary: dict) -> str:
    """A small table for an LR sweep: one row per arm and figure."""
    title = (f"LR sweep `{summary['name']}` ({summary['preset']}: `{overrides_text(summary['overrides'])}`, "
             f"grid {summary['lr_grid']}, seeds {summary['seeds']}, {summary['steps']} steps, "
             f"{summary['wall_seconds']:.0f} s)")
    lines = [title, "", "| arm | figure | reference → arm, Δ [95% CI] p |", "|---|---|---|"]
    lines += [f"| {arm} | {figure} | {cell(entry)} |" for arm, paired in summary["paired"].items()
              for figure, entry in paired.items()]
    return "\n".join(lines)


def merge(name: str, jsonl: Path, seeds=None) -> dict:
    """Pool every stored run of regime ``name`` (same overrides, different seeds) into one summary;
    ``seeds`` keeps only those seeds (e.g. the held-out ones)."""
    runs = [s for s in map(json.loads, jsonl.read_text().splitlines()) if s["name"] == name]
    if not runs:
        raise SystemExit(f"no stored run of regime {name!r} in {jsonl}")
    per_seed: dict[str, dict[str, dict]] = {}
    for summary in runs:
        for arm, by_seed in summary["per_seed"].items():
            for seed, values in by_seed.items():
                if seeds is None or int(seed) in seeds:
                    per_seed.setdefault(arm, {})[seed] = values
    merged = summarise(name, REGIMES[name], per_seed, runs[0]["steps"],
                       sum(r["wall_seconds"] for r in runs), "")
    merged["name"] = name + " (pooled)"
    return merged


def _seeds(text: str, names: list[str]) -> tuple[int, ...] | None:
    """--seeds: a comma list, or "discovery" / "held_out" (the regimes' own; None = per regime)."""
    if text in ("discovery", "held_out"):
        return None
    return tuple(int(s) for s in text.split(",") if s.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=sorted(STAGES), help="a named list of regimes")
    parser.add_argument("--regime", action="append", default=[], help="a regime name (repeatable)")
    parser.add_argument("--seeds", default="0",
                        help="comma-separated seeds, or 'discovery' / 'held_out' (each regime's own; default 0)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", default="reports/find_effects/table.md")
    parser.add_argument("--jsonl", default="reports/find_effects/summaries.jsonl")
    parser.add_argument("--list", action="store_true", help="print the regimes and exit")
    parser.add_argument("--merge", metavar="REGIME", help="pool the stored seeds of a regime and print its rows")
    parser.add_argument("--long", metavar="REGIME", help="pool the stored seeds of a regime (--seeds selects "
                                                         "them) and print the long-form table")
    args = parser.parse_args(argv)
    if args.merge or args.long:
        name = args.merge or args.long
        spec = REGIMES[name]
        wanted = spec.get(args.seeds) if args.seeds in ("discovery", "held_out") else (
            None if args.seeds == "0" and args.merge else _seeds(args.seeds, [name]))
        merged = merge(name, Path(args.jsonl), wanted)
        print(long_rows(merged) if args.long else table_rows(merged))
        return 0
    if args.list:
        for name, spec in REGIMES.items():
            extra = {k: spec[k] for k in ("lr_grid", "contrasts", "discovery", "held_out") if k in spec}
            print(f"{name}: {spec['preset']} {spec['overrides']}" + (f" {extra}" if extra else ""))
        return 0
    names = (STAGES[args.stage] if args.stage else []) + args.regime
    unknown = [n for n in names if n not in REGIMES]
    if unknown or not names:
        parser.error(f"unknown or no regimes: {unknown}; see --list")
    torch.set_num_threads(args.threads)
    table, jsonl = Path(args.table), Path(args.jsonl)
    table.parent.mkdir(parents=True, exist_ok=True)
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    total = time.perf_counter()
    for name in names:
        seeds = _seeds(args.seeds, names) or tuple(REGIMES[name].get(args.seeds) or ())
        if not seeds:
            parser.error(f"regime {name} declares no {args.seeds} seeds")
        for seed in seeds:  # one seed at a time: a stopped search keeps every finished seed
            summary = run_regime(name, REGIMES[name], (seed,))
            text = sweep_rows(summary) if "lr_grid" in summary else table_rows(summary)
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
