"""``stability stress [CASE ...]``: run stress cases into one run directory."""

from __future__ import annotations

import sys

from stability import config as cfg
from stability.cli.options import add_config_options, resolve_session
from stability.record import UNFINISHED, Status, case_name
from stability.report.tables import case_tables_text, paired_table, quant_table


def cmd_stress(args) -> int:
    from stability.cases.stress import CASES, check_cases, run_case
    from stability.train import distributed

    cases = list(check_cases(args.cases)) or list(CASES)
    if distributed.launched() > 1:   # started by torchrun: one arm across the processes
        from stability.cases.torchrun import under_torchrun
        from stability.cli.options import resolve_from_args

        if args.ray:
            raise cfg.ConfigError(f"--ray {args.ray!r} is invalid under torchrun: expected one of the two (Ray sends "
                                  f"whole runs to its workers; torchrun shards one run over its processes)")
        return under_torchrun(resolve_from_args(args), args.out, "stress",
                              lambda config, run_dir: finish(args, stress_cases(args, cases, config, run_dir)),
                              lambda config: [run_case(case, config) for case in cases], resume=args.resume)
    runner = None
    if args.ray:
        from stability.cases.ray_runner import RayRunner

        runner = RayRunner(args.ray, max_retries=args.ray_retries)
        args.no_live = True   # the tasks train elsewhere: the driver logs each case once it is whole
    try:
        config, run_dir, resume, checkpoint_dir = resolve_session(args, "stress")
        if runner is not None:
            runner.connect()   # an unreachable cluster: exit 2 before anything is written
        records = stress_cases(args, cases, config, run_dir, resume, checkpoint_dir, runner)
    finally:
        if runner is not None:
            runner.close()
    return finish(args, records)


def finish(args, records: list[dict]) -> int:
    """The exit status: 1 when a case ended in error."""
    return 1 if any(r["status"] == Status.ERROR for r in records) else 0


def stress_cases(args, cases, config, run_dir, resume=None, checkpoint_dir=None, runner=None) -> list[dict]:
    """Run the stress cases ``cases`` in a session on ``run_dir`` (on Ray when ``runner`` is given), keep
    each record, print the tables; the records."""
    from stability.cases.experiment import Interrupted
    from stability.cases.pipeline import run_recorded
    from stability.cli.run import make_session, print_tracking

    print(f"run directory: {run_dir}" + (" (continuing an interrupted run; --fresh starts a new one)"
                                          if resume else ""), flush=True)
    session = make_session(args, "stress", run_dir, checkpoint_dir, resume)
    records = []
    try:
        for case in cases:
            done = next((r for r in (resume.records if resume else []) if case_name(r) == case
                         and r.get("status") not in UNFINISHED), None)
            if done is not None:
                print(f"stability stress {case}: done before the interruption ({done['_path']})", flush=True)
                records.append(done)
                continue
            print(f"stability stress {case}: preset {config.preset}, seeds {config.seeds}", flush=True)
            try:
                record = run_recorded(case, config, run_dir, args.tracking_uri, args.experiment,
                                      track=not args.no_track, plots=not args.no_plots, session=session,
                                      runner=runner)
                for replicate in range(1, args.replicates + 1):   # rounding replicates, for a regression baseline
                    print(f"stability stress {case}: rounding replicate {replicate} of {args.replicates}", flush=True)
                    run_recorded(case, cfg.override(config, "run.replicate", replicate), run_dir, args.tracking_uri,
                                 args.experiment, track=not args.no_track, plots=False, session=session, runner=runner)
            except Interrupted as stop:
                print(f"interrupted in {case}: the record so far is {stop.record.get('record_path')}; continue "
                      f"with `stability stress {' '.join(cases)} --resume {run_dir}`", file=sys.stderr)
                print_tracking(stop.record)
                raise
            records.append(record)
            print(f"record: {record['record_path']}  ({record['timing']['wall_seconds']:.1f} s)")
            print_tracking(record)
            print(paired_table(record))
            for extra in (*case_tables_text(record), quant_table(record)):
                if extra:
                    print()
                    print(extra)
            print()
    finally:
        session.close()
    return records


def add_parsers(sub) -> None:
    parser = sub.add_parser("stress", help="run stress cases (standard, lr_sweep, lr_ramp, ...) and record them")
    parser.add_argument("cases", nargs="*", help="cases to run (default: every case of stability.cases.stress.CASES, "
                                                 "in order; docs/stress.md)")
    add_config_options(parser)
    parser.add_argument("--quiet", action="store_true", help="no per-step progress")
    parser.add_argument("--no-plots", action="store_true", help="no plots or report among the MLflow artifacts")
    parser.add_argument("--replicates", type=int, default=0, metavar="R",
                        help="also train R rounding replicates of every case (the noise of a regression baseline: "
                             "stability baseline update RUN_DIR)")
    parser.add_argument("--ray", metavar="auto|local:N|HOST:PORT",
                        help="train each run (case, arm, seed, LR / precision) as a Ray task: local:N starts Ray "
                             "here with N CPUs, auto joins this machine's cluster, HOST:PORT another (pip install "
                             "-e \".[ray]\")")
    parser.add_argument("--ray-retries", type=int, default=3, metavar="N",
                        help="reruns of a Ray task whose worker died (default 3)")
    parser.set_defaults(func=cmd_stress)
