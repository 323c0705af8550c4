"""``stability run`` (train the baseline and its treatment arms) and ``stability presets``."""

from __future__ import annotations

import json
import sys

from stability import config as cfg
from stability.cli.options import add_config_options, resolve_from_args
from stability.table import paired_table, quant_table


def progress_printer(total_steps: int, every: int):
    def show(arm, seed, step, figures):
        if step % every == 0 or step == total_steps - 1:
            print(f"  [{arm:8s} seed {seed}] step {step + 1:5d}/{total_steps}  loss {figures['loss']:.4f}  "
                  f"lr {figures['lr']:.2e}  grad-norm {figures['grad_norm']:.3g}", flush=True)
    return show


def cmd_run(args) -> int:
    from stability.experiment import run_pair
    from stability.pipeline import keep
    from stability.record import write_record
    from stability.rundir import ensure_run_dir, new_run_dir
    from stability.stress import cpu_threads

    config = resolve_from_args(args)
    run_dir = new_run_dir(args.out, "run")
    steps = config.run.steps
    arms = ", ".join(f"{name} ({config.arm_config(name, 0).variant})" for name in config.arm_names)
    print(f"stability run: preset {config.preset}, {len(config.seeds)} seed(s) x {len(config.arm_names)} arms "
          f"[{arms}], {steps} steps each, device {config.run.device}", flush=True)
    model, data = config.run.model, config.run.data
    source = f"factory {model.factory}" if model.factory else (
        f"hf ({model.hf_config})" if model.source == "hf" else f"harness ({model.family})")
    print(f"model: {source}, corpus: {data.corpus}{f' (tokenizer {data.tokenizer})' if data.tokenizer else ''}",
          flush=True)
    print(f"run directory: {run_dir}", flush=True)

    def save(record):  # after every arm: a killed run keeps what it measured
        write_record(record, ensure_run_dir(run_dir, "run"))

    with cpu_threads(config.stress.threads):  # the threads of the "standard" stress case: the same figures
        record = run_pair(config, on_arm_done=save,
                          on_step=None if args.quiet else progress_printer(steps, max(1, steps // 10)))
    keep(record, run_dir, args.tracking_uri, args.experiment, track=not args.no_track, plots=False)
    print(f"record: {record['record_path']}")
    tracking = record.get("tracking")
    if tracking and tracking["status"] == "tracked":
        print(f"mlflow: {tracking['uri']} experiment {tracking['experiment']!r} parent run {tracking['parent_run_id']}")
    elif tracking:
        print(f"mlflow: NOT TRACKED ({tracking['error']}); the record above holds everything, send it later with "
              f"`stability upload {record['record_path']}`", file=sys.stderr)
    print()
    print(paired_table(record))
    if quant_table(record):
        print()
        print(quant_table(record))
    if record["status"] == "killed":
        return 130
    return 1 if record["status"] == "error" else 0


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
        print(f"{name:20s} baseline, {', '.join(members)}")
    return 0


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="train the baseline and its treatment arms (--set arms=...) and record them")
    add_config_options(run)
    run.add_argument("--quiet", action="store_true", help="no per-step progress")
    run.add_argument("--quant", metavar="SCHEMES",
                     help=f"post-training quantization schemes to evaluate on every arm: a comma list of "
                          f"{', '.join(cfg.QUANT_SCHEMES)}, or 'all' (sets quant_schemes)")
    run.set_defaults(func=cmd_run)
    presets = sub.add_parser("presets", help="print the named presets")
    presets.set_defaults(func=cmd_presets)
    arms = sub.add_parser("arms", help="print the named arms and arm sets (--set arms=...)")
    arms.set_defaults(func=cmd_arms)
