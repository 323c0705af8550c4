"""The ``stability`` command.

    stability run --preset smoke [--set model.d_model=96 ...] [--config overrides.toml]
                  [--tracking-uri URI] [--experiment NAME] [--out reports/runs] [--no-track]
    stability presets

``run`` trains a baseline/gated pair, shows progress, writes the JSON record under
``reports/runs/`` after every arm, then logs it to MLflow and prints a summary table.
Exit codes: 0 done, 1 an arm failed with an error, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stability import config as cfg
from stability.table import fmt, text_table


def parse_sets(items: list[str]) -> dict[str, str]:
    """["model.d_model=96", ...] -> {"model.d_model": "96"}."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise cfg.ConfigError(f"--set {item!r} is invalid: expected FIELD=VALUE, e.g. model.d_model=96")
        out[key.strip()] = value.strip()
    return out


def resolve_from_args(args) -> cfg.ExperimentConfig:
    overrides = cfg.load_overrides(args.config) if args.config else {}
    overrides.update(parse_sets(args.set or []))
    quant = getattr(args, "quant", None)
    if quant:  # --quant int8,nf4 or --quant all
        overrides["quant_schemes"] = ",".join(cfg.QUANT_SCHEMES) if quant.strip() == "all" else quant
    return cfg.resolve(args.preset, overrides)


def summary_table(record: dict) -> str:
    """Per figure: baseline mean, gated mean, difference and 95% interval over seeds."""
    rows = [("figure", "baseline", "gated", "gated-baseline", "95% CI", "p", "n")]
    for figure, s in record.get("paired", {}).items():
        ci = f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" if s["ci_low"] is not None else "-"
        rows.append((figure, fmt(s["baseline"]), fmt(s["gated"]), fmt(s["difference"]), ci,
                     fmt(s["p_value"]), str(s["n"])))
    status = [f"{a['arm']}/seed{a['seed']}: {a['status']}" + (
        f" at step {a['diverged_at_step']}" if a["diverged_at_step"] is not None else "") for a in record["arms"]]
    return "\n".join([text_table(rows), "", "arms: " + ", ".join(status)])


def quant_table(record: dict) -> str:
    """Post-training quantization: per scheme, each arm's damage (quantized minus full precision,
    mean over seeds) in held-out loss and accuracy, the paired gated-baseline difference of the
    loss damage, and each arm's KL(full || quantized) on the probe batch. Empty when no scheme ran."""
    schemes = list(dict.fromkeys(scheme for a in record["arms"]
                                 for scheme in ((a.get("quant") or {}).get("schemes") or {})))
    if not schemes:
        return ""
    paired = record.get("paired", {})
    rows = [("quant scheme", "baseline dmg loss", "gated dmg loss", "gated-baseline", "95% CI",
             "baseline dmg acc", "gated dmg acc", "baseline KL", "gated KL")]
    skipped = []
    for scheme in schemes:
        loss, acc, kl = (paired.get(f"quant_{scheme}_{figure}")
                         for figure in ("damage_loss", "damage_accuracy", "kl"))
        if loss is None:
            reasons = {a["quant"]["schemes"][scheme].get("skipped") for a in record["arms"]
                       if scheme in ((a.get("quant") or {}).get("schemes") or {})}
            skipped.append(f"{scheme}: skipped ({'; '.join(sorted(r for r in reasons if r))})")
            continue
        ci = f"[{fmt(loss['ci_low'])}, {fmt(loss['ci_high'])}]" if loss["ci_low"] is not None else "-"
        rows.append((scheme, fmt(loss["baseline"]), fmt(loss["gated"]), fmt(loss["difference"]), ci,
                     fmt(acc["baseline"] if acc else None), fmt(acc["gated"] if acc else None),
                     fmt(kl["baseline"] if kl else None), fmt(kl["gated"] if kl else None)))
    return "\n".join([text_table(rows)] + skipped)


