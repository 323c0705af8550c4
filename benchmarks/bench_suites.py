"""Wall time of the stress suites and the share of it spent training.

    python benchmarks/bench_suites.py [--preset smoke] [--records-from DIR] [-- PYTEST ARGS...]

Runs ``pytest suites/ -m stress --preset SCALE`` in a subprocess with its JSON records sent to a
fresh run directory (``$STABILITY_RUN_DIR``; MLflow: the suites' usual store), then reads
the records' timing fields and prints a Markdown table per record:

* ``train``: seconds inside the training steps (``timing.train_seconds``, all runs of the case);
* ``probes`` / ``eval``: heavy probes every K steps, final held-out evaluation (and quantization);
* ``other run``: the rest of ``train()`` (model build, optimizer, eval batches);
* ``setup``: the case outside ``train()`` (record, corpus, analysis);
* ``tracking``: ``log_to_mlflow`` (the record, the plots, the report);

plus the pytest wall time and what no record accounts for (interpreter start, imports,
collection, the determinism re-run, the property tests). ``--records-from DIR`` only reads
records already written there (no pytest run). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stability.record import case_key
from validation.options import add_preset_option


def _case_timing(record: dict) -> dict:
    """Seconds per part for one record (a stress record has case-level timing; a plain pair
    record, as the fault tests write, has per-arm timing)."""
    timing = record.get("timing") or {}
    if "run_wall_seconds" in timing:
        run_wall = timing["run_wall_seconds"]
        parts = {k: timing.get(f"{k}_seconds", 0.0) for k in ("train", "probe", "eval")}
        setup = timing.get("setup_seconds", 0.0)
    else:
        arms = [a.get("timing") or {} for a in record.get("arms", [])]
        run_wall = sum(a.get("wall_seconds", 0.0) for a in arms)
        parts = {k: sum(a.get(f"{k}_seconds", 0.0) for a in arms) for k in ("train", "probe", "eval")}
        setup = 0.0
    return {"case": f"{case_key(record)}", "runs": timing.get("runs", len(
        record.get("arms", []))), **parts, "other_run": run_wall - sum(parts.values()), "setup": setup,
        "tracking": timing.get("tracking_seconds", 0.0)}


def table(rows: list[dict], pytest_wall: float | None) -> str:
    keys = ("train", "probe", "eval", "other_run", "setup", "tracking")
    total = {k: sum(r[k] for r in rows) for k in keys}
    lines = [("| case | runs | train s | probes s | eval s | other run s | setup s | tracking s | total s | "
              "train share |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows + [{"case": "**all records**", "runs": sum(r["runs"] for r in rows), **total}]:
        whole = sum(row[k] for k in keys)
        lines.append(f"| {row['case']} | {row['runs']} | " + " | ".join(f"{row[k]:.1f}" for k in keys)
                     + f" | {whole:.1f} | {100 * row['train'] / whole if whole else 0:.0f}% |")
    accounted = sum(total.values())
    out = "\n".join(lines)
    if pytest_wall is not None:
        out += (f"\n\npytest wall time: {pytest_wall:.1f} s; in records: {accounted:.1f} s "
                f"(training {total['train']:.1f} s = {100 * total['train'] / accounted:.0f}% of it); "
                f"outside any record (start-up, imports, collection, determinism re-run, property "
                f"tests): {pytest_wall - accounted:.1f} s. Training share of the whole pytest run: "
                f"{100 * total['train'] / pytest_wall:.0f}%.")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser, baseline=False)
    parser.add_argument("--records-from", help="read records from this directory instead of running pytest")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args()

    pytest_wall = None
    if args.records_from:
        folder = Path(args.records_from)
    else:
        folder = Path(tempfile.mkdtemp(prefix="bench-suites-"))
        env = {**os.environ, "STABILITY_RUN_DIR": str(folder / "runs")}  # MLflow: the suites' usual store
        command = [sys.executable, "-m", "pytest", "suites/", "-m", "stress", "--preset", args.preset, "-q",
                   "--durations=15", "-p", "no:cacheprovider", *args.pytest_args]
        print("$", " ".join(command), flush=True)
        started = time.perf_counter()
        result = subprocess.run(command, env=env, check=False)
        pytest_wall = time.perf_counter() - started
        print(f"pytest exit code {result.returncode}")
        folder = folder / "runs"
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != "manifest.json"]
    if not records:
        print(f"no records in {folder}")
        return 1
    print()
    print(f"## Stress suites at {args.preset}: where the time goes ({len(records)} records)\n")
    print(table([_case_timing(r) for r in records], pytest_wall))
    return 0


if __name__ == "__main__":
    sys.exit(main())
