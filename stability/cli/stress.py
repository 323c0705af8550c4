"""``stability stress [KIND ...]``: run stress cases into one run directory."""

from __future__ import annotations

import sys

from stability import config as cfg
from stability.cli.options import add_config_options, resolve_session
from stability.table import ladder_table, paired_table, quant_table


def cmd_stress(args) -> int:
    kinds = args.kinds or list(cfg.STRESS_CASES)
    for kind in kinds:
        if kind not in cfg.STRESS_CASES:
            raise cfg.ConfigError(f"stress case {kind!r} is unknown: expected one of {cfg.STRESS_CASES}")
    from stability import distributed

    if distributed.launched() > 1:   # started by torchrun: one arm across the processes
        from stability.cli.run import under_torchrun
        from stability.stress import run_case

        return under_torchrun(args, "stress", lambda config, run_dir: stress_cases(args, kinds, config, run_dir, None, None),
                              lambda config: [run_case(kind, config) for kind in kinds])
    config, run_dir, resume, checkpoint_dir = resolve_session(args, "stress")
    return stress_cases(args, kinds, config, run_dir, resume, checkpoint_dir)


def stress_cases(args, kinds, config, run_dir, resume, checkpoint_dir) -> int:
    """Run the stress cases ``kinds`` in a session on ``run_dir``, keep each record, print the tables."""
    from stability.cli.run import make_session, print_tracking
    from stability.experiment import Interrupted
    from stability.pipeline import run_recorded

    print(f"run directory: {run_dir}" + (" (continuing an interrupted run; --fresh starts a new one)"
                                          if resume else ""), flush=True)
    session = make_session(args, "stress", run_dir, checkpoint_dir, resume)
    records = []
    try:
        for kind in kinds:
            done = next((r for r in (resume.records if resume else []) if r.get("stress") in (kind, "pair"
                         if kind == "standard" else kind) and r.get("status") not in ("running", "killed")), None)
            if done is not None:
                print(f"stability stress {kind}: done before the interruption ({done['_path']})", flush=True)
                records.append(done)
                continue
            print(f"stability stress {kind}: preset {config.preset}, seeds {config.seeds}", flush=True)
            try:
                record = run_recorded(kind, config, run_dir, args.tracking_uri, args.experiment,
                                      track=not args.no_track, plots=not args.no_plots, session=session)
            except Interrupted as stop:
                print(f"interrupted in {kind}: the record so far is {stop.record.get('record_path')}; continue "
                      f"with `stability stress {' '.join(kinds)} --resume {run_dir}`", file=sys.stderr)
                print_tracking(stop.record)
                raise
            records.append(record)
            print(f"record: {record['record_path']}  ({record['timing']['wall_seconds']:.1f} s)")
            print_tracking(record)
            print(paired_table(record))
            for extra in (ladder_table(record), quant_table(record)):
                if extra:
                    print()
                    print(extra)
            print()
    finally:
        session.close()
    if args.baseline_out:
        from stability.regression import make_baseline, write_baseline

        print(f"baseline written: {write_baseline(make_baseline(records), args.baseline_out)}")
    return 1 if any(r["status"] == "error" for r in records) else 0


def add_parsers(sub) -> None:
    cases = ", ".join(cfg.STRESS_CASES)
    parser = sub.add_parser("stress", help=f"run stress cases ({cases}) and record them")
    parser.add_argument("kinds", nargs="*", help=f"cases to run (default all: {cases})")
    add_config_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no per-step progress")
    parser.add_argument("--no-plots", action="store_true", help="no plots or report among the MLflow artifacts")
    parser.add_argument("--baseline-out", metavar="PATH",
                        help="also write a regression baseline made from these records to PATH")
    parser.set_defaults(func=cmd_stress)
