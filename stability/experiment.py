"""Paired experiments: every arm (baseline first) per seed, same data order, same shared init.

All arms of a seed read identical batches (the batch at step k depends only on the corpus, the
seed and k) and start from identical values in every parameter they share
(``stability.models.build_model`` initialises by parameter name), so they differ only by what their
``ArmConfig`` changes: the gate, QK-norm, z-loss, soft-capping. ``run_pair`` returns the record that
crosses to tracking, regression and report; ``record["paired"]`` compares each treatment arm with the
baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stability import config as cfg
from stability.data import load_corpus
from stability.record import case_timing, finish_status, new_case_record, paired_summary
from stability.trainer import train


def load_inputs(config: cfg.ExperimentConfig):
    """The corpus of ``config``, after checking that it holds the longest extrapolation length and that
    each arm's model can be built and run: a model the harness did not write (HF, factory) is built
    once per arm here, so bad input is a ConfigError before any training."""
    from stability.extrapolation import check_corpus
    from stability.models import check_models

    run = config.run
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    check_corpus(corpus, config)  # long enough for the longest extrapolation length
    if run.model.source != "harness" or run.model.factory:
        check_models([config.arm_config(arm, config.seeds[0]).model for arm in config.arm_names], config.seeds[0],
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


def extrapolation_hook(run: cfg.RunConfig, extrapolation: cfg.ExtrapolationConfig):
    """After training, read the model at the lengths of ``extrapolation`` and store the points in the arm
    record's "extrapolation" entry and the ``extrap_*`` figures in its final (None when off)."""
    if not extrapolation.enabled:
        return None

    def evaluate_extrapolation(model, corpus, record):
        from stability.extrapolation import evaluate_lengths, extrapolation_figures

        record["extrapolation"] = evaluate_lengths(model, corpus, run, extrapolation)
        record["final"].update(extrapolation_figures(record["extrapolation"]))
    return evaluate_extrapolation


def after_training(run: cfg.RunConfig, config: cfg.ExperimentConfig):
    """The evaluations of a trained arm the experiment asks for (quantization, extrapolation), as one
    ``on_trained(model, corpus, record)`` callable for the trainer; None when there are none."""
    hooks = [hook for hook in (quantization_hook(run, config.quant_schemes),
                               extrapolation_hook(run, config.extrapolation)) if hook is not None]
    if not hooks:
        return None

    def run_all(model, corpus, record):
        for hook in hooks:
            hook(model, corpus, record)
    return run_all


def run_pair(config: cfg.ExperimentConfig, schedule=None, on_arm_done: Callable[[dict], None] | None = None,
             on_step=None, description: str = "", purpose: str = "regression") -> dict:
    """Train every (seed, arm) of ``config``, seed by seed, and return the pair record.

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
        for arm in config.arm_names:
            run = config.arm_config(arm, seed)
            step_cb = (lambda step, figures, arm=arm, seed=seed: on_step(arm, seed, step, figures)) if on_step \
                else None
            arm_record = train(run, schedule, corpus=corpus, arm=arm, on_step=step_cb,
                               on_trained=after_training(run, config))
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
