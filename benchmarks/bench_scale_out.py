"""Wall time of stress cases on a local Ray instance with 1 worker against 2 (and in one process), side by side.

    python benchmarks/bench_scale_out.py                           # the ci preset's cases
    python benchmarks/bench_scale_out.py --preset smoke --cases lr_sweep,shock

Runs the same cases three ways in one process, one after the other: here (no Ray), ``--ray local:1``
and ``--ray local:2`` (a fresh Ray instance each; its start is timed separately and left out of the
case time). Checks that the three give the same figures, and prints the wall times and the speedup
of 2 workers over 1. Ray needs the ``ray`` extra. Asserts nothing about speed: on a machine with
fewer free cores than workers there is nothing to gain.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def figures(record: dict) -> str:
    arms = [{k: v for k, v in a.items() if k not in ("timing", "unit", "run_name", "run_key")} for a in record["arms"]]
    return json.dumps({"arms": arms, "paired": record["paired"]}, sort_keys=True, default=str)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--cases", default=None, help="comma-separated (default: every case)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args(argv)

    import torch

    from stability import config as cfg
    from stability.cases.ray_runner import RayRunner
    from stability.cases.stress import CASES, run_case

    torch.set_num_threads(1)
    overrides = dict(item.split("=", 1) for item in args.set)
    config = cfg.resolve(args.preset, overrides)
    cases = args.cases.split(",") if args.cases else list(CASES)
    print(f"preset {args.preset}, cases {', '.join(cases)}, seeds {config.seeds}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    for way in ("one process", "local:1", "local:2"):
        runner, start_s = None, 0.0
        if way != "one process":
            t0 = time.perf_counter()
            runner = RayRunner(way)
            runner.connect()
            start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        records = [run_case(case, config, runner=runner) for case in cases]
        wall = time.perf_counter() - t0
        if runner is not None:
            runner.close()
        results[way] = (wall, start_s, [figures(r) for r in records], sum(len(r["arms"]) for r in records))
        print(f"  {way:12s} {wall:8.1f} s (Ray start {start_s:.1f} s)", flush=True)
    base = results["one process"][2]
    same = {way: r[2] == base for way, r in results.items()}
    print("\n| way | cases wall s | Ray start s | same figures as one process |\n|---|---:|---:|---|")
    for way, (wall, start_s, _, _) in results.items():
        print(f"| {way} | {wall:.1f} | {start_s:.1f} | {'yes' if same[way] else 'NO'} |")
    print(f"\nspeedup of 2 workers over 1: {results['local:1'][0] / results['local:2'][0]:.2f}x "
          f"(one process / 2 workers: {results['one process'][0] / results['local:2'][0]:.2f}x)")
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
