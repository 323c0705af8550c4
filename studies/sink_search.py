"""Search CPU-sized regimes for a first-token attention sink that the ungated arm grows and the gate removes.

Each regime is the ``smoke`` preset plus dotted overrides along the axes the literature ties to sinks
(docs/figures.md, reports/sink.md): the data (the built-in text, or the ``backcopy`` corpus whose
synthetic documents give attention nothing to do at most positions, mixed with text at
``data.text_fraction``), context length, training tokens (steps x batch x context), peak LR and
warmup, weight decay and the rest of the optimiser, depth and width. For every seed the script trains
the arms (the reference arm and the G1 elementwise gate; ``--arms`` adds e.g. ``gated_floored``) with the heavy
probes every ``probes.every`` steps, and prints one row per arm and seed: the first-token share
``f_attn_mean`` (F-Attn) at each snapshot against the tokens trained so far, its largest value, the last
per-layer shares, M-Act (``m_act_mean``), the mean gate score and the held-out loss.

Seeds: search on the discovery seeds only (``DISCOVERY_SEEDS``; the held-out seeds of the sink claim,
``suites/test_claims.py``, are refused). ``--held-out`` runs the ``sink`` preset, the regime the search
chose, on those held-out seeds (the comparison the claim asserts) and prints the paired table; ``--record``
reads the record of that comparison kept by the suite and draws the figure.

Usage (from the repository root, inside the virtualenv)::

    python -m studies.sink_search --list
    python -m studies.sink_search --regime text_heads16 --seeds 0,1
    python -m studies.sink_search --stage all                         # every screen, seed 0
    python -m studies.sink_search --regime sink --seeds 0,1,2 --arms gated,gated_floored
    python -m studies.sink_search --plot reports/sink-discovery.png --regime sink   # from --jsonl
    python -m studies.sink_search --held-out                          # the sink preset, 6 held-out seeds
    python -m studies.sink_search --record RECORD.json --plot reports/sink.png      # a kept record

Rows are appended to ``--table`` and the curves to ``--jsonl`` (default ``reports/sink/``, git-ignored);
reports/sink.md is written from them. The machine is shared: one torch thread, one arm at a time.
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
from stability.record import REFERENCE_ARM

DISCOVERY_SEEDS = (0, 1, 2)          # the search's seeds; the claim's held-out seeds are 300-305
HELD_OUT_SEEDS = (300, 301, 302, 303, 304, 305)
PROBES = {"probes.probe_batch_size": 16}   # the probe batch: 16 held-out sequences (4 by default)
STRESS = {"optim.weight_decay": 0.0, "optim.betas": "0.9,0.999", "optim.grad_clip": 0.0}
BACKCOPY = {"data.corpus": "backcopy"}
WIDE = {"model.d_model": 128, "model.n_layers": 4, "model.context": 128, "data.builtin_bytes": 2_000_000}

# The screens of the search, in the order they were run (reports/sink.md has their rows). TEXT is the regime of
# reports/effects.md where the gate's F-Attn direction first showed (peak LR 1e-2, no weight decay,
# beta2 0.999, no clipping: Gu et al. found larger learning rates and sufficient optimisation grow sinks).
TEXT = {"optim.lr": 1e-2, **STRESS}
HEADS16 = {"model.n_heads": 16, "model.n_kv_heads": 16}
REGIMES: dict[str, dict] = {
    # ---------------------------------------------------------------- the built-in text, the smoke model
    "text": {**TEXT, "steps": 1000, "probes.every": 250},
    "text_1layer": {**TEXT, "model.n_layers": 1, "steps": 1000, "probes.every": 250},
    "text_ctx256": {**TEXT, "model.context": 256, "data.batch_size": 2, "steps": 1000, "probes.every": 250},
    "text_wide_lr3e-3": {**WIDE, "optim.lr": 3e-3, "steps": 1000, "probes.every": 250},
    # ---------------------------------------------------------------- synthetic back-copy, most positions idle
    "backcopy": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "steps": 1000, "probes.every": 250},
    "backcopy_long": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "optim.lr_schedule": "constant",
                      "steps": 3000, "probes.every": 500},
    "backcopy_gpt2": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "model.family": "gpt2",
                      "steps": 600, "probes.every": 300},
    "backcopy_gpt2_lr1e-2": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 1e-2, "model.family": "gpt2",
                             "steps": 600, "probes.every": 300},
    "backcopy_ctx256": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "model.context": 256,
                        "data.batch_size": 2, "steps": 600, "probes.every": 300},
    "backcopy_wd0.5": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 1e-2, "optim.weight_decay": 0.5,
                       "steps": 600, "probes.every": 300},
    "backcopy_heads8": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "model.n_heads": 8,
                        "model.n_kv_heads": 8, "steps": 600, "probes.every": 300},
    "backcopy_nobos": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "data.bos": False,
                       "steps": 600, "probes.every": 300},
    "backcopy_1head_1layer": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "model.n_heads": 1,
                              "model.n_kv_heads": 1, "model.n_layers": 1, "steps": 800, "probes.every": 200},
    "backcopy_1head": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 3e-3, "model.n_heads": 1,
                       "model.n_kv_heads": 1, "steps": 800, "probes.every": 200},
    "backcopy_1head_lr1e-2": {**BACKCOPY, "data.text_fraction": 0.0, "optim.lr": 1e-2, "model.n_heads": 1,
                              "model.n_kv_heads": 1, "steps": 800, "probes.every": 200},
    # ---------------------------------------------------------------- more heads than the task needs
    "text_heads8": {**TEXT, "model.n_heads": 8, "model.n_kv_heads": 8, "steps": 600, "probes.every": 300},
    "text_heads16": {**TEXT, **HEADS16, "steps": 600, "probes.every": 300},
    "text_heads16_ctx128": {**TEXT, **HEADS16, "model.context": 128, "data.batch_size": 4, "steps": 600,
                            "probes.every": 300},
    "backcopy50_heads16": {**BACKCOPY, "data.text_fraction": 0.5, **TEXT, **HEADS16, "steps": 600,
                           "probes.every": 300},
    "text_heads16_d128": {**TEXT, **HEADS16, "model.d_model": 128, "steps": 600, "probes.every": 300},
    "text_heads16_1layer": {**TEXT, **HEADS16, "model.n_layers": 1, "steps": 400, "probes.every": 400},
    "text_heads16_3layers": {**TEXT, **HEADS16, "model.n_layers": 3, "steps": 400, "probes.every": 400},
    "text_heads16_lr3e-2": {**TEXT, **HEADS16, "optim.lr": 3e-2, "steps": 400, "probes.every": 400},
    "text_heads32_dim2": {**TEXT, "model.n_heads": 32, "model.n_kv_heads": 32, "steps": 400, "probes.every": 400},
    "text_heads16_long": {**TEXT, **HEADS16, "steps": 2000, "probes.every": 250},
    "backcopy_heads16": {**BACKCOPY, "data.text_fraction": 0.0, **TEXT, **HEADS16, "steps": 400,
                         "probes.every": 400},
    "text_heads16_dim16": {**TEXT, **HEADS16, "model.head_dim": 16, "steps": 400, "probes.every": 400},
    "text_heads16_dim16_1layer": {**TEXT, **HEADS16, "model.head_dim": 16, "model.n_layers": 1, "steps": 400,
                                  "probes.every": 400},
    "text_heads32_dim4": {**TEXT, "model.n_heads": 32, "model.n_kv_heads": 32, "model.head_dim": 4, "steps": 400,
                          "probes.every": 400},
    "text_heads16_lr3e-3": {**STRESS, "optim.lr": 3e-3, **HEADS16, "steps": 400, "probes.every": 400},
    "text_heads16_plain_optim": {"optim.lr": 1e-2, **HEADS16, "steps": 400, "probes.every": 400},
    "text_heads16_nowarmup": {**TEXT, **HEADS16, "optim.warmup_steps": 0, "steps": 400, "probes.every": 400},
    "backcopy25_heads16": {**BACKCOPY, "data.text_fraction": 0.25, **TEXT, **HEADS16, "steps": 400,
                           "probes.every": 400},
    "stdlib_heads16": {"data.corpus": "stdlib", **TEXT, **HEADS16, "steps": 400, "probes.every": 400},
}

STAGES = {"all": list(REGIMES)}


# ----------------------------------------------------------------------------- formatting

def _num(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if value == 0:
        return "0"
    return f"{value:.2e}" if abs(value) >= 1000 or abs(value) < 0.01 else f"{value:.3g}"


def curve(arm_record: dict, tokens_per_step: int) -> list[dict]:
    """The heavy-probe snapshots of one arm: step, tokens trained (after that step), F-Attn, per-layer F-Attn,
    sink rate, M-Act and gate score."""
    return [{"step": p["step"], "tokens": (p["step"] + 1) * tokens_per_step, "f_attn_mean": p.get("f_attn_mean"),
             "f_attn_layers": [layer.get("f_attn") for layer in p["layers"]],
             "sink_rate_mean": p.get("sink_rate_mean"), "m_act_mean": p.get("m_act_mean"),
             "gate_score_mean": p.get("gate_score_mean")} for p in arm_record["probes"]]


def row(regime: str, arm: dict) -> str:
    points = arm["curve"]
    shares = " ".join(f"{_num(p['f_attn_mean'])}" for p in points[1:])
    top = max((p["f_attn_mean"] for p in points if p["f_attn_mean"] is not None), default=None)
    last = points[-1] if points else {}
    layers = "/".join(_num(v) for v in last.get("f_attn_layers", []))
    cells = [regime, arm["arm"], str(arm["seed"]), f"{last.get('tokens', 0) / 1e6:.2f}", shares, _num(top), layers,
             _num(last.get("m_act_mean")), _num(last.get("gate_score_mean")), _num(arm["heldout_loss"]),
             f"{arm['wall_seconds']:.0f}"]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| regime | arm | seed | M tokens | F-Attn at each snapshot | largest F-Attn | last F-Attn per layer | "
          "M-Act | gate | held-out loss | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|")


# ----------------------------------------------------------------------------- running

def configure(overrides: dict, seeds, arms: str) -> cfg.ExperimentConfig:
    return cfg.resolve("smoke", {**PROBES, **overrides, "seeds": ",".join(map(str, seeds)), "arms": arms})


def summaries(record: dict, name: str) -> list[dict]:
    """One summary per arm and seed of a pair record: its curve, final figures, held-out loss and wall time."""
    run = record["config"]["run"]
    tokens_per_step = run["data"]["batch_size"] * run["model"]["context"]
    return [{"regime": name, "arm": a["arm"], "seed": a["seed"], "status": a["status"],
             "curve": curve(a, tokens_per_step), "heldout_loss": a["final"].get("heldout_loss"),
             "final": {k: a["final"].get(k) for k in ("f_attn_mean", "m_act_mean", "sink_rate_mean", "heldout_loss",
                                                      "gate_score_mean")},
             "wall_seconds": a["timing"]["wall_seconds"], "tokens_per_step": tokens_per_step}
            for a in record["arms"]]


def run_seed(name: str, config: cfg.ExperimentConfig) -> list[dict]:
    """Train every arm of one seed; one summary per arm."""
    return summaries(run_pair(config, purpose="claim"), name)


def held_out_table(arms: list[dict], treatments: list[str]) -> str:
    """Paired rows (arm - reference, 95% t-interval, sign-flip p) over the seeds of ``arms``."""
    from stability.record.stats import paired_difference

    by = {(a["arm"], a["seed"]): a["final"] for a in arms}
    seeds = sorted({a["seed"] for a in arms})
    lines = ["| arm − reference | figure | reference | arm | Δ | 95% CI | sign-flip p | n |",
             "|---|---|---|---|---|---|---|---|"]
    for arm in treatments:
        for figure in ("f_attn_mean", "m_act_mean", "sink_rate_mean", "heldout_loss"):
            pairs = [(by[(REFERENCE_ARM, s)].get(figure), by[(arm, s)].get(figure)) for s in seeds
                     if (arm, s) in by and (REFERENCE_ARM, s) in by]
            pairs = [(b, t) for b, t in pairs if b is not None and t is not None]
            if not pairs:
                continue
            d = paired_difference([b for b, _ in pairs], [t for _, t in pairs])
            interval = "-" if d["ci_low"] is None else f"[{_num(d['ci_low'])}, {_num(d['ci_high'])}]"
            p = "-" if d["p_value"] is None else f"{d['p_value']:.3g}"
            lines.append(f"| {arm} − reference | {figure} | {_num(d['reference'])} | {_num(d['treatment'])} | "
                         f"{_num(d['difference'])} | {interval} | {p} | {d['n']} |")
    return "\n".join(lines)


def stored(jsonl: Path, regime: str) -> list[dict]:
    """The summaries of ``regime`` kept in ``jsonl`` by earlier runs of this script."""
    arms = [a for a in map(json.loads, jsonl.read_text().splitlines()) if a["regime"] == regime]
    if not arms:
        raise SystemExit(f"no stored run of regime {regime!r} in {jsonl}")
    return arms


def plot(arms: list[dict], title: str, out: Path) -> None:
    """First-token share (left) and M-Act (right) against tokens trained, one colour per arm: each seed
    thin, the mean over seeds thick; dotted lines at the target shares 0.3 and 0.1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (share, act) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = {REFERENCE_ARM: "tab:red", "gated": "tab:blue", "gated_floored": "tab:green"}
    for name in dict.fromkeys(a["arm"] for a in arms):
        runs = [a for a in arms if a["arm"] == name]
        colour = colours.get(name, None)
        for axis, key in ((share, "f_attn_mean"), (act, "m_act_mean")):
            for a in runs:
                axis.plot([p["tokens"] / 1e6 for p in a["curve"]], [p[key] for p in a["curve"]], color=colour,
                          alpha=0.3, linewidth=0.8)
            steps = min(len(a["curve"]) for a in runs)
            xs = [runs[0]["curve"][i]["tokens"] / 1e6 for i in range(steps)]
            ys = [sum(a["curve"][i][key] for a in runs) / len(runs) for i in range(steps)]
            axis.plot(xs, ys, color=colour, linewidth=2.2, label=f"{name} (mean of {len(runs)} seeds)")
    share.axhline(0.3, color="grey", linestyle=":", linewidth=1)
    share.axhline(0.1, color="grey", linestyle=":", linewidth=1)
    share.set(xlabel="tokens trained (millions)", ylabel="first-token share F-Attn (mean over layers)",
              title=f"F-Attn, {title}", ylim=(0, 0.6))
    act.set(xlabel="tokens trained (millions)", ylabel="M-Act (max |residual|, mean over layers)",
            title="M-Act", yscale="log")
    share.legend(fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    print(f"figure: {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=sorted(STAGES), help="a named list of regimes")
    parser.add_argument("--regime", action="append", default=[], help="a regime name (repeatable), or 'sink' "
                                                                      "(the preset)")
    parser.add_argument("--seeds", default="0", help="comma-separated discovery seeds (default 0)")
    parser.add_argument("--arms", default="gated", help="treatment arms beside the reference arm (default gated)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra override on top of the regime (repeatable)")
    parser.add_argument("--held-out", action="store_true",
                        help="run the sink preset's three arms on the held-out seeds and print the paired table")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--table", default="reports/sink/table.md")
    parser.add_argument("--jsonl", default="reports/sink/curves.jsonl")
    parser.add_argument("--plot", metavar="PNG", help="draw the figure of --regime (from --jsonl) or of --record")
    parser.add_argument("--record", metavar="JSON", help="a pair record (e.g. the sink claim's, kept by the suite "
                                                       "in reports/runs/): print its rows and paired table")
    parser.add_argument("--list", action="store_true", help="print the regimes and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, overrides in REGIMES.items():
            print(f"{name}: smoke {overrides}")
        print(f"sink: the sink preset ({cfg.preset('sink').run.steps} steps)")
        return 0
    table, jsonl = Path(args.table), Path(args.jsonl)
    if args.record:
        from stability.record import read_record

        record = read_record(args.record)
        arms = summaries(record, record["name"])
        print(HEADER)
        print("\n".join(row(a["regime"], a) for a in arms))
        print(held_out_table(arms, [arm["name"] for arm in record["config"]["arms"] if arm["name"] != REFERENCE_ARM]))
        if args.plot:
            seeds = sorted({a["seed"] for a in arms})
            plot(arms, f"preset {record['preset']}, seeds {seeds[0]}-{seeds[-1]}", Path(args.plot))
        return 0
    if args.plot:
        regime = (args.regime or ["sink"])[0]
        plot(stored(jsonl, regime), f"regime {regime}", Path(args.plot))
        return 0
    extra = dict(item.split("=", 1) for item in args.set)
    if args.held_out:
        jobs = [("sink-held-out", None, HELD_OUT_SEEDS, "gated,gated_floored")]
    else:
        names = (STAGES[args.stage] if args.stage else []) + args.regime
        unknown = [n for n in names if n not in REGIMES and n != "sink"]
        if unknown or not names:
            parser.error(f"unknown or no regimes: {unknown}; see --list")
        seeds = tuple(int(s) for s in args.seeds.split(","))
        leaked = sorted(set(seeds) & set(HELD_OUT_SEEDS))
        if leaked:
            parser.error(f"--seeds {leaked} are the claim's held-out seeds: search on discovery seeds only "
                         f"({DISCOVERY_SEEDS}); --held-out runs the held-out comparison")
        jobs = [(name, REGIMES.get(name), seeds, args.arms) for name in names]
    torch.set_num_threads(args.threads)
    table.parent.mkdir(parents=True, exist_ok=True)
    total = time.perf_counter()
    for name, overrides, seeds, arms in jobs:
        done: list[dict] = []
        print(HEADER, flush=True)
        for seed in seeds:   # one seed at a time: a stopped search keeps every finished seed
            if overrides is None:
                config = cfg.resolve("sink", {**extra, "seeds": str(seed), "arms": arms})
            else:
                config = configure({**overrides, **extra}, (seed,), arms)
            results = run_seed(name if not extra else f"{name}+{extra}", config)
            done += results
            lines = [row(r["regime"], r) for r in results]
            print("\n".join(lines), flush=True)
            with table.open("a") as handle:
                handle.write("\n".join(lines) + "\n")
            with jsonl.open("a") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in results)
        if len(seeds) > 1:
            print(held_out_table(done, [a for a in arms.split(",") if a != REFERENCE_ARM]), flush=True)
    print(f"total {time.perf_counter() - total:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
