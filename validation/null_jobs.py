"""False alarms of the merge gate, measured: the CPU job of unchanged code under fresh rounding replicates.

    python -m validation.null_jobs --preset smoke --replicates 20-169   # 150 jobs: train, keep, judge
    python -m validation.null_jobs --preset ci --replicates 20-79 --train-only --source CHECKOUT
    python -m validation.null_jobs --preset smoke --rejudge --replicates 20-169 --write-baseline

A *null job* is the ``stress-cpu`` job of ``.github/workflows/stability.yml`` run on the code as it is, with
every run trained as rounding replicate N (``--replicate N``: each initial parameter and every step's
gradients moved by one rounding step, ``stability.model.rounding``) for an N the baseline does not hold (its
replicates are 0-19). Such a job is a harmless change by construction: each of its runs is one more replicate
of what the baseline measured. The job fails when a stress test, the kernel step or ``stability check``
(rows, outcomes and the suites' invariants) fails; every failure is a false alarm.
With n jobs and k failures the exact (Clopper-Pearson) 95% upper bound of the false-alarm rate is stated
(0 of 150 bounds it below 2.0%, 0 of 60 below 4.9%); ``--write-baseline`` records it in the baseline
(``null_jobs``), where ``stability check`` states it as the job's false-alarm rate.

``--source`` trains the copies from another checkout (a worktree of the commit the baseline was made from), so
that work on this one does not change what a long campaign measures; ``--train-only`` keeps the jobs without
judging them (before the baseline exists).

Records are kept like the zoo's (``reports/null/<scale>/draw<N>.json.xz`` for replicate N: the regression
records without their per-step series, which the check never reads, the failed stress tests, the kernel
step's exit, the job's time, the commit, git tree and machine it ran: ``regression_zoo.run_entry``) so that
``--rejudge`` judges them again without training. The table goes to ``reports/null-<scale>.md``, with the
jobs counted per machine (``stability.record.machine.machine_key``; jobs kept before jobs named their machine
apart); ``--write-baseline`` keeps the per-machine counts in ``null_jobs.machines``, and ``stability check``
says when the job's machine is not among them. Nothing is asserted here.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from stability.check.baseline import write_baseline
from stability.check.baseline_schema import load_baseline
from stability.check.calibration import null_job_evidence
from stability.record.machine import machine_key
from stability.record.stats import binomial_upper_bound
from stability.report.tables import markdown_text
from validation import regression_zoo as zoo
from validation.options import add_preset_option

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


UNRECORDED = "machine not recorded (jobs kept before records named their machine)"


def by_machine(rows: list[dict]) -> dict[str, list[dict]]:
    """The judged jobs (``zoo.judged``'s rows) by the key of the machine each ran on
    (``stability.record.machine.machine_key``), sorted; the jobs kept before jobs named their machine last,
    under ``UNRECORDED``."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(machine_key(row["machine"]) if row.get("machine") else UNRECORDED, []).append(row)
    return dict(sorted(groups.items(), key=lambda item: (item[0] == UNRECORDED, item[0])))


def machines(rows: list[dict]) -> dict[str, int]:
    """Machine key -> the jobs of ``rows`` run on it (those kept before jobs named their machine left out):
    what the baseline's ``null_jobs.machines`` keeps."""
    return {key: len(group) for key, group in by_machine(rows).items() if key != UNRECORDED}


def machine_lines(rows: list[dict]) -> list[str]:
    """The per-machine summary of the counted jobs: jobs, failed and the exact 95% upper bound per machine
    (a rate holds on the machine it was measured on)."""
    lines = [("By machine (the CPU, the SIMD level torch dispatches to, torch and its BLAS: "
              "`stability.record.machine.machine_key`; the rate is measured on these machines only):"), "",
             "| machine | jobs | failed | 95% upper bound (exact) |", "|---|---|---|---|"]
    for key, group in by_machine(rows).items():
        failed = sum(r["failed"] for r in group)
        lines.append(f"| {markdown_text(key)} | {len(group)} | {failed} | "
                     f"{binomial_upper_bound(failed, len(group)):.1%} |")
    return lines + [""]


def table(rows: list[dict], preset: str, baseline: dict, chose: set[str] = frozenset(),
          jobs_commit: str | None = None, baseline_name: str | None = None) -> str:
    """The Markdown table; jobs named in ``chose`` (replicates that chose the current rule) are listed and
    judged but not counted in the rate: a job that shaped a rule is no evidence for it."""
    counted = [r for r in rows if r["entry"] not in chose]
    failed = [r for r in counted if r["failed"]]
    minutes = [r["seconds"] / 60 for r in counted]
    lines = [f"## Null jobs at `{preset}`", "",
             (f"The CPU job of unchanged code, each run a fresh rounding replicate the baseline does not hold "
              f"(`--replicate N`), judged against `{baseline_name or f'reports/baselines/{preset}-cpu.json'}` (commit "
              f"`{str(baseline.get('commit'))[:12]}`, replicates {baseline.get('replicates')}). A job fails on a "
              f"stress test, the kernel step or the check; every failure is a false alarm."), "",
             "| jobs | failed | false-alarm rate | 95% upper bound (exact) | minutes per job: median (range) |",
             "|---|---|---|---|---|",
             (f"| {len(counted)} | {len(failed)} | {len(failed) / max(1, len(counted)):.1%} | "
              f"{binomial_upper_bound(len(failed), len(counted)):.1%} | "
              + (f"{statistics.median(minutes):.1f} ({min(minutes):.1f}-{max(minutes):.1f}) |" if minutes else "- |")),
             ""]
    if jobs_commit:
        lines += [f"The counted jobs ran the code of commit `{jobs_commit[:12]}`.", ""]
    if counted:
        lines += machine_lines(counted)
    if chose:
        lines += [(f"Replicates {', '.join(str(n) for n in sorted(map(replicate_of, chose)))} chose the current "
                   f"rule (their jobs showed what it changed): judged and listed below, not counted above."), ""]
    lines += ["| replicate | verdict | what failed | smallest primary margin | minutes | code |", "|---|---|---|---|---|---|"]
    for r in rows:
        what = r["regressed"] + [f"stress: {n.rsplit('::', 1)[-1]}" for n in r["stress_failures"]] + r["errors"]
        if r["kernel_exit"] not in (0, None):
            what.append(f"kernel exit {r['kernel_exit']}")
        lines.append(f"| {replicate_of(r['entry'])} | {'FAILED' if r['failed'] else 'passed'} | "
                     f"{'; '.join(what) or '-'} | {r['margin']} | {r['seconds'] / 60:.1f} | "
                     f"{(r.get('code') or '-')[:12]} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser)
    parser.add_argument("--replicates", default="20-169",
                        help="rounding replicates to run, e.g. 20-169 or 20,21,22 (never the baseline's own)")
    parser.add_argument("--work", help="where the copies are made (default: a new temporary folder)")
    parser.add_argument("--source", default=str(ROOT), help="the checkout the copies are made from (default: this one)")
    parser.add_argument("--rejudge", action="store_true", help="judge the kept records again, train nothing")
    parser.add_argument("--train-only", action="store_true", help="train and keep the jobs, judge nothing")
    parser.add_argument("--write-baseline", action="store_true",
                        help="record the count and the failures in the baseline (its null_jobs), nothing else changed")
    parser.add_argument("--out", help="Markdown table (default reports/null-<scale>.md)")
    parser.add_argument("--baseline", help="the baseline the jobs are judged against (default the committed "
                                           "reports/baselines/<scale>-cpu.json; e.g. a cut of it with fewer replicates, "
                                           "validation/replicate_subset.py); --write-baseline writes there")
    parser.add_argument("--jobs-commit", help="the commit whose code the counted jobs ran, recorded with them "
                                              "(default: the baseline's; a kept job does not name its code)")
    parser.add_argument("--chose", default="", help="replicates whose jobs chose the current rule, e.g. 5-16: listed, "
                                                    "not counted in the rate")
    args = parser.parse_args()
    zoo.KEPT = ROOT / "reports" / "null"
    path = Path(args.baseline) if args.baseline else ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json"
    baseline = None if args.train_only else load_baseline(path)
    replicates = replicates_of(args.replicates)
    held = set((baseline or {}).get("replicates") or range(20))
    if held & set(replicates):
        parser.error(f"--replicates {args.replicates}: replicates {sorted(held & set(replicates))} are the "
                     f"baseline's own; expected others (a null job needs a fresh replicate)")
    work = Path(args.work or tempfile.mkdtemp(prefix="stability-null-")) / args.preset
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for replicate in replicates:
        name = kept_name(replicate)
        document = zoo.read_kept(args.preset, name)
        if document is None and not args.rejudge:
            print(f"replicate {replicate}: running the CPU job at {args.preset} ...", flush=True)
            document = zoo.run_entry(zoo.UNCHANGED, args.preset, work, env={"PYTEST_ADDOPTS": f"--replicate {replicate}"},
                                     name=name, source=Path(args.source))
            zoo.keep(args.preset, document)
            shutil.rmtree(work / name, ignore_errors=True)
        if document is None or baseline is None:
            continue
        rows.append(zoo.judged(document, baseline))
        print(f"replicate {replicate}: {'FAILED' if rows[-1]['failed'] else 'passed'} {rows[-1]['regressed'][:3]} "
              f"({document['seconds'] / 60:.1f} min)", flush=True)
    if baseline is None:
        return 0
    chose = {kept_name(r) for r in replicates_of(args.chose)} if args.chose else set()
    text = table(rows, args.preset, baseline, chose, args.jobs_commit,
                 path.resolve().relative_to(ROOT).as_posix() if args.baseline else None)
    out = Path(args.out) if args.out else ROOT / "reports" / f"null-{args.preset}.md"
    out.write_text(text)
    print(text)
    if args.write_baseline:
        counted = [r for r in rows if r["entry"] not in chose]
        margins = [float(r["margin"]) for r in counted if not r["failed"]]
        baseline["null_jobs"] = null_job_evidence(len(counted), sum(r["failed"] for r in counted),
                                                  args.jobs_commit or baseline.get("commit"),
                                                  [replicate_of(r["entry"]) for r in counted],
                                                  min(margins) if margins else None, machines(counted))
        write_baseline(baseline, path)
        print(f"null jobs written into {path}: {baseline['null_jobs']['failed']} of {baseline['null_jobs']['jobs']} "
              f"failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
