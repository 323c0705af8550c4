"""Synthetic pair records in the trainer's layout, for the tracking / regression / report tests.

Training a real pair takes tens of seconds on a shared 2-core machine, so these tests build
records with the same fields the trainer and ``run_pair`` write (``new_record`` layout, arm
records with series / events / probes / final / timing, ``paired`` from ``paired_summary``),
with deterministic, seed-dependent numbers.
"""

from __future__ import annotations

import copy
import math
import random

from stability import config as cfg
from stability.record import SCHEMA_VERSION, Status, git_info, paired_summary

LAYERS = 2
HERE = git_info()["commit"] or "0123456789abcdef0123456789abcdef01234567"
"""The records' commit: this repository's HEAD, as if trained here (`stability check` judges the runs of
the commit it checks)."""


def arm_record(arm: str, seed: int, steps: int = 30, lr: float = 3e-3, status: str = Status.COMPLETED,
               diverge_at: int | None = None, quant: bool = False) -> dict:
    rng = random.Random(f"{arm}-{seed}-{lr}")
    gated = arm != "reference"  # every treatment arm gets the gated arm's figures
    n = steps if diverge_at is None else diverge_at + 1
    loss = [5.5 * math.exp(-step / 12) + 3.0 + rng.uniform(-0.05, 0.05) for step in range(n)]
    if diverge_at is not None:
        loss[-1] = float("nan")
        status = Status.DIVERGED
    grad = [1.5 * math.exp(-step / 20) + 0.3 + rng.uniform(0, 0.2) for step in range(n)]
    lrs = [lr * min(1.0, (step + 1) / 5) for step in range(n)]
    layers = [{"f_attn": (0.06 if gated else 0.3) + 0.01 * i + rng.uniform(0, 0.01),
               "m_act": (3.0 if gated else 9.0) * (i + 1) + rng.uniform(0, 0.3), "m_act_ratio": 3.0,
               "sink_rate": 0.0 if gated else 0.25, "max_attn_logit": 5.0 + i} for i in range(LAYERS)]
    probe = {"step": n - 1, "layers": layers,
             "m_act_mean": sum(x["m_act"] for x in layers) / LAYERS, "m_act_max": max(x["m_act"] for x in layers),
             "f_attn_mean": sum(x["f_attn"] for x in layers) / LAYERS,
             "sink_rate_mean": sum(x["sink_rate"] for x in layers) / LAYERS, "max_attn_logit": 6.0,
             "gate_score_mean": 0.12 if gated else None, "logit_max": 4.6, "log_z_mean": 5.7, "linear_inputs": {}}
    finite = [v for v in loss if math.isfinite(v)]
    final = {"heldout_loss": None if diverge_at is not None else finite[-1] + 0.02,
             "perplexity": None if diverge_at is not None else math.exp(finite[-1] + 0.02),
             "accuracy": 0.14 + (0.01 if gated else 0.0) + rng.uniform(0, 0.002), "steps_completed": n,
             "final_train_loss": sum(finite[-5:]) / len(finite[-5:]), "min_train_loss": min(finite),
             "loss_spike_score": 0.0, "grad_spike_score": 0.0 if gated else 1.5, "loss_spikes": 0,
             "grad_spikes": 0 if gated else 1, "nonfinite_events": 1 if diverge_at is not None else 0,
             "skipped_steps": 0, "max_grad_norm": max(grad), "diverged": diverge_at is not None,
             "divergence_step": diverge_at if diverge_at is not None else steps,
             **{k: v for k, v in probe.items() if k in ("m_act_mean", "m_act_max", "f_attn_mean", "sink_rate_mean",
                                                         "max_attn_logit", "gate_score_mean", "logit_max",
                                                         "log_z_mean")},
             "overflow_fraction": 0.0, "underflow_fraction": 0.0, "loss_scale_drops": 0.0}
    record = {
        "arm": arm, "variant": "G1-elementwise" if gated else "ungated", "seed": seed, "schedule": "standard",
        "status": Status(status).value, "diverged_at_step": diverge_at, "stop_reason": None, "num_parameters": 1000,
        "gate_parameters": 100 if gated else 0, "layer_names": [f"blocks.{i}" for i in range(LAYERS)],
        "series": {"step": list(range(n)), "lr": lrs, "batch_size": [8] * n, "tokens": [512 * (s + 1) for s in range(n)],
                   "loss": loss, "grad_norm": grad, "layer_grad_norm": [[g / 2, g / 2] for g in grad],
                   "loss_scale": [1.0] * n, "loss_spike": [False] * n, "grad_spike": [False] * n,
                   "nonfinite": [""] * n, "skipped": [False] * n},
        "events": [], "probes": [probe], "precision_stats": [], "final": final,
        "timing": {"wall_seconds": 1.0, "train_seconds": 0.9, "probe_seconds": 0.05, "eval_seconds": 0.05,
                   "tokens": 512 * n, "tokens_per_second": 512 * n / 0.9},
    }
    if status == "killed":
        record.update(stop_reason="interrupted (Ctrl-C)")
    if quant:   # stability.evaluate.quantize.evaluate_schemes layout
        schemes = {}
        for scheme, damage in (("int8", 0.01 if gated else 0.05), ("nf4", 0.10 if gated else 0.30)):
            schemes[scheme] = {"library": "bitsandbytes", "version": "0.50.2", "method": f"bitsandbytes {scheme} recipe",
                               "heldout_loss": 3.3 + damage, "perplexity": 27.0, "accuracy": 0.14,
                               "damage_loss": damage, "damage_perplexity": 1.0, "damage_accuracy": -damage / 10,
                               "per_linear": {"blocks.0.attn.q_proj": {"kurtosis": 2.0, "inf_norm": 3.0,
                                                                       "damage": 0.01}}}
            final[f"quant_{scheme}_damage_loss"] = damage
            final[f"quant_{scheme}_damage_accuracy"] = -damage / 10
        schemes["fp8"] = {"skipped": "fp8 needs a GPU here", "library": "stability", "version": "0.1.0",
                          "method": "own fp8"}
        record["quant"] = {"full_precision": {"heldout_loss": 3.3, "perplexity": 27.0, "accuracy": 0.14},
                           "reference_dtype": "fp32", "head_quantized": False, "schemes": schemes}
    return record