def progress_printer(total_steps: int, every: int):
    def show(arm, seed, step, figures):
        if step % every == 0 or step == total_steps - 1:
            print(f"  [{arm:8s} seed {seed}] step {step + 1:5d}/{total_steps}  loss {figures['loss']:.4f}  "
                  f"lr {figures['lr']:.2e}  grad-norm {figures['grad_norm']:.3g}", flush=True)
    return show


def cmd_run(args) -> int:
    from stability.experiment import run_pair
    from stability.tracking import log_to_mlflow, write_record

    config = resolve_from_args(args)
    out_dir = Path(args.out)
    written: list[Path] = []

    def save(record):
        written[:] = [write_record(record, out_dir)]

    steps = config.run.steps
    print(f"stability run: preset {config.preset}, {len(config.seeds)} seed(s) x 2 arms "
          f"({config.baseline_gate.label} vs {config.gated_gate.label}), {steps} steps each, "
          f"device {config.run.device}", flush=True)
    record = run_pair(config, on_arm_done=save,
                      on_step=None if args.quiet else progress_printer(steps, max(1, steps // 10)))
    save(record)
    print(f"record: {written[0]}")
    if not args.no_track:
        tracking = log_to_mlflow(record, args.tracking_uri, args.experiment, artifacts=written)
        record["tracking"] = tracking
        save(record)
        if tracking["status"] == "tracked":
            print(f"mlflow: {tracking['uri']} experiment {tracking['experiment']!r} "
                  f"parent run {tracking['parent_run_id']}")
        else:
            print(f"mlflow: NOT TRACKED ({tracking['error']}); the record above holds everything, "
                  f"send it later with `stability upload {written[0]}`", file=sys.stderr)
    print()
    print(summary_table(record))
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


def cmd_upload(args) -> int:
    from stability.tracking import log_to_mlflow, read_record

    failed = 0
    for path in args.records:
        try:
            record = read_record(path)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            failed = 2
            continue
        tracking = log_to_mlflow(record, args.tracking_uri, args.experiment, artifacts=[Path(path)])
        print(f"{path}: {tracking['status']}" + (f" ({tracking['error']})" if "error" in tracking else ""))
        failed = failed or (0 if tracking["status"] == "tracked" else 1)
    return failed


def add_config_options(parser: argparse.ArgumentParser) -> None:
    """The options every training command shares: preset, overrides, records and tracking."""
    parser.add_argument("--preset", default="smoke", help=f"one of {tuple(cfg.PRESETS)} (default smoke)")
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE",
                        help="override a config field (repeatable)")
    parser.add_argument("--config", help="JSON or TOML file of overrides")
    parser.add_argument("--tracking-uri",
                        help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    parser.add_argument("--experiment", help="MLflow experiment name (default stability-<preset>)")
    parser.add_argument("--out", default="reports/runs", help="directory of the JSON records")
    parser.add_argument("--no-track", action="store_true", help="write the JSON records only")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stability", description="Numerical-stability harness for gated attention.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train a baseline/gated pair and record it")
    add_config_options(run)
    run.add_argument("--quiet", action="store_true", help="no per-step progress")
    run.add_argument("--quant", metavar="SCHEMES",
                     help=f"post-training quantization schemes to evaluate on both arms: a comma list of "
                          f"{', '.join(cfg.QUANT_SCHEMES)}, or 'all' (sets quant_schemes)")
    run.set_defaults(func=cmd_run)

    presets = sub.add_parser("presets", help="print the named presets")
    presets.set_defaults(func=cmd_presets)

    upload = sub.add_parser("upload", help="send JSON records to MLflow")
    upload.add_argument("records", nargs="+")
    upload.add_argument("--tracking-uri")
    upload.add_argument("--experiment")
    upload.set_defaults(func=cmd_upload)

    from stability.regression import add_check_parsers
    from stability.report import add_report_parser

    add_check_parsers(sub)   # `stability check`, `stability baseline update`
    add_report_parser(sub)   # `stability report`
    from stability.stress import add_stress_parser

    add_stress_parser(sub)   # `stability stress [KIND...]`
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except cfg.ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
