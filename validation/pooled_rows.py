"""Would a test that pools the job's rows see what Holm misses? A permutation test on kept zoo jobs.

    python -m validation.pooled_rows --preset ci --entries rope_on_queries_only,rmsnorm_divide_by_sqrt

The check judges every row on its own and controls the family-wise rate with Holm, which is blind to
a change that moves many rows a little. A pooled statistic adds the rows' evidence; its null
distribution is unknown (the rows are strongly dependent) but can be had exactly by permutation. If the
change is harmless, the job's run of a seed is one more rounding replicate of that seed: exchangeable
with the seed's baseline runs. So for each of the (D + 1)^S arrangements (S seeds, D baseline replicates
each; which run of each seed plays "the change", the others the baseline) the rows are judged as
``stability check`` judges them, and pooled:

* ``fisher``: the sum over rows of -log p (Fisher's combination, here calibrated by permutation);
* ``min p``: the smallest p (the row Holm looks at first; its permutation p is the Westfall-Young
  single-step test, which uses the rows' dependence instead of Holm's worst case).

The permutation p is the share of arrangements whose statistic is at least the observed one: exact
under exchangeability, and never below 1 / (D + 1)^S (1/216 at 3 seeds and 5 replicates), so 1% is
within reach. The whole of one arrangement is one job's replicate: a seed's run is exchanged in every
case and arm at once, which keeps the dependence between cases that share a config. Nothing is asserted here;
tests/test_pooled_rows.py checks the arrangement logic on hand-made records.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

from stability.check import CheckResult, judge_cases, single_replicate
from stability.check.baseline import case_values, regression_records
from stability.check.baseline_schema import load_baseline
from stability.check.calibration import split_runs
from validation.options import add_preset_option

ROOT = Path(__file__).resolve().parents[1]

JOB = "job"   # the replicate label of the judged job's runs among the baseline's


def pooled_cases(baseline: dict, records: list[dict]) -> dict:
    """The baseline's cases with the job's run of each seed added as replicate ``JOB`` (cases, arms and seeds
    that both hold)."""
    current = case_values(regression_records(records)[0])
    cases = {}
    for key, base in baseline["cases"].items():
        if key not in current:
            continue
        job = single_replicate(current[key], key)
        arms = {}
        for arm, entry in base["arms"].items():
            if arm not in job:
                continue
            seeds = [s for s in entry["status"] if s in job[arm]["status"]]

            def add(per_seed: dict, values: dict, seeds: list = seeds) -> dict:
                return {s: {**per_seed.get(s, {}), **({JOB: values[s]} if s in values else {})} for s in seeds}
            names = set(entry["figures"]) | set(job[arm]["figures"])
            arms[arm] = {"status": add(entry["status"], job[arm]["status"]),
                         "diverged_at_step": add(entry["diverged_at_step"], job[arm]["diverged_at_step"]),
                         "figures": {n: add(entry["figures"].get(n, {}), job[arm]["figures"].get(n, {}))
                                     for n in names}}
        cases[key] = {**base, "arms": arms}
    return cases


def arrange(cases: dict, chosen: dict[str, str]) -> tuple[dict, dict]:
    """(baseline cases without the chosen runs, the chosen runs as a job of one replicate per seed):
    ``chosen`` maps each seed to the replicate that plays the change (the split of ``stability baseline
    calibrate``, per seed)."""
    return split_runs(cases, chosen.__getitem__)


def judged_p(cases: dict, chosen: dict[str, str]) -> list[float]:
    """The p-value of every judged row with ``chosen`` as the change (the check's rows, before Holm)."""
    kept, picked = arrange(cases, chosen)
    result = CheckResult()
    judge_cases(result, picked, kept, {})
    return [row.p for row in result.rows if row.p is not None]


def statistics(ps: list[float]) -> dict[str, float]:
    logs = [-math.log(max(p, 1e-300)) for p in ps]
    return {"fisher": sum(logs), "min p": max(logs, default=0.0)}


def permutation_test(baseline: dict, records: list[dict]) -> dict:
    """Each statistic's observed value and permutation p, and the number of arrangements; a job that
    shares no seed with the baseline (another seed set) has nothing to exchange: 0 arrangements, no p."""
    cases = pooled_cases(baseline, records)
    seeds = sorted({s for case in cases.values() for arm in case["arms"].values() for s in arm["status"]}, key=int)
    if not seeds:
        return {"arrangements": 0, "observed": None, "p": None}
    labels = [str(r) for r in baseline["replicates"]] + [JOB]
    observed = statistics(judged_p(cases, {s: JOB for s in seeds}))
    null = [statistics(judged_p(cases, dict(zip(seeds, combo))))
            for combo in itertools.product(labels, repeat=len(seeds))]
    return {"arrangements": len(null), "observed": observed,
            "p": {k: sum(s[k] >= observed[k] for s in null) / len(null) for k in observed}}


def main() -> int:
    from validation import regression_zoo as zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser, default="ci")
    parser.add_argument("--entries", required=True, help="comma-separated names of kept zoo jobs")
    args = parser.parse_args()
    baseline = load_baseline(ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json")
    print("| entry | kind | arrangements | Fisher sum of -log p | its permutation p | smallest p | "
          "its permutation p |\n|---|---|---|---|---|---|---|")
    for name in args.entries.split(","):
        document = zoo.read_kept(args.preset, name)
        if document is None:
            parser.error(f"no kept job {name!r} at {args.preset} (run python -m validation.regression_zoo first)")
        out = permutation_test(baseline, document["records"])
        kind = "harmful" if document["harmful"] else "harmless"
        if not out["arrangements"]:
            print(f"| `{name}` | {kind} | 0 (no seed in common with the baseline) | - | - | - | - |", flush=True)
            continue
        print(f"| `{name}` | {kind} | {out['arrangements']} | {out['observed']['fisher']:.1f} | "
              f"{out['p']['fisher']:.3f} | {math.exp(-out['observed']['min p']):.2g} | {out['p']['min p']:.3f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
