"""A baseline of fewer rounding replicates, cut from one that holds more: what ``stability baseline make
--replicates R`` would write from the same records.

    python -m validation.replicate_subset reports/baselines/smoke-cpu.json --replicates 4 \\
        --out reports/baselines/smoke-cpu-r4.json

A run's rounding draws depend only on its config, seed and replicate number (``stability.model.rounding``),
so the reference (replicate 0) and replicates 1..R of a baseline of 19 are the runs a baseline of R would
train, bit for bit, on the same code and machine. The cut keeps them, and drops what measured the whole
baseline (its calibration and its null jobs), which are measured again against the cut
(``stability baseline calibrate --write``, ``python -m validation.null_jobs --baseline ...``). Its invariants
stay those of the whole (each held in every one of its replicates, so in the kept ones too). Its commit is the
whole's; what it was cut from is said where it is used (reports/README.md).
"""

from __future__ import annotations

import argparse
import copy
import sys

from stability.check.baseline import write_baseline
from stability.check.baseline_schema import load_baseline


def cut(baseline: dict, replicates: int) -> dict:
    """``baseline`` with the reference and replicates 1..``replicates`` of every run; ValueError when it holds
    fewer."""
    keep = list(range(replicates + 1))
    missing = sorted(set(keep) - set(baseline["replicates"]))
    if missing:
        raise ValueError(f"--replicates {replicates}: the baseline holds replicates {baseline['replicates']}, not "
                         f"{missing}")
    out = copy.deepcopy(baseline)
    names = {str(r) for r in keep}
    for case in out["cases"].values():
        for arm in case["arms"].values():
            for key in ("status", "diverged_at_step"):
                arm[key] = {seed: {r: v for r, v in runs.items() if r in names} for seed, runs in arm[key].items()}
            arm["figures"] = {name: {seed: {r: v for r, v in runs.items() if r in names} for seed, runs in seeds.items()}
                              for name, seeds in arm["figures"].items()}
    out["replicates"] = keep
    out.pop("calibration", None)
    out.pop("null_jobs", None)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", help="the baseline to cut (a committed one)")
    parser.add_argument("--replicates", type=int, required=True, help="rounding replicates to keep besides the "
                                                                       "reference (1..R)")
    parser.add_argument("--out", required=True, help="where to write the cut baseline")
    args = parser.parse_args(argv)
    if args.replicates < 2:
        parser.error(f"--replicates {args.replicates}: expected at least 2 (a baseline's noise needs them)")
    whole = load_baseline(args.baseline)
    try:
        written = cut(whole, args.replicates)
    except ValueError as error:
        parser.error(str(error))
    write_baseline(written, args.out)
    print(f"wrote {args.out}: the reference and replicates 1-{args.replicates} of {args.baseline} "
          f"({len(written['cases'])} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
