"""What a baseline's replicate count gives, at one preset: the committed baseline beside a cut of it with fewer
rounding replicates (``validation/replicate_subset.py``), row by row.

    python -m validation.replicate_count --preset smoke --cut reports/baselines/smoke-cpu-r4.json

writes ``reports/replicate-count-<preset>.md``: each baseline's calibration and null jobs (as recorded in
it: ``stability baseline calibrate --write``, ``python -m validation.null_jobs --baseline ...
--write-baseline``), then every primary row's smallest failing move (``stability.check.power``: the move in
the worse direction that fails a job alone, exit 1) and smallest change (the same in every seed, exit 3)
under each. Nothing is trained; tests/test_docs_examples.py writes it again and compares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stability.check.baseline_schema import load_baseline
from stability.check.power import smallest_failing_moves
from stability.record.stats import binomial_upper_bound
from stability.report.tables import fmt
from validation.options import add_preset_option

ROOT = Path(__file__).resolve().parents[1]


def runs(baseline: dict) -> int:
    return len(baseline["replicates"])


def evidence(name: str, baseline: dict) -> str:
    """One line of the table of what a baseline's replicate count was measured to give."""
    curve, jobs = baseline.get("calibration") or {}, baseline.get("null_jobs") or {}
    failed = " / ".join(str(n) for n in curve.get("failed", [])) or "-"
    bound = (f"{jobs['failed']} of {jobs['jobs']} ({binomial_upper_bound(jobs['failed'], jobs['jobs']):.1%})"
             if jobs.get("jobs") else "not measured")
    margin = f"{curve['margin']:.3g}" if curve.get("margin") is not None else "-"
    return (f"| `{name}` | {runs(baseline)} | {curve.get('arrangements', '-')} | {failed} | {margin} | {bound} |")


def share(value: float | None, mean: float) -> str:
    return "-" if value is None else (f"{fmt(value)} ({100 * value / abs(mean):.2g}%)" if mean else fmt(value))


def report(preset: str, whole_path: Path, cut_path: Path) -> str:
    whole, cut = load_baseline(whole_path), load_baseline(cut_path)
    names = (whole_path.relative_to(ROOT).as_posix(), cut_path.relative_to(ROOT).as_posix())
    many = {(m.case_key, m.arm, m.figure): m for m in smallest_failing_moves(whole)}
    few = {(m.case_key, m.arm, m.figure): m for m in smallest_failing_moves(cut)}
    lines = [f"# What {runs(cut) - 1} rounding replicates give at `{preset}`, beside {runs(whole) - 1}", "",
             (f"Written by `python -m validation.replicate_count --preset {preset} --cut {names[1]}` from the two "
             f"baselines; `{names[1]}` is the reference and replicates 1-{runs(cut) - 1} of `{names[0]}` "
             f"(`python -m validation.replicate_subset`), the runs `stability baseline make --replicates "
             f"{runs(cut) - 1}` trains. Calibration: every arrangement of the replicates judged as a harmless job "
             f"(fail at alpha 0.01 / 0.02 / 0.05 / 0.10); null jobs: harmless jobs of unchanged code judged "
             f"against it, with their exact one-sided 95% upper bound."), "",
             "| baseline | runs per seed | arrangements | fail at each alpha | margin | null jobs failed (bound) |",
             "|---|---:|---:|---|---:|---|", evidence(names[0], whole), evidence(names[1], cut), "",
             (f"Each primary row's smallest failing move (exit 1: worse by it, alone) and smallest change (exit 3: "
             f"the same move in every seed, either way), as a share of the baseline mean, under {runs(whole)} and "
             f"{runs(cut)} runs per seed:"), "",
             (f"| case | arm | figure | mean | move, {runs(whole)} runs | move, {runs(cut)} runs | change, "
             f"{runs(whole)} runs | change, {runs(cut)} runs |"), "|---|---|---|---:|---|---|---|---|"]
    for key in sorted(set(many) | set(few)):
        a, b = many.get(key), few.get(key)
        mean = (a or b).baseline
        lines.append(f"| {key[0]} | {key[1]} | `{key[2]}` | {fmt(mean)} | {share(a and a.move, mean)} | "
                     f"{share(b and b.move, mean)} | {share(a and a.change, mean)} | {share(b and b.change, mean)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser)
    parser.add_argument("--cut", required=True, help="the baseline of fewer replicates")
    parser.add_argument("--out", help="default reports/replicate-count-<preset>.md")
    args = parser.parse_args(argv)
    text = report(args.preset, ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json", Path(args.cut).resolve())
    out = Path(args.out) if args.out else ROOT / "reports" / f"replicate-count-{args.preset}.md"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
