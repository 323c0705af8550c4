"""Paired experiments: a baseline and a gated arm per seed, same data order, same shared init.

Both arms of a seed read identical batches (the batch at step k depends only on the
corpus, the seed and k) and start from identical values in every shared parameter
(``GatedLM`` initialises by parameter name), so they differ only by the gate.
``run_pair`` returns the pair record that crosses to tracking, regression and report.
"""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from collections.abc import Callable

import torch

from stability import config as cfg
from stability.data import load_corpus
from stability.stats import paired_difference
from stability.trainer import train

SCHEMA_VERSION = 1
ARMS = ("baseline", "gated")

# Summary figures compared between arms; "better" says which direction is an improvement.
FIGURES = {
    "heldout_loss": "lower", "perplexity": "lower", "accuracy": "higher", "final_train_loss": "lower",
    "loss_spike_score": "lower", "grad_spike_score": "lower", "nonfinite_events": "lower",
    "max_grad_norm": "lower", "m_act_mean": "lower", "m_act_max": "lower", "f_attn_mean": "lower",
    "sink_rate_mean": "lower", "max_attn_logit": "lower", "logit_max": "lower",
    "overflow_fraction": "lower", "underflow_fraction": "lower",
}


def git_info() -> dict:
    """Commit, branch and dirty flag of the working directory (None where git is unavailable)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": None if status is None else bool(status)}


def env_info(device: str) -> dict:
    """Versions and device name, for the record and the MLflow tags."""
    def version(module):
        # the installed distribution's version, read from its metadata: importing bitsandbytes,
        # mlflow and triton only to read __version__ costs seconds per process
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version

        try:
            return dist_version(module)
        except PackageNotFoundError:  # not installed: say so rather than fail
            return None
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") \
        and torch.cuda.is_available() else platform.processor() or platform.machine()
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": version("triton"),
            "bitsandbytes": version("bitsandbytes"), "mlflow": version("mlflow"), "device": device,
            "device_name": name, "threads": torch.get_num_threads()}


def new_record(config: cfg.ExperimentConfig, schedule_name: str, description: str = "") -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "name": config.name, "preset": config.preset, "schedule": schedule_name, "description": description,
        "status": "running", "git": git_info(), "env": env_info(config.run.device),
        "config": cfg.to_dict(config), "arms": [], "paired": {},
    }


def paired_summary(arms: list[dict], figures=FIGURES) -> dict:
    """Per figure: baseline and gated means, mean difference, 95% interval and p-value over seeds."""
    by_seed = {}
    for arm in arms:
        by_seed.setdefault(arm["seed"], {})[arm["arm"]] = arm["final"]
    complete = [s for s in sorted(by_seed) if all(a in by_seed[s] for a in ARMS)]
    figures = dict(figures)  # plus the post-quantization damages the arms carry (stability.quantize)
    quant = ("_damage_loss", "_damage_accuracy", "_kl")
    for final in (arm["final"] for arm in arms):
        figures.update({k: "higher" if k.endswith("_damage_accuracy") else "lower" for k in final
                        if k.startswith("quant_") and k.endswith(quant)})
    out = {}
    for figure, better in figures.items():
        baseline = [by_seed[s]["baseline"].get(figure) for s in complete]
        gated = [by_seed[s]["gated"].get(figure) for s in complete]
        if all(v is None for v in baseline + gated):
            continue
        out[figure] = {**paired_difference(baseline, gated), "better": better, "seeds": complete}
    return out


def quantization_hook(run: cfg.RunConfig, schemes: tuple[str, ...]):
    """After training, evaluate the model under each post-training quantization scheme
    and store the result in the arm record's "quant" entry (None when no scheme is asked)."""
    if not schemes:
        return None

    def evaluate_quantized(model, corpus, record):
        from stability.quantize import evaluate_schemes, quant_figures

        record["quant"] = evaluate_schemes(model, corpus, run, schemes)
        record["final"].update(quant_figures(record["quant"]))  # quant_<scheme>_damage_* in the paired table
    return evaluate_quantized


def run_pair(config: cfg.ExperimentConfig, schedule=None, on_arm_done: Callable[[dict], None] | None = None,
             on_step=None, description: str = "") -> dict:
    """Train every (seed, arm) of ``config`` and return the pair record.

    ``on_arm_done(record)`` is called after each arm (the CLI writes the JSON there, so a
    killed run keeps what it measured). Ctrl-C ends the arm in flight as "killed" and
    skips the rest; the record says so in ``status``."""
    from stability.schedules import Standard

    schedule = schedule or Standard()
    record = new_record(config, schedule.name, description or schedule.describe())
    corpus = load_corpus(config.run.data, config.run.model.vocab_size, config.run.model.context)
    for seed in config.seeds:
        for arm in ARMS:
            run = config.arm_config(arm, seed)
            step_cb = (lambda step, figures, arm=arm, seed=seed: on_step(arm, seed, step, figures)) if on_step \
                else None
            arm_record = train(run, schedule, corpus=corpus, arm=arm, on_step=step_cb,
                               on_trained=quantization_hook(run, config.quant_schemes))
            record["arms"].append(arm_record)
            record["paired"] = paired_summary(record["arms"])
            if on_arm_done:
                on_arm_done(record)
            if arm_record["status"] == "killed":
                record["status"] = "killed"
                return record
    record["status"] = "error" if any(a["status"] == "error" for a in record["arms"]) else "completed"
    return record
