"""Do harmless rewrites look like rounding replicates? Each rewrite ranked among the replicates, row by row.

    python -m validation.noise_ranks --preset smoke          # print the tables
    python -m validation.noise_ranks --preset ci --out       # and write reports/noise-ranks-ci.md

The merge check takes its noise from rounding replicates (stability/model/rounding.py): that is right if a
harmless rewrite of the arithmetic is, on every row the check judges, one more replicate. This tests it with
ranks, which assume nothing about the shape of the noise. For each harmless zoo entry (its job kept by
validation/regression_zoo.py) and each primary row of the check (``stability.record.figures.primary_rows()``,
arms and paired differences as the check forms them), seed by seed: the entry's value is ranked among the
seed's n baseline replicates. If the entry is one more replicate, the rank (how many replicates lie below) is
uniform on 0..n, independently in each seed. The seeds are combined by the sum of their ranks, whose exact
distribution is known, into a two-sided p-value: a rewrite that moves a row the same way in every seed gets a
small p, as it moves the check's mean over seeds. (With n = 5 replicates a single seed's two-sided rank p is
never below 1/3, so the smallest per-seed p times the seeds, or Fisher's sum of logs, could never reach 5%; the
sum of 3 seeds' ranks reaches 2 / 6^3 = 0.009.) A tie with a replicate counts against the extreme rank.

The replicates themselves give the reference: each replicate ranked among the other replicates of its seed
(leave-one-out), the same way. Entries whose values equal the kept ``unchanged`` job's on every primary row
(bit-identical records there) say nothing about the noise and are left out, and so are entries of other seeds
than the baseline's. Nothing is asserted here; tests/test_noise_ranks.py checks the ranks on constructed data.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stability.check import in_primary_family, paired_arm, paired_values, single_replicate
from stability.check.baseline import case_values
from stability.check.baseline_schema import load_baseline
from stability.record import REFERENCE_ARM, RecordError
from stability.record import figures as fig
from validation import regression_zoo as zoo
from validation.options import add_preset_option

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (0.05, 0.01)   # outside the central 95% and 99% of the replicates


# ----------------------------------------------------------------------------- rows and values

def rows_of_arms(arms: dict, stress: str, preset: str, nested: bool) -> dict[tuple[str, str], dict]:
    """(arm or "<arm>-reference", figure) -> seed -> value (``nested``: seed -> replicate -> value) of every
    primary row of one case, the paired differences formed as the check forms them."""
    out = {}
    for arm, entry in arms.items():
        for name in fig.judged(entry["figures"]):
            if fig.figure(name).outcome:
                continue
            if in_primary_family(stress, arm, name, preset):
                out[(arm, name)] = entry["figures"][name]
            if arm != REFERENCE_ARM and in_primary_family(stress, paired_arm(arm), name, preset):
                out[(paired_arm(arm), name)] = paired_values(arms, arm, name, nested)
    return out


def baseline_rows(baseline: dict) -> dict[tuple[str, str, str], dict]:
    """(case key, arm, figure) -> seed -> replicate -> value of every primary row the baseline holds."""
    return {(key, *row): values for key, case in sorted(baseline["cases"].items())
            for row, values in rows_of_arms(case["arms"], case["case"], baseline["preset"], True).items()}


def job_rows(records: list[dict], baseline: dict) -> dict[tuple[str, str, str], dict]:
    """(case key, arm, figure) -> seed -> value of a job's records, on the baseline's primary rows."""
    out = {}
    for key, case in case_values(records).items():
        base = baseline["cases"].get(key)
        if base is not None:
            arms = single_replicate(case, key)
            for row, values in rows_of_arms(arms, base["case"], baseline["preset"], False).items():
                out[(key, *row)] = values
    return out


# ----------------------------------------------------------------------------- ranks

def sum_distribution(sizes: list[int]) -> list[float]:
    """P(T = t), t = 0..sum(sizes), of T the sum of independent ranks uniform on 0..n, one per n in ``sizes``."""
    dist = [1.0]
    for n in sizes:
        new = [0.0] * (len(dist) + n)
        for t, p in enumerate(dist):
            for r in range(n + 1):
                new[t + r] += p / (n + 1)
        dist = new
    return dist


def two_sided(dist: list[float], low: int, high: int) -> float:
    """The two-sided p of an observed sum of ranks: ``low`` counting ties as above the value, ``high`` as below."""
    upper = sum(dist[low:])
    lower = sum(dist[:high + 1])
    return min(1.0, 2 * min(upper, lower))


def rank_p(value_by_seed: dict, runs_by_seed: dict) -> tuple[float, list[int]] | None:
    """(two-sided p that the value is one more of the runs, by the sum of its ranks over the seeds; the seeds'
    sizes n) for ``value_by_seed`` (seed -> value) against ``runs_by_seed`` (seed -> list of values). Seeds where
    either is missing or non-finite are left out; None when none is left."""
    low = high = 0
    sizes = []
    for seed, value in value_by_seed.items():
        runs = [v for v in runs_by_seed.get(seed, []) if v is not None]
        if value is None or not runs:
            continue
        low += sum(v < value for v in runs)
        high += sum(v <= value for v in runs)
        sizes.append(len(runs))
    if not sizes:
        return None
    return two_sided(sum_distribution(sizes), low, high), sizes


def chance(sizes: list[int], level: float) -> float:
    """The probability that a row of these seed sizes gets p <= ``level`` when the value is one more run
    (the ranks are discrete, so it is at most ``level``, often less)."""
    dist = sum_distribution(sizes)
    return sum(p for t, p in enumerate(dist) if two_sided(dist, t, t) <= level)


def entry_ps(values: dict, rows: dict) -> dict:
    """row -> (p, sizes) of a job's values (row -> seed -> value) against the baseline rows' replicates."""
    out = {}
    for row, runs in rows.items():
        ranked = rank_p(values.get(row, {}), {s: list(r.values()) for s, r in runs.items()})
        if ranked is not None:
            out[row] = ranked
    return out


def leave_one_out(rows: dict) -> dict[str, dict]:
    """replicate -> row -> (p, sizes): each replicate of the baseline ranked among the others of its seed."""
    replicates = sorted({r for runs in rows.values() for per_seed in runs.values() for r in per_seed}, key=int)
    out = {}
    for held in replicates:
        values = {row: {s: r.get(held) for s, r in runs.items()} for row, runs in rows.items()}
        others = {row: {s: {k: v for k, v in r.items() if k != held} for s, r in runs.items()}
                  for row, runs in rows.items()}
        out[held] = entry_ps(values, others)
    return out


# ----------------------------------------------------------------------------- the entries

def harmless_entries(preset: str, baseline: dict, rows: dict) -> tuple[dict, list[str]]:
    """(entry name -> row -> (p, sizes) for each harmless zoo entry kept at ``preset`` that is not bit-identical to
    the unchanged code on the primary rows; notes on the entries left out and why)."""
    unchanged = zoo.read_kept(preset, "unchanged")
    reference = job_rows(unchanged["records"], baseline) if unchanged is not None else None
    ranked, notes = {}, []
    if reference is None:
        notes.append("no kept `unchanged` job: no entry is left out as bit-identical")
    for _, entries in zoo.GROUPS:
        for entry in entries:
            if entry.harmful or entry.name == "unchanged":
                continue
            document = zoo.read_kept(preset, entry.name)
            if document is None:
                notes.append(f"`{entry.name}`: not kept at {preset}")
                continue
            if zoo.predates(document, baseline):
                notes.append(f"`{entry.name}`: its kept job predates the baseline's figures")
                continue
            try:
                values = job_rows(document["records"], baseline)
            except RecordError as error:
                notes.append(f"`{entry.name}`: its records cannot be judged ({error})")
                continue
            if values == reference:
                notes.append(f"`{entry.name}`: bit-identical to the unchanged code on every primary row")
                continue
            ps = entry_ps(values, rows)
            if not ps:
                notes.append(f"`{entry.name}`: no row in common with the baseline (other seeds)")
                continue
            ranked[entry.name] = ps
    return ranked, notes


# ----------------------------------------------------------------------------- the tables

def _p(p: float) -> str:
    return f"{p:.2g}" if p < 0.01 else f"{p:.3f}"


def worst(ranked: dict, row) -> str:
    """The name and p of the runs with the smallest p on ``row`` ("-" when none is ranked there)."""
    found = [(ps[row][0], name) for name, ps in ranked.items() if row in ps]
    if not found:
        return "- | -"
    p, name = min(found)
    return f"{name} | {_p(p)}"


def counts(ps: dict) -> list[str]:
    """Per level: how many rows are outside the central part, against how many would be by chance."""
    cells = []
    for level in LEVELS:
        outside = sum(p <= level for p, _ in ps.values())
        expected = sum(chance(sizes, level) for _, sizes in ps.values())
        cells.append(f"{outside} / {expected:.2f}")
    return cells


def report(preset: str, baseline: dict, ranked: dict, replicates: dict, notes: list[str]) -> str:
    rows = sorted({row for ps in (*ranked.values(), *replicates.values()) for row in ps})
    named = {f"`{name}`": ps for name, ps in ranked.items()}
    lines = [f"## Harmless rewrites ranked among rounding replicates at `{preset}`", "",
             (f"Baseline `reports/baselines/{preset}-cpu.json` (commit `{str(baseline.get('commit'))[:12]}`, "
              f"replicates {baseline.get('replicates')}); kept jobs `reports/zoo/{preset}/`. Per primary row and "
              f"seed, the rank of a value among the seed's replicates; over the seeds, the two-sided p of the sum "
              f"of the ranks if the value were one more replicate (validation/noise_ranks.py). Replicates: each "
              f"ranked among the others of its seed (leave-one-out)."), "",
             "### Per row: the smallest p", "",
             "| case | arm | figure | entry | p | replicate (leave-one-out) | p |", "|---|---|---|---|---|---|---|"]
    for key, arm, name in rows:
        replicate = {f"replicate {r}": ps for r, ps in replicates.items()}
        lines.append(f"| {key} | {arm} | {name} | {worst(named, (key, arm, name))} | "
                     f"{worst(replicate, (key, arm, name))} |")
    lines += ["", "### Per entry: rows outside the central 95% and 99% of the replicates, against chance", "",
              ("Outside: p <= 0.05 (0.01). By chance: the expected count if the entry were one more replicate "
               "(the ranks are discrete, so below 5% (1%) of the rows)."), "",
              "| runs | rows | outside 95% / by chance | outside 99% / by chance |", "|---|---|---|---|"]
    for name, ps in named.items():
        lines.append(f"| {name} | {len(ps)} | " + " | ".join(counts(ps)) + " |")
    for held, ps in replicates.items():
        lines.append(f"| replicate {held} (leave-one-out) | {len(ps)} | " + " | ".join(counts(ps)) + " |")
    if notes:
        lines += ["", "Left out:", "", *(f"- {note}" for note in notes)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_preset_option(parser)
    parser.add_argument("--out", action="store_true", help="write reports/noise-ranks-<scale>.md too")
    args = parser.parse_args()
    baseline = load_baseline(ROOT / "reports" / "baselines" / f"{args.preset}-cpu.json")
    rows = baseline_rows(baseline)
    ranked, notes = harmless_entries(args.preset, baseline, rows)
    text = report(args.preset, baseline, ranked, leave_one_out(rows), notes)
    if args.out:
        (ROOT / "reports" / f"noise-ranks-{args.preset}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
