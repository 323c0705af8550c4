"""``stability run`` (train the baseline and its treatment arms: the stress case "standard", through the same
path as ``stability stress standard``, with its own messages and tables) and ``stability presets``."""

from __future__ import annotations

import json
import sys

from stability import config as cfg
from stability.cli.options import add_config_options, resolve_from_args, resolve_session
from stability.record import STANDARD as PLAIN_PAIR  # the case `stability run` trains: the plain pair
from stability.record import Status
from stability.report.tables import paired_table, quant_table


def make_session(args, label: str, run_dir, checkpoint_dir, resume):
    """The session of a training command: records, per-step files and checkpoints in the run directory,
    live MLflow tracking unless --no-track / --no-live, progress lines unless --quiet."""
    from stability.session.session import Session

    tracker = None
    if not args.no_track and not args.no_live:
        from stability.track.live import LiveTracker

        tracker = LiveTracker(args.tracking_uri, args.experiment)
    return Session(run_dir, label=label, tracker=tracker, checkpoint_dir=checkpoint_dir,
                   progress=not getattr(args, "quiet", False), resume=resume, lock=True)


def print_tracking(record: dict) -> None:
    """Where the record went in MLflow, or (once per store) why it did not."""
    from stability.track.runs import report_failure, runs_url, ui_address

    tracking = record.get("tracking")
    if tracking and tracking["status"] == "tracked":
        print(f"mlflow: {tracking['uri']} experiment {tracking['experiment']!r} parent run "
              f"{tracking['parent_run_id']}; in `mlflow ui`: "
              f"{runs_url(ui_address(tracking['uri']), tracking['experiment_id'])}")
    elif tracking:
        report_failure(tracking, record.get("record_path"))


def cmd_run(args) -> int:
    from stability.train import distributed

    if distributed.launched() > 1:   # started by torchrun: one arm across the processes
        from stability.cases.stress import run_case
        from stability.cases.torchrun import under_torchrun

        return under_torchrun(resolve_from_args(args), args.out, "run",
                              lambda config, run_dir: train_and_keep(args, config, run_dir, None, None),
                              lambda config: run_case(PLAIN_PAIR, config), resume=args.resume)
    config, run_dir, resume, checkpoint_dir = resolve_session(args, "run")
    return train_and_keep(args, config, run_dir, resume, checkpoint_dir)


def train_and_keep(args, config, run_dir, resume, checkpoint_dir) -> int:
    """Train the arms of ``config`` (the stress case "standard", as ``stability stress standard``) in a session
    on ``run_dir``, keep the record, print the tables."""
    from stability.cases.experiment import Interrupted
    from stability.cases.pipeline import run_recorded

    steps = config.run.steps
    arms = ", ".join(f"{name} ({config.arm_config(name, 0).variant})" for name in config.arm_names)
    print(f"stability run: preset {config.preset}, {len(config.seeds)} seed(s) x {len(config.arm_names)} arms "
          f"[{arms}], {steps} steps each, device {config.run.device}", flush=True)
    model, data = config.run.model, config.run.data
    source = {"factory": f"factory {model.factory}", "hf": f"hf ({model.hf_config})",
              "harness": f"harness ({model.family})"}[model.kind]
    print(f"model: {source}, corpus: {data.corpus}{f' (tokenizer {data.tokenizer})' if data.tokenizer else ''}",
          flush=True)
    print(f"run directory: {run_dir}" + (" (continuing an interrupted run; --fresh starts a new one)"
                                          if resume else ""), flush=True)
    session = make_session(args, "run", run_dir, checkpoint_dir, resume)
    try:
        record = run_recorded(PLAIN_PAIR, config, run_dir, args.tracking_uri, args.experiment,
                              track=not args.no_track, plots=False, session=session)
    except Interrupted as stop:
        print(f"interrupted: the record so far is {stop.record['record_path']}; continue with "
              f"`stability run --resume {run_dir}`", file=sys.stderr)
        print_tracking(stop.record)
        raise
    finally:
        session.close()
    print(f"record: {record['record_path']}")
    print_tracking(record)
    print()
    print(paired_table(record))
    if quant_table(record):
        print()
        print(quant_table(record))
    return 1 if record["status"] == Status.ERROR else 0


def cmd_presets(args) -> int:
    for name in cfg.PRESETS:
        print(f"--- {name}")
        print(json.dumps(cfg.to_dict(cfg.preset(name)), indent=1))
    return 0


def cmd_arms(args) -> int:
    """The named arms (``--set arms=NAME,...``) and the named sets of them."""
    base = cfg.resolve("smoke").run
    for name, arm in cfg.NAMED_ARMS.items():
        print(f"{name:20s} {arm.apply(base).variant}")
    print()
    for name, members in cfg.ARM_SETS.items():
        print(f"{name:20s} {cfg.REFERENCE_ARM}, {', '.join(members)}")
    return 0


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="train the reference arm and the treatment arms (--set arms=...) and record them")
    add_config_options(run)
    run.add_argument("--quiet", action="store_true", help="no per-step progress")
    run.add_argument("--quant", metavar="SCHEMES",
                     help="post-training quantization schemes to evaluate on every arm: a comma list of names "
                          "(int8, nf4, w8a8-token, torchao-int8wo ...: stability.evaluate.quantize.SCHEMES, "
                          "docs/quantization.md), or 'all' (sets quant_schemes; the harness's own plain pair is quantized with "
                          "every scheme when none is named)")
    run.set_defaults(func=cmd_run)
    presets = sub.add_parser("presets", help="print the named presets")
    presets.set_defaults(func=cmd_presets)
    arms = sub.add_parser("arms", help="print the named arms and arm sets (--set arms=...)")
    arms.set_defaults(func=cmd_arms)
