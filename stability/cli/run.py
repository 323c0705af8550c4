"""``stability run`` (train a baseline/gated pair) and ``stability presets``."""

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

    config = resolve_from_args(args)
    run_dir = new_run_dir(args.out, "run")
    steps = config.run.steps
    print(f"stability run: preset {config.preset}, {len(config.seeds)} seed(s) x 2 arms "
          f"({config.baseline_gate.label} vs {config.gated_gate.label}), {steps} steps each, "
          f"device {config.run.device}", flush=True)
    model, data = config.run.model, config.run.data
    source = f"factory {model.factory}" if model.factory else (
        f"hf ({model.hf_config})" if model.source == "hf" else f"harness ({model.family})")
    print(f"model: {source}, corpus: {data.corpus}{f' (tokenizer {data.tokenizer})' if data.tokenizer else ''}",
          flush=True)
    print(f"run directory: {run_dir}", flush=True)

    def save(record):  # after every arm: a killed run keeps what it measured
        write_record(record, ensure_run_dir(run_dir, "run"))

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


def add_parsers(sub) -> None:
    run = sub.add_parser("run", help="train a baseline/gated pair and record it")
    add_config_options(run)
    run.add_argument("--quiet", action="store_true", help="no per-step progress")
    run.add_argument("--quant", metavar="SCHEMES",
                     help=f"post-training quantization schemes to evaluate on both arms: a comma list of "
                          f"{', '.join(cfg.QUANT_SCHEMES)}, or 'all' (sets quant_schemes)")
    run.set_defaults(func=cmd_run)
    presets = sub.add_parser("presets", help="print the named presets")
    presets.set_defaults(func=cmd_presets)
