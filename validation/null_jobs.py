"""False alarms of the merge gate, measured: the CPU job of unchanged code under fresh rounding replicates.

    python -m validation.null_jobs --scale smoke --replicates 5-64   # 60 jobs: train, keep, judge
    python -m validation.null_jobs --scale ci --replicates 5-14
    python -m validation.null_jobs --scale smoke --rejudge           # judge the kept records again
    python -m validation.null_jobs --scale ci --rejudge --replicates 5-28 --chose 5-16

A *null job* is the ``stress-cpu`` job of ``.github/workflows/stability.yml`` run on the code as it is, with
every run trained as rounding replicate N (``--replicate N``: each initial parameter moved by one rounding
step, ``stability.model.rounding``) for an N the baseline does not hold (its replicates are 0-4). Such a
job is a harmless change by construction: each of its runs is one more replicate of what the baseline
measured. The job fails when a stress test, the kernel step or ``stability check`` fails; every failure is a
false alarm.
With n jobs and k failures the exact (Clopper-Pearson) 95% upper bound of the false-alarm rate is stated;
0 of 60 bounds it below 4.9%.

Records are kept like the zoo's (``reports/null/<scale>/draw<N>.json.xz`` for replicate N: the regression
records without their per-step series, which the check never reads, the failed stress tests, the kernel
step's exit, the job's time) so that ``--rejudge`` judges them again without training. The table goes to
``reports/null-<scale>.md``. Nothing is asserted here.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

from stability.check.baseline import load_baseline
from validation import regression_zoo as zoo

ROOT = Path(__file__).resolve().parents[1]


def replicates_of(text: str) -> list[int]:
    """"5-64" or "5,7,9" -> the replicate numbers."""
    out = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def kept_name(replicate: int) -> str:
    """The name the null job of rounding replicate ``replicate`` is kept under (its entry, and its file
    ``reports/null/<scale>/<name>.json.xz``): ``draw<N>``, as the records kept there are named."""
    return f"draw{replicate}"


def replicate_of(name: str) -> int:
    """The rounding replicate of a null job kept as ``name`` (``kept_name``'s inverse)."""
    return int(name.removeprefix("draw"))


def upper_bound(failed: int, jobs: int, confidence: float = 0.95) -> float:
    """The exact one-sided upper confidence bound of a binomial rate (Clopper-Pearson), by bisection."""
    if jobs == 0:
        return 1.0
    if failed >= jobs:
        return 1.0

    def tail(rate):   # P(X <= failed) under rate
        return sum(math.comb(jobs, k) * rate ** k * (1 - rate) ** (jobs - k) for k in range(failed + 1))
    low, high = 0.0, 1.0
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if tail(middle) > 1 - confidence else (low, middle)
    return high


def table(rows: list[dict], scale: str, baseline: dict, chose: set[str] = frozenset()) -> str:
    """The Markdown table; jobs named in ``chose`` (replicates that chose the current rule) are listed and
    judged but not counted in the rate: a job that shaped a rule is no evidence for it."""
    counted = [r for r in rows if r["entry"] not in chose]
    failed = [r for r in counted if r["failed"]]
    minutes = [r["seconds"] / 60 for r in counted]
    lines = [f"## Null jobs at `{scale}`", "",
             (f"The CPU job of unchanged code, each run a fresh rounding replicate the baseline does not hold "
              f"(`--replicate N`), judged against `reports/baselines/{scale}-cpu.json` (commit "
              f"`{str(baseline.get('commit'))[:12]}`, replicates {baseline.get('replicates')}). A job fails on a "
              f"stress test, the kernel step or the check; every failure is a false alarm."), "",
             "| jobs | failed | false-alarm rate | 95% upper bound (exact) | minutes per job: median (range) |",
             "|---|---|---|---|---|",
             (f"| {len(counted)} | {len(failed)} | {len(failed) / max(1, len(counted)):.1%} | "
              f"{upper_bound(len(failed), len(counted)):.1%} | "
              + (f"{statistics.median(minutes):.1f} ({min(minutes):.1f}-{max(minutes):.1f}) |" if minutes else "- |")),
             ""]
    if chose:
        lines += [(f"Replicates {', '.join(str(n) for n in sorted(map(replicate_of, chose)))} chose the current "
                   f"rule (their jobs showed what it changed): judged and listed below, not counted above."), ""]
    lines += ["| replicate | verdict | what failed | smallest primary margin | minutes |", "|---|---|---|---|---|"]
    for r in rows:
        what = r["regressed"] + [f"stress: {n.rsplit('::', 1)[-1]}" for n in r["stress_failures"]] + r["errors"]
        if r["kernel_exit"] not in (0, None):
            what.append(f"kernel exit {r['kernel_exit']}")
        lines.append(f"| {replicate_of(r['entry'])} | {'FAILED' if r['failed'] else 'passed'} | "
                     f"{'; '.join(what) or '-'} | {r['margin']} | {r['seconds'] / 60:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="smoke", choices=("smoke", "ci"))
    parser.add_argument("--replicates", default="5-64",
                        help="rounding replicates to run, e.g. 5-64 or 5,6,7 (never 0-4: the baseline's own)")
    parser.add_argument("--work", help="where the copies are made (default: a new temporary folder)")
    parser.add_argument("--rejudge", action="store_true", help="judge the kept records again, train nothing")
    parser.add_argument("--out", help="Markdown table (default reports/null-<scale>.md)")
    parser.add_argument("--chose", default="", help="replicates whose jobs chose the current rule, e.g. 5-16: listed, "
                                                    "not counted in the rate")
    args = parser.parse_args()
    zoo.KEPT = ROOT / "reports" / "null"
    baseline = load_baseline(ROOT / "reports" / "baselines" / f"{args.scale}-cpu.json")
    replicates = replicates_of(args.replicates)
    held = set(baseline.get("replicates") or [])
    if held & set(replicates):
        parser.error(f"--replicates {args.replicates}: replicates {sorted(held & set(replicates))} are the "
                     f"baseline's own; expected others (a null job needs a fresh replicate)")
    work = Path(args.work or tempfile.mkdtemp(prefix="stability-null-")) / args.scale
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for replicate in replicates:
        name = kept_name(replicate)
        document = zoo.read_kept(args.scale, name)
        if document is None and not args.rejudge:
            print(f"replicate {replicate}: running the CPU job at {args.scale} ...", flush=True)
            document = zoo.run_entry(zoo.UNCHANGED, args.scale, work,
                                     env={"PYTEST_ADDOPTS": f"--replicate {replicate}"}, name=name)
            zoo.keep(args.scale, document)
        if document is None:
            continue
        rows.append(zoo.judged(document, baseline))
        print(f"replicate {replicate}: {'FAILED' if rows[-1]['failed'] else 'passed'} {rows[-1]['regressed'][:3]} "
              f"({document['seconds'] / 60:.1f} min)", flush=True)
    text = table(rows, args.scale, baseline, {kept_name(r) for r in replicates_of(args.chose)} if args.chose else set())
    out = Path(args.out) if args.out else ROOT / "reports" / f"null-{args.scale}.md"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
