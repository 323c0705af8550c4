"""The options every training command shares, and turning them into a validated config."""

from __future__ import annotations

import argparse

from stability import config as cfg
from stability.config import extensions
from stability.record.rundir import DEFAULT_ROOT


def parse_sets(items: list[str]) -> dict[str, str]:
    """["model.d_model=96", ...] -> {"model.d_model": "96"}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise cfg.ConfigError(f"--set {item!r} is invalid: expected FIELD=VALUE, e.g. model.d_model=96")
        out[key.strip()] = value.strip()
    return out


def check_device(device: str) -> None:
    """ConfigError naming ``device`` when this machine cannot run it (checked before any training)."""
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise cfg.ConfigError(f"device={device!r} is invalid here: expected 'cpu' (this machine has no CUDA GPU, "
                              f"torch {torch.__version__})")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise cfg.ConfigError(f"device={device!r} is invalid here: expected an index below "
                              f"{torch.cuda.device_count()} (the visible GPUs)")


def config_given(args) -> bool:
    """Whether the command line names a config (a preset, --set or --config), not only --resume."""
    return bool(args.preset or args.set or args.config or getattr(args, "quant", None))


def overrides_of(args) -> dict:
    """The config overrides the command line names: the --config file's, then --set's."""
    overrides = cfg.load_overrides(args.config) if getattr(args, "config", None) else {}
    overrides.update(parse_sets(getattr(args, "set", None) or []))
    return overrides


JUDGING_COMMANDS = ("check", "report", "baseline", "upload")   # read records and baselines; no config of their own


def load_extensions(args) -> None:
    """Import the installed extensions (entry points) and the ``plugins`` the command line names, before the
    command checks any name a registry defines (``stability stress NAME``, ``--quant NAME``). A command that
    judges or reports records (no config of its own) loads the ``plugins`` of the repository's settings in
    the current directory too ([tool.stability]): what a record or a baseline names is never imported. The
    built-in stress cases are registered first (their figures, rows and result types; no torch)."""
    import stability.cases.stress  # noqa: F401  (registering the cases fills the tables every command reads)

    plugins = overrides_of(args).get("plugins") or ()
    if isinstance(plugins, str):
        plugins = [name for name in plugins.split(",") if name.strip()]
    if getattr(args, "command", None) in JUDGING_COMMANDS:
        from pathlib import Path

        from stability.plugin.settings import find_settings

        settings = find_settings(Path.cwd(), getattr(args, "stability_config", None))
        plugins = [*plugins, *((settings.plugins or ()) if settings is not None else ())]
    extensions.load(tuple(plugins))


def resolve_from_args(args) -> cfg.ExperimentConfig:
    """The preset with the file and --set overrides applied, validated, and checked for this machine
    (``check_here``): ConfigError otherwise, before any training."""
    overrides = overrides_of(args)
    quant = getattr(args, "quant", None)
    if quant:  # --quant int8,nf4 or --quant all
        from stability.evaluate.quantize import SCHEMES

        overrides["quant_schemes"] = ",".join(SCHEMES) if quant.strip() == "all" else quant
    config = cfg.resolve(args.preset or "smoke", overrides)
    check_here(config)
    return config


def check_here(config: cfg.ExperimentConfig) -> None:
    """Everything about ``config`` that the config itself cannot know, checked once before any work: the
    names the registries define (training formats, quantization schemes, treatments), a device this machine has and a
    backend that runs on it. ConfigError naming the field, the value and what was expected. Whether this
    installation can train the format (torchao importable, the recipe known, MX blocks fitting the batch)
    is checked once by the case itself, before it reads the corpus (``stability.cases.experiment.load_inputs``)."""
    from stability import precision
    from stability.evaluate.quantize import check_schemes
    from stability.model.treatments import check_treatments

    extensions.load(config.plugins)   # a resumed run's config names them too
    check_schemes(config.quant_schemes)
    for arm in config.arm_names:
        check_treatments(config.arm_config(arm, 0).model.treatments, f"arms.{arm}.treatments")
    precision.check_formats(config.stress.precisions, "stress.precisions")
    check_device(config.run.device)
    check_backend(config.run.model.backend, config.run.device)


def check_backend(backend: str, device: str) -> None:
    """ConfigError when the Triton backend is asked for on the CPU outside the Triton interpreter."""
    import os

    if backend == "triton" and not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
        raise cfg.ConfigError(f"model.backend='triton' is invalid with device={device!r}: expected "
                              f"model.backend='torch' on the CPU (the Triton kernel runs on CUDA; TRITON_INTERPRET=1 "
                              f"runs it in the slow interpreter)")
def resolve_session(args, label: str):
    """(config, run directory, Resume or None) of a training command: a fresh run, an explicit
    ``--resume TARGET``, or the interrupted run of the same command and config found under ``--out``
    (unless ``--fresh``). Every check (config, resume target, checkpoints, a writable checkpoint
    directory) happens here, before anything is written."""
    from stability.record import RecordError
    from stability.record.rundir import new_run_dir
    from stability.session.session import Resume, find_interrupted
    from stability.train.checkpoint import check_writable, untrusted_factory

    resume = None
    if args.resume:
        resume = Resume.load(args.resume, args.checkpoint_dir)
        if resume.label != label:
            raise RecordError(f"resume target {args.resume!r} was written by `stability {resume.label}`: resume "
                              f"it with that command")
        if config_given(args):
            config = resolve_from_args(args)
        else:
            config = resume.config
            if config.run.model.factory and not args.trust_factory:
                raise RecordError(untrusted_factory(f"resume target {args.resume!r}", config.run.model.factory))
            absent = cfg.extensions.not_loaded(config.plugins)
            if absent:   # a record names them: never imported from there
                raise RecordError(f"resume target {args.resume!r} was made with the extension(s) {', '.join(absent)}, "
                                  f"which this process has not loaded: install them (an entry point) or name them "
                                  f"with --set plugins={','.join(absent)}")
            check_here(config)
        resume.check_config(config)
        if not resume.unfinished():
            raise RecordError(f"resume target {args.resume!r} has nothing left to train (its records are "
                              f"{sorted({r.get('status') for r in resume.records})}): expected an interrupted run")
    else:
        config = resolve_from_args(args)
        found = None if args.fresh else find_interrupted(args.out, label, config)
        if found is not None:
            resume = Resume.load(found, args.checkpoint_dir)
    run_dir = resume.run_dir if resume else new_run_dir(args.out, label)
    checkpoint_dir = resume.checkpoint_dir if resume else (args.checkpoint_dir or run_dir / "checkpoints")
    if args.checkpoint_dir:
        check_writable(args.checkpoint_dir)
    if resume:
        check_writable(checkpoint_dir)
        resume.check_checkpoints()
    return config, run_dir, resume, checkpoint_dir


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """The options every training command shares: preset, overrides, records, tracking and resuming."""
    parser.add_argument("--preset", default=None, help=f"one of {tuple(cfg.PRESETS)} (default smoke)")
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE",
                        help="override a config field (repeatable)")
    parser.add_argument("--config", help="JSON or TOML file of overrides")
    parser.add_argument("--tracking-uri",
                        help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    parser.add_argument("--experiment", help="MLflow experiment name (default stability-<preset>)")
    parser.add_argument("--out", default=str(DEFAULT_ROOT),
                        help=f"root of the run directories (default {DEFAULT_ROOT}); each command writes into a "
                             f"new <time>-<command>-<id>/ below it")
    parser.add_argument("--no-track", action="store_true", help="write the JSON records only")
    parser.add_argument("--no-live", action="store_true",
                        help="send to MLflow only when a case ends, not step by step while it trains")
    parser.add_argument("--resume", metavar="RUN_DIR_OR_RECORD",
                        help="continue an interrupted run (its run directory or a record in it) from its "
                             "checkpoints; the same command run again continues its newest interrupted run too")
    parser.add_argument("--fresh", action="store_true",
                        help="start a new run even when an interrupted run of the same command and config exists")
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="where the arms' checkpoints go (default <run dir>/checkpoints)")
    parser.add_argument("--trust-factory", action="store_true",
                        help="with --resume: import the model.factory the interrupted run's record names (runs that "
                             "module's code; off: refused unless --set model.factory names the same)")
