"""``stability plan``: what a preset's job and baseline cost before anything runs (``stability.plan``).

Exit 0 with the plan printed (and ``--json FILE`` written); 1 when ``--limit`` is given and the job's wall time
does not fit it; 2 for bad input (one ``error:`` line, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

from stability import config as cfg
from stability.cli.options import overrides_of


def cmd_plan(args) -> int:
    from stability.cases.stress import CASES, check_cases
    from stability.plan import DEFAULT_MFU, GPUS, describe, make_plan

    if args.gpu is not None and args.gpu not in GPUS:
        raise cfg.ConfigError(f"--gpu {args.gpu!r} is invalid: expected one of {', '.join(GPUS)}")
    mfu = DEFAULT_MFU if args.mfu is None else args.mfu
    if not 0 < mfu <= 1:
        raise cfg.ConfigError(f"--mfu {args.mfu!r} is invalid: expected a model FLOP utilisation in (0, 1]")
    if args.gpus < 1:
        raise cfg.ConfigError(f"--gpus {args.gpus!r} is invalid: expected a positive number of GPUs")
    if args.limit is not None and not args.limit > 0:
        raise cfg.ConfigError(f"--limit {args.limit!r} is invalid: expected the job's time limit in minutes (> 0)")
    config = cfg.resolve(args.preset, overrides_of(args))
    cases = check_cases([c.strip() for c in args.cases.split(",") if c.strip()]) if args.cases else tuple(CASES)
    gpu_name = args.gpu or ("h200" if config.run.device.startswith("cuda") else None)
    plan = make_plan(config, cases, GPUS[gpu_name] if gpu_name else None, mfu, args.gpus,
                     60 * args.limit if args.limit else None)
    print(describe(plan))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(plan.to_json(), indent=1) + "\n")
        print(f"plan: {args.json}")
    job = plan.job()
    return 1 if args.limit is not None and job["wall_seconds"] > job["limit_seconds"] else 0


def add_parsers(sub) -> None:
    parser = sub.add_parser("plan", help="the runs, FLOPs, memory and time of a preset's job and baseline, before it "
                                         "runs (exit 1 when --limit is given and the job does not fit it)")
    parser.add_argument("--preset", default="smoke", help=f"one of {tuple(cfg.PRESETS)} (default smoke)")
    parser.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field (repeatable)")
    parser.add_argument("--config", help="JSON or TOML file of overrides")
    parser.add_argument("--cases", metavar="NAMES", help="the stress cases to plan (comma-separated; default all)")
    parser.add_argument("--gpu", help="plan on this GPU: a100, h100 or h200 (default: h200 for a preset that trains "
                                      "on CUDA, else this CPU at its measured rate)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs of the job, one per pytest-xdist worker (default 1)")
    parser.add_argument("--mfu", type=float, default=None,
                        help="model FLOP utilisation assumed on the GPU (default 0.35)")
    parser.add_argument("--limit", type=float, default=None, metavar="MINUTES",
                        help="the job's time limit (the workflow job's timeout-minutes): exit 1 when it does not fit")
    parser.add_argument("--json", metavar="FILE", help="also write the plan as JSON")
    parser.set_defaults(func=cmd_plan)