def pair_record(name: str = "smoke", case_label: str = "standard", seeds=(0, 1, 2), preset: str = "smoke",
                lrs=None, status: str = Status.COMPLETED, quant: bool = False, purpose: str = "regression",
                **overrides) -> dict:
    """A complete pair record; ``lrs`` makes an LR-sweep record (one arm per seed and LR); an ``arms``
    override ("controls", "gated,qk_norm") gives it those arms."""
    config = cfg.resolve(preset, {"seeds": ",".join(map(str, seeds)), **overrides})
    arms, per_arm = [], []
    for seed in seeds:
        for arm in config.arm_names:
            arms.append(arm_record(arm, seed, lr=config.run.optim.lr, quant=quant))
            if lrs:   # stability.cases.lr_sweep.run_sweep layout: configured runs in arms, the grid under "lr_sweep"
                critical = 0.1 if arm == "reference" else 0.3
                losses = [None if lr >= critical else 3.2 + abs(math.log10(lr / 3e-3)) / 5 for lr in lrs]
                per_arm.append({"arm": arm, "seed": seed, "lrs": list(lrs), "final_loss": losses,
                                "status": [(Status.DIVERGED if v is None else Status.COMPLETED).value for v in losses],
                                "lr_sensitivity": 0.5 if arm == "reference" else 0.3, "critical_lr": critical,
                                "critical_lr_censored": False, "loss_init": 5.6})
                arms[-1]["final"].update(lr_sensitivity=per_arm[-1]["lr_sensitivity"], critical_lr=critical,
                                         peak_lr=config.run.optim.lr)
    if status == "killed":
        arms[-1]["status"] = Status.KILLED.value
        arms[-1]["stop_reason"] = "interrupted (Ctrl-C)"
    record = {
        "schema_version": SCHEMA_VERSION, "created_at": "2026-01-01T00:00:00+00:00", "name": name,
        "preset": preset, "case": "standard", "case_label": case_label, "purpose": purpose,
        "description": "warmup then cosine decay", "status": Status(status).value,
        "git": {"commit": HERE, "branch": "main", "dirty": False},
        "env": {"python": "3.11", "torch": "2.13.0+cpu", "triton": "3.6.0", "bitsandbytes": "0.50.2",
                "mlflow": "3.17", "device": "cpu", "device_name": "x86_64", "threads": 2},
        "config": cfg.to_dict(config), "arms": arms, "paired": {}, "id": f"{name[:4]}{case_label[:4]}",
    }
    if lrs:
        record["results"] = {"lr_sweep": {"lrs": list(lrs), "reference_lr": config.run.optim.lr, "per_arm": per_arm,
                                          "runs": []}}
    record["paired"] = paired_summary(arms)
    return record


def edited(record: dict, arm: str, figure: str, factor: float = 1.0, add: float = 0.0) -> dict:
    """A copy of ``record`` with ``figure`` of every ``arm`` arm multiplied by ``factor`` plus ``add``."""
    out = copy.deepcopy(record)
    for entry in out["arms"]:
        if entry["arm"] == arm:
            entry["final"][figure] = entry["final"][figure] * factor + add
    out["paired"] = paired_summary(out["arms"])
    return out


def diverged_run(record: dict, arm: str, seed: int, step: int, **final) -> dict:
    """A copy of ``record`` whose run of ``arm`` and ``seed`` diverged at ``step`` (``final``: figures it reports
    beside the divergence)."""
    out = copy.deepcopy(record)
    run = next(a for a in out["arms"] if a["arm"] == arm and a["seed"] == seed)
    run.update(status="diverged", diverged_at_step=step)
    run["final"].update(diverged=True, divergence_step=step, **final)
    out["paired"] = paired_summary(out["arms"])
    return out


def replicate(record: dict, number: int, spread: float = 1e-3) -> dict:
    """``record`` as rounding replicate ``number`` would have it: ``run.replicate = number`` and every
    numeric final figure moved by a relative ``spread`` times a deterministic u in [-1, 1] (replicate, arm,
    seed, figure); flags and counts are left alone."""
    out = copy.deepcopy(record)
    out["config"]["run"]["replicate"] = number
    out["id"] = f"{record.get('id', 'r')}d{number}"
    for entry in out["arms"]:
        for name, value in entry["final"].items():
            if isinstance(value, float) and math.isfinite(value):
                u = random.Random(f"{number}-{entry['arm']}-{entry['seed']}-{name}").uniform(-1, 1)
                entry["final"][name] = value * (1 + spread * u)
    out["paired"] = paired_summary(out["arms"])
    return out


def with_replicates(record: dict, replicates=(1, 2, 3, 4), spread: float = 1e-3) -> list[dict]:
    """The reference record and its replicates: what a replicate baseline is made from."""
    return [record] + [replicate(record, number, spread) for number in replicates]


def as_schema_3(record: dict, **changes) -> dict:
    """``record`` as a schema 3 writer wrote it: the case's name under "stress" and its label under
    "schedule" (``stability.record.upgrade``), then ``changes``."""
    words = {"case": "stress", "case_label": "schedule"}
    return {**{words.get(k, k): v for k, v in record.items()}, "schema_version": 3, **changes}
