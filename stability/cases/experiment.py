"""Paired experiments: every arm (the reference arm first) per seed, same data order, same shared init.

All arms of a seed read identical batches (the batch at step k depends only on the corpus, the
seed and k) and start from identical values in every parameter they share
(``stability.model.build.build_model`` initialises by parameter name), so they differ only by what their
``ArmConfig`` changes: the gate, QK-norm, z-loss, soft-capping. A case's record (the plain pair's:
``stability.cases.standard.run_pair``) crosses to tracking, regression and report; ``record["paired"]``
compares each treatment arm with the reference arm.

``train_units`` is how every case trains its runs: it yields the arm
record of each ``stability.cases.runs.Unit`` in the order of the case's list, trained here one after the
other by ``train_arm`` or, with a ``runner``, elsewhere (``stability.cases.ray_runner.RayRunner``: one Ray
task per unit), so a case reads the same records either way.

``train_arm`` trains one run here with the run's ``ArmHooks``: the evaluations after training the
config asks for (``after_training``: quantization, length extrapolation) and, with a ``session``
(``stability.session.session``), its callbacks: the case record is on disk after every run, each step
is in a per-step file, checkpoints and replay bundles are kept, and a resumed case takes its
finished runs from disk. On Ctrl-C the case stops as a whole: ``Interrupted`` carries the
case record so far (the killed arm included) up to the command; under torchrun an arm that ended
in an error (a lost process) stops the case the same way.
"""

from __future__ import annotations

import dataclasses

from stability import config as cfg
from stability import precision
from stability.cases.runs import Unit, check_unique
from stability.data import load_corpus
from stability.record import (
    Status,
    set_extrapolation,
    set_quant,
    stop_case,
)
from stability.train import distributed
from stability.train.trainer import ArmHooks, train


def load_inputs(config: cfg.ExperimentConfig):
    """The corpus of ``config``, after checking that each arm's precision can train here (torchao
    importable, the recipe known, MX blocks fitting the batch), that the corpus holds the longest
    extrapolation length and that each arm's model can be built and run: a model the harness did not
    write (HF, factory) is built once per arm here, so bad input is a ConfigError before any training."""
    from stability.evaluate.extrapolation import check_corpus

    run = config.run   # the arms share the run's precision: one check, before the corpus is read
    precision.check(run.precision, run.device, run.data.batch_size * run.model.context)
    corpus = load_corpus(run.data, run.model.vocab_size, run.model.context)
    check_corpus(corpus, config)  # long enough for the longest extrapolation length
    check_arm_models(config)
    return corpus


def check_arm_models(config: cfg.ExperimentConfig, suites: bool = False) -> list[dict]:
    """Build and run each arm's model once when it is not the harness's own (``stability.model.contract``;
    ``suites``: the stress suites' stricter contract, observer calls and gate settings included): a
    ConfigError naming the problem, before anything trains. Returns what was found per arm ([] for the
    harness's own model)."""
    from stability.model.contract import check_models

    run = config.run
    if run.model.kind == "harness":
        return []
    return check_models([config.arm_config(arm, config.seeds[0]).model for arm in config.arm_names],
                        config.seeds[0], run.model.vocab_size, run.model.context, suites=suites)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a case; ``record`` is its case record so far (status "killed")."""

    def __init__(self, record: dict):
        super().__init__("interrupted (Ctrl-C)")
        self.record = record


def train_arm(case_record: dict, config: cfg.ExperimentConfig, unit: Unit, corpus, session=None) -> dict:
    """Train one run of a case (a ``Unit``; or, in a resumed case, take the finished run from disk) and return
    its arm record; the ``session`` keeps the case record on disk after it. A killed run ends the case:
    it joins ``case_record["arms"]`` and ``Interrupted`` is raised."""
    hooks = session.arm_hooks(case_record, unit) if session is not None else ArmHooks()
    if isinstance(hooks, dict):  # finished before the case was interrupted
        arm_record = hooks
    else:
        hooks = dataclasses.replace(hooks, on_trained=after_training(unit.run, config))
        arm_record = train(unit.run, unit.schedule, corpus=corpus, arm=unit.arm, hooks=hooks)
    if session is not None:
        session.arm_done(case_record, arm_record)
    if arm_record["status"] == Status.KILLED or (arm_record["status"] == Status.ERROR
                                                  and distributed.current() is not None):
        # under torchrun an error (a lost process above all) ends the job: the others cannot go on alone
        stop_case(case_record, arm_record)
        if session is not None:
            session.arm_done(case_record, None)
        raise Interrupted(case_record)
    return arm_record


def train_units(case_record: dict, config: cfg.ExperimentConfig, units: list[Unit], corpus, session=None,
                runner=None):
    """Yield the arm record of each of ``units``, in their order. Without a ``runner``, each is trained
    here when the case asks for it (``train_arm``); with one, ``runner.train(case_record, config, units)``
    trains them (in parallel, elsewhere: no per-step callbacks) and the ``session`` notes each record as
    it comes back."""
    check_unique(units)
    if session is not None:
        session.case_units(case_record, units)
    if runner is None:
        for unit in units:
            yield train_arm(case_record, config, unit, corpus, session)
        return
    for arm_record in runner.train(case_record, config, units):
        if session is not None:
            session.arm_done(case_record, arm_record)
        yield arm_record


def quantization_hook(run: cfg.RunConfig, schemes: tuple[str, ...]):
    """After training, evaluate the model under each post-training quantization scheme
    and store the result in the arm record's "quant" entry (None when no scheme is asked)."""
    if not schemes:
        return None
    from stability.evaluate.quantize import check_schemes, evaluate_schemes, quant_figures

    check_schemes(schemes)  # a name no scheme is registered under: ConfigError before the arm trains

    def evaluate_quantized(model, corpus, record):
        quant = evaluate_schemes(model, corpus, run, schemes)
        set_quant(record, quant, quant_figures(quant))  # quant_<scheme>_damage_* in the paired table
    return evaluate_quantized


def extrapolation_hook(run: cfg.RunConfig, extrapolation: cfg.ExtrapolationConfig):
    """After training, read the model at the lengths of ``extrapolation`` and store the points in the arm
    record's "extrapolation" entry and the ``extrap_*`` figures in its final (None when off)."""
    if not extrapolation.enabled:
        return None

    def evaluate_extrapolation(model, corpus, record):
        from stability.evaluate.extrapolation import evaluate_lengths, extrapolation_figures

        result = evaluate_lengths(model, corpus, run, extrapolation)
        set_extrapolation(record, result, extrapolation_figures(result))
    return evaluate_extrapolation


def after_training(run: cfg.RunConfig, config: cfg.ExperimentConfig):
    """The evaluations of a trained arm the experiment asks for (quantization, extrapolation), as one
    ``ArmHooks.on_trained(model, corpus, record)`` callable; None when there are none."""
    hooks = [hook for hook in (quantization_hook(run, config.quant_schemes),
                               extrapolation_hook(run, config.extrapolation)) if hook is not None]
    if not hooks:
        return None

    def run_all(model, corpus, record):
        for hook in hooks:
            hook(model, corpus, record)
    return run_all
