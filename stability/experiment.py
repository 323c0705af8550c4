"""Paired experiments: a baseline and a gated arm per seed, same data order, same shared init.

Both arms of a seed read identical batches (the batch at step k depends only on the
corpus, the seed and k) and start from identical values in every shared parameter
(``stability.models.build_model``), so they differ only by the gate.
``run_pair`` returns the pair record that crosses to tracking, regression and report.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stability import config as cfg
from stability.data import load_corpus
from stability.record import case_timing, finish_status, new_case_record, paired_summary
from stability.trainer import train

ARMS = ("baseline", "gated")


def load_inputs(config: cfg.ExperimentConfig):
    """The corpus of ``config``, after checking that each arm's model can be built and run: a model
    the harness did not write (HF, factory) is built once per arm here, so bad input is a ConfigError
    before any training."""
    from stability.models import check_models

    run = config.run
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    if run.model.source != "harness" or run.model.factory:
        check_models([config.arm_config(arm, config.seeds[0]).model for arm in ARMS], config.seeds[0],
                     run.model.vocab_size, run.model.context)
    return corpus


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
             on_step=None, description: str = "", purpose: str = "regression") -> dict:
    """Train every (seed, arm) of ``config`` and return the pair record.

    ``on_arm_done(record)`` is called after each arm (the CLI writes the JSON there, so a
    killed run keeps what it measured). Ctrl-C ends the arm in flight as "killed" and
    skips the rest; the record says so in ``status``."""
    from stability.schedules import Standard

    schedule = schedule or Standard()
    started = time.perf_counter()
    record = new_case_record(config, schedule.name, description or schedule.describe(), stress="pair",
                             purpose=purpose)
    corpus = load_inputs(config)
    record["corpus"] = corpus.info
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
                record["timing"] = case_timing([a["timing"] for a in record["arms"]], time.perf_counter() - started)
                return record
    record["status"] = finish_status(record)
    record["timing"] = case_timing([a["timing"] for a in record["arms"]], time.perf_counter() - started)
    return record
