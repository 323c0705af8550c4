"""Do rounding replicates move the figures as much as harmless code changes do? A table per preset.

    python -m validation.replicate_spread --preset smoke        # reports/replicates-smoke.md

The merge check takes a figure's noise from its rounding replicates (stability/model/rounding.py). That
is only right if a harmless change of the code (another but equivalent formula, another summation
order, another thread count) moves the figures about as far as one rounding step of the initial
weights does. This compares the two on the same rows, seed by seed:

* each harmless zoo entry (kept by validation/regression_zoo.py, same seeds as the baseline): its
  value ``x`` against the seed's baseline runs (mean ``m``, sample variance ``v`` of n runs),
  ``u = (x - m) / sqrt(v (1 + 1/n))``;
* the replicates themselves, leave-one-out: each baseline run against the other n - 1 runs of its seed,
  the same ``u`` (a Student t with n - 2 degrees of freedom if the runs were normal).

If the replicates stand for harmless changes, the two distributions of |u| agree: the table gives their
quantiles, the share beyond 3 and 6, and how often a row moved although every replicate of the seed gave
the same value (``v = 0``: a change the replicates could not have foreseen, judged at the figure's
resolution by the check). Nothing is asserted here.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from stability.check import paired_values, single_replicate
from stability.check.baseline import case_values
from stability.check.baseline_schema import load_baseline
from stability.record import REFERENCE_ARM
from stability.record import figures as fig
from validation import regression_zoo as zoo
from validation.options import add_preset_option
from validation.zoo import BY_NAME

ROOT = Path(__file__).resolve().parents[1]


def rows_of(arms: dict, nested: bool):
    """(arm label, figure) -> seed -> value(s), arms and paired differences."""
    out = {}
    for arm, entry in arms.items():
        for name, values in entry["figures"].items():
            if fig.better(name) is not None:
                out[(arm, name)] = values
                if arm != REFERENCE_ARM:
                    out[(f"{arm}-{REFERENCE_ARM}", name)] = paired_values(arms, arm, name, nested)
    return out


def standardised(value: float, runs: list[float]) -> float | None:
    """u of ``value`` against ``runs``; None when the runs carry no spread and the value is theirs."""
    n = len(runs)
    mean = sum(runs) / n
    variance = sum((v - mean) ** 2 for v in runs) / (n - 1)
    if variance == 0.0:
        return None if value == mean else math.inf
    return (value - mean) / math.sqrt(variance * (1 + 1 / n))


def replicate_u(baseline: dict) -> list[float | None]:
    """Leave-one-out u of every baseline run against the others of its seed."""
    out = []
    for case in baseline["cases"].values():
        for per_seed in rows_of(case["arms"], True).values():
            for runs in per_seed.values():
                values = [v for v in runs.values() if v is not None]
                if len(values) >= 4:
                    for i, v in enumerate(values):
                        out.append(standardised(v, values[:i] + values[i + 1:]))
    return out


def entry_u(document: dict, baseline: dict) -> list[float | None]:
    out = []
    for key, case in case_values(document["records"]).items():
        base = baseline["cases"].get(key)
        if base is None:
            continue
        current = rows_of(single_replicate(case, key), False)
        for row, per_seed in rows_of(base["arms"], True).items():
            for seed, runs in per_seed.items():
                values = [v for v in runs.values() if v is not None]
                value = current.get(row, {}).get(seed)
                if len(values) >= 3 and value is not None:
                    out.append(standardised(value, values))
    return out


def summary(name: str, values: list[float | None]) -> str:
    same = sum(v is None for v in values)
    moved = [abs(v) for v in values if v is not None]
    unforeseen = sum(math.isinf(v) for v in moved)
    finite = sorted(v for v in moved if math.isfinite(v))

    def quantile(q):
        return f"{finite[min(len(finite) - 1, int(q * len(finite)))]:.2f}" if finite else "-"
    beyond = [sum(v > k for v in finite) / len(finite) if finite else 0.0 for k in (3, 6)]
    return (f"| {name} | {len(values)} | {same} | {unforeseen} | {quantile(0.5)} | {quantile(0.9)} | "
            f"{quantile(0.99)} | {finite[-1] if finite else 0:.2f} | {100 * beyond[0]:.2f}% | {100 * beyond[1]:.2f}% |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser)
    parser.add_argument("--kept", default=str(zoo.KEPT), help="folder of the kept zoo records")
    parser.add_argument("--out", help="Markdown table (default reports/replicates-<scale>.md)")
    args = parser.parse_args()
    zoo.KEPT = Path(args.kept)
    baseline = load_baseline(ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json")
    lines = [f"## Rounding replicates against harmless changes at `{args.preset}`", "",
             ("Per row (case x arm x figure and paired differences) and seed: `u = (x - m) / sqrt(v (1 + 1/n))`, "
             "x the value, m and v the mean and sample variance of the seed's baseline runs. Replicates: each "
             "baseline run against the other runs of its seed. *Same*: the value equals every baseline run "
             "of the seed; *unforeseen*: it differs although the baseline runs all agree."), "",
             "| runs | rows x seeds | same | unforeseen | median abs(u) | 90% | 99% | max | beyond 3 | beyond 6 |",
             "|---|---|---|---|---|---|---|---|---|---|", summary("replicates (leave-one-out)", replicate_u(baseline))]
    for entry in BY_NAME.values():   # every harmless entry whose job is kept
        if entry.harmful or entry.name.startswith("other_seeds"):
            continue
        document = zoo.read_kept(args.preset, entry.name)
        if document is not None:
            lines.append(summary(f"`{entry.name}`", entry_u(document, baseline)))
    text = "\n".join(lines) + "\n"
    Path(args.out or ROOT / "reports" / f"replicates-{args.preset}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
