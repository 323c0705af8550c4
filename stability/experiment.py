"""Paired experiments: a baseline and a gated arm per seed, same data order, same shared init.

Both arms of a seed read identical batches (the batch at step k depends only on the
corpus, the seed and k) and start from identical values in every shared parameter
(``GatedLM`` initialises by parameter name), so they differ only by the gate.
``run_pair`` returns the pair record that crosses to tracking, regression and report.

``train_arm`` is how every case (this pair and the stress cases) trains one run: with a
``session`` (``stability.session``) the case record is on disk after every run, each step is
in a per-step file, checkpoints and replay bundles are kept, and a resumed case takes its
finished runs from disk. On Ctrl-C the case stops as a whole: ``Interrupted`` carries the
case record so far (the killed arm included) up to the command.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from stability import config as cfg
from stability.data import load_corpus
from stability.record import case_timing, finish_status, new_case_record, paired_summary
from stability.trainer import train

ARMS = ("baseline", "gated")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a case; ``record`` is its case record so far (status "killed")."""

    def __init__(self, record: dict):
        super().__init__("interrupted (Ctrl-C)")
        self.record = record


def train_arm(case_record: dict, config: cfg.ExperimentConfig, run: cfg.RunConfig, schedule, corpus, arm: str,
              session=None, on_step=None) -> dict:
    """Train one run of a case (or, in a resumed case, take the finished run from disk) and return its
    arm record; the ``session`` keeps the case record on disk after it. A killed run ends the case:
    it joins ``case_record["arms"]`` and ``Interrupted`` is raised."""
    hooks = session.arm_hooks(case_record, run, schedule, arm) if session is not None else None
    if isinstance(hooks, dict):  # finished before the case was interrupted
        arm_record = hooks
    else:
        arm_record = train(run, schedule, corpus=corpus, arm=arm, on_step=on_step,
                           on_trained=quantization_hook(run, config.quant_schemes), hooks=hooks)
    if session is not None:
        session.arm_done(case_record, arm_record)
    if arm_record["status"] == "killed":
        case_record["arms"].append(arm_record)
        case_record["paired"] = paired_summary(case_record["arms"])
        case_record["status"] = "killed"
        case_record["timing"] = case_timing([a["timing"] for a in case_record["arms"]],
                                            sum(a["timing"].get("wall_seconds", 0.0) for a in case_record["arms"]))
        if session is not None:
            session.arm_done(case_record, None)
        raise Interrupted(case_record)
    return arm_record


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
             on_step=None, description: str = "", purpose: str = "regression", session=None) -> dict:
    """Train every (seed, arm) of ``config`` and return the pair record.

    ``on_arm_done(record)`` is called after each arm. ``session``: see ``train_arm``. Ctrl-C ends
    the arm in flight as "killed" and raises ``Interrupted`` with the record so far."""
    from stability.schedules import Standard

    schedule = schedule or Standard()
    started = time.perf_counter()
    record = new_case_record(config, schedule.name, description or schedule.describe(), stress="pair",
                             purpose=purpose)
    corpus = load_corpus(config.run.data, config.run.model.vocab_size, config.run.model.context)
    for seed in config.seeds:
        for arm in ARMS:
            run = config.arm_config(arm, seed)
            step_cb = (lambda step, figures, arm=arm, seed=seed: on_step(arm, seed, step, figures)) if on_step \
                else None
            arm_record = train_arm(record, config, run, schedule, corpus, arm, session, on_step=step_cb)
            record["arms"].append(arm_record)
            record["paired"] = paired_summary(record["arms"])
            if on_arm_done:
                on_arm_done(record)
    record["status"] = finish_status(record)
    record["timing"] = case_timing([a["timing"] for a in record["arms"]], time.perf_counter() - started)
    return record
