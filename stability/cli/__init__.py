"""The ``stability`` command: every parser and command lives in this package; libraries hold none.

    stability run      --preset smoke [--set FIELD=VALUE ...] [--config file.toml]   train the arms
                       (--set arms=controls: baseline, G1, G1 headwise, floored G1, G2)
    stability stress   [CASE ...] --preset smoke                                    the stress cases
    stability check    --baseline reports/baselines/smoke-cpu.json [RUN_DIR]        the merge check
    stability baseline make [--preset smoke] [--replicates 4]     the stress suites with replicates -> a baseline
    stability baseline update [RUN_DIR] --out reports/baselines/smoke-cpu.json
    stability init     [--factory mypackage.model:build]     settings table + CI workflow in this repository
    stability plan     --preset full [--gpu h200] [--json plan.json]   runs, FLOPs, memory and time, before a run
    stability report   [RUN_DIR] --out reports/report.html [--baseline ...]
    stability upload   RECORD ...                                                   send to MLflow later
    stability replay   BUNDLE                                                       re-run one flagged step
    stability presets
    stability arms                                                                  the named arms

Exit codes: 0 done (check: nothing regressed), 1 an arm failed with an error (check: a figure
regressed), 2 bad input (the message names the value and what was expected), 130 interrupted.
``check``, ``baseline`` and ``report`` read JSON and run without torch.
"""

from __future__ import annotations

import argparse
import sys

from stability.cli.options import load_extensions
from stability.config import ConfigError
from stability.record import RecordError


def build_parser() -> argparse.ArgumentParser:
    from stability.cli import check, init, plan, replay, report, run, stress, upload

    parser = argparse.ArgumentParser(prog="stability", description="Numerical-stability harness for gated attention.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (run, stress, plan, check, report, upload, replay, init):
        module.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        load_extensions(args)   # the installed extensions and those --set plugins=... names, before any work
        return args.func(args)
    except (ConfigError, RecordError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
