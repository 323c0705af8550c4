"""Tracking overhead per training step, and the time of the regression check on 100 records.

    python benchmarks/bench_tracking.py [--preset smoke] [--record reports/runs/X.json] [--repeats 3]

1. Trains one pair at the preset (or reads ``--record``, whose timings were measured in the run that
   wrote it), takes the mean training step time from the arms' ``timing.train_seconds`` / steps.
2. Logs the record to a *fresh* SQLite store (schema creation included), then copies of it (new record
   ids: new runs) to the now warm store, with and without the plots/report artifacts, and the record
   itself again (its runs reopened: only what they lack is sent, here nothing). Overhead per step =
   logging time / number of training steps in the record (all arms and seeds), as % of the mean step.
3. ``check`` of 100 records (copies of the record with jittered figures) against a baseline made
   from them; also the same through file loading (``load_records`` + ``check``).

Prints a table; nothing is asserted (speed depends on the machine and its load).
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _train(preset: str) -> dict:
    from stability.cases.standard import run_pair
    from stability.config import resolve

    return run_pair(resolve(preset))


def _jittered(record: dict, index: int) -> dict:
    out = copy.deepcopy(record)
    out["id"], out["name"] = f"b{index:03d}", f"bench{index:03d}"   # 100 cases, each with the pair's seeds
    rng = random.Random(index)
    for arm in out["arms"]:
        for key, value in arm["final"].items():
            if isinstance(value, float):
                arm["final"][key] = value * (1 + rng.uniform(-0.01, 0.01))
    return out


def _replicate(record: dict, replicate: int) -> dict:
    """``record`` as rounding replicate ``replicate`` (a baseline holds the reference and its replicates)."""
    out = _jittered(record, replicate) if replicate else copy.deepcopy(record)
    out["id"], out["name"] = f"{record['id']}d{replicate}", record["name"]
    out["config"]["run"]["replicate"] = replicate
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--record", help="use this record instead of training a pair")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of the warm-store logging and the check")
    args = parser.parse_args(argv)

    from stability.cases.pipeline import report_artifacts
    from stability.check import baseline as baselines
    from stability.check import regression
    from stability.record import clean, read_record
    from stability.record.rundir import load_records
    from stability.track import runs as tracking

    if args.record:
        record = read_record(args.record)
        source = f"record {args.record}"
    else:
        t0 = time.perf_counter()
        record = _train(args.preset)
        source = f"pair trained now at preset {args.preset} ({time.perf_counter() - t0:.1f} s)"
    arms = record["arms"]
    steps = sum(len(a["series"]["step"]) for a in arms)
    step_s = sum(a["timing"]["train_seconds"] for a in arms) / steps
    rows = []

    def add(what: str, seconds: float) -> None:
        per_step = seconds / steps
        rows.append((what, f"{seconds:.3f}", f"{per_step * 1e3:.2f}", f"{100 * per_step / step_s:.1f}%"))

    with tempfile.TemporaryDirectory(prefix="bench-tracking-") as tmp:
        import mlflow  # noqa: F401  (imported before timing: the import is paid once per process anyway)

        uri = f"sqlite:///{tmp}/fresh.db"
        t0 = time.perf_counter()
        result = tracking.log_to_mlflow(record, uri, "bench", report_artifacts(record, Path(tmp) / "a0"))
        add("log to a fresh sqlite store (schema creation + plots + report)", time.perf_counter() - t0)
        assert result["status"] == "tracked", result
        for plots in (True, False):
            times = []
            for repeat in range(args.repeats):
                t0 = time.perf_counter()
                artifacts = report_artifacts(record, Path(tmp) / f"a{plots}{repeat}") if plots else []
                tracking.log_to_mlflow({**record, "id": f"{record['id']}-{plots:d}{repeat}"}, uri, "bench", artifacts)
                times.append(time.perf_counter() - t0)
            add(f"log to the warm store, {'with' if plots else 'without'} plots/report (median of "
                f"{args.repeats})", statistics.median(times))
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            tracking.log_to_mlflow(record, uri, "bench")
            times.append(time.perf_counter() - t0)
        add(f"the same record again, without plots/report: its runs reopened, nothing new sent (median of "
            f"{args.repeats})", statistics.median(times))

        records = [_jittered(record, i) for i in range(100)]
        baseline = baselines.make_baseline([_replicate(r, n) for r in records for n in (0, 1, 2)])
        check_times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            verdict = regression.check(records, baseline)
            check_times.append(time.perf_counter() - t0)
        folder = Path(tmp) / "runs"
        folder.mkdir()
        for r in records:
            (folder / f"{r['id']}.json").write_text(json.dumps(clean(r)))
        t0 = time.perf_counter()
        regression.check(load_records([folder]), baseline)
        load_check = time.perf_counter() - t0

    print(f"source: {source}")
    print(f"{len(arms)} arms, {steps} training steps, mean step {step_s * 1e3:.1f} ms "
          f"(timing.train_seconds / steps, same run)")
    print()
    header = ("tracking", "seconds", "ms per training step", "% of a step")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print()
    print(f"check of 100 records ({len(verdict.rows)} rows, exit {verdict.exit_code}): "
          f"{statistics.median(check_times) * 1e3:.1f} ms (median of {args.repeats}); "
          f"with loading 100 files: {load_check * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
