"""``stability stress [KIND ...]``: run stress cases into one run directory."""

from __future__ import annotations

from stability import config as cfg
from stability.cli.options import add_config_options, resolve_from_args
from stability.table import ladder_table, paired_table, quant_table


def cmd_stress(args) -> int:
    from stability.pipeline import run_recorded
    from stability.rundir import new_run_dir

    kinds = args.kinds or list(cfg.STRESS_CASES)
    for kind in kinds:
        if kind not in cfg.STRESS_CASES:
            raise cfg.ConfigError(f"stress case {kind!r} is unknown: expected one of {cfg.STRESS_CASES}")
    config = resolve_from_args(args)
    run_dir = new_run_dir(args.out, "stress")
    print(f"run directory: {run_dir}", flush=True)
    records = []
    for kind in kinds:
        print(f"stability stress {kind}: preset {config.preset}, seeds {config.seeds}", flush=True)
        record = run_recorded(kind, config, run_dir, args.tracking_uri, args.experiment, track=not args.no_track,
                              plots=not args.no_plots)
        records.append(record)
        print(f"record: {record['record_path']}  ({record['timing']['wall_seconds']:.1f} s)")
        print(paired_table(record))
        for extra in (ladder_table(record), quant_table(record)):
            if extra:
                print()
                print(extra)
        print()
    if args.baseline_out:
        from stability.regression import make_baseline, write_baseline

        print(f"baseline written: {write_baseline(make_baseline(records), args.baseline_out)}")
    return 1 if any(r["status"] == "error" for r in records) else 0


def add_parsers(sub) -> None:
    cases = ", ".join(cfg.STRESS_CASES)
    parser = sub.add_parser("stress", help=f"run stress cases ({cases}) and record them")
    parser.add_argument("kinds", nargs="*", help=f"cases to run (default all: {cases})")
    add_config_options(parser)
    parser.add_argument("--no-plots", action="store_true", help="no plots or report among the MLflow artifacts")
    parser.add_argument("--baseline-out", metavar="PATH",
                        help="also write a regression baseline made from these records to PATH")
    parser.set_defaults(func=cmd_stress)
