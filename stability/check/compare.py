"""What moved between two baselines, or between a baseline and a job, in units of the replicate noise.

    moves = compare(old["cases"], new["cases"])     # a baseline's cases, or case_values(records) of a job
    print(moves_table(moves))

Both sides hold, per case key, arm and judged figure, every seed's runs (``{seed: {replicate: value}}``: a
baseline's ``cases``, or ``stability.check.baseline.case_values`` of a job's records). For each figure both
sides hold: the mean over the seeds both hold of (the new side's mean of the seed's runs - the old side's),
and that move in units of the old side's replicate noise (the root mean variance of a seed's runs, as the
check measures it). A reviewer reads what a new baseline would accept before it is committed. Reads JSON
only: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stability.check import in_primary_family
from stability.record import setting_changes
from stability.report.tables import fmt, text_table


@dataclass
class Move:
    """One figure of one case and arm: its old and new means, the move and the old side's noise."""

    case_key: str
    arm: str
    figure: str
    tier: str                   # primary | advisory
    old: float | None
    new: float | None
    delta: float | None
    noise: float | None
    sigmas: float | None        # delta / noise; inf for a move where the old runs all agree
    note: str = ""


def _seed_stats(runs: dict) -> tuple[float, float, int] | None:
    """(mean, variance, number) of one seed's finite runs; None when it has none."""
    values = [v for v in runs.values() if isinstance(v, (int, float)) and math.isfinite(v)]
    if not values:
        return None
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, variance, len(values)


def move(old: dict, new: dict) -> tuple[float | None, float | None, float | None, float | None, float | None]:
    """(old mean, new mean, delta, noise, sigmas) of one figure, each side ``{seed: {replicate: value}}``."""
    before = {s: st for s, d in old.items() if (st := _seed_stats(d)) is not None}
    after = {s: st for s, d in new.items() if (st := _seed_stats(d)) is not None}
    common = sorted(set(before) & set(after))
    if not common:
        mean = (lambda stats: sum(v[0] for v in stats.values()) / len(stats) if stats else None)
        return mean(before), mean(after), None, None, None
    old_mean = sum(before[s][0] for s in common) / len(common)
    new_mean = sum(after[s][0] for s in common) / len(common)
    delta = new_mean - old_mean
    noise = math.sqrt(sum(before[s][1] for s in common) / len(common))
    sigmas = delta / noise if noise > 0 else (0.0 if delta == 0 else math.copysign(math.inf, delta))
    return old_mean, new_mean, delta, noise, sigmas


def compare(old_cases: dict, new_cases: dict, preset: str | None = None) -> list[Move]:
    """Every (case, arm, figure) of either side, with its move (tiers at ``preset``: None, any); what one side
    lacks is noted."""
    moves = []
    for key in sorted(set(old_cases) | set(new_cases)):
        old_case, new_case = old_cases.get(key), new_cases.get(key)
        if old_case is None or new_case is None:
            side = "new" if old_case is None else "old"
            moves.append(Move(key, "-", "-", "-", None, None, None, None, None, f"case only on the {side} side"))
            continue
        stress = old_case["case"]
        for arm in sorted(set(old_case["arms"]) | set(new_case["arms"])):
            old_arm, new_arm = old_case["arms"].get(arm), new_case["arms"].get(arm)
            if old_arm is None or new_arm is None:
                side = "new" if old_arm is None else "old"
                moves.append(Move(key, arm, "-", "-", None, None, None, None, None, f"arm only on the {side} side"))
                continue
            for name in sorted(set(old_arm["figures"]) | set(new_arm["figures"])):
                tier = "primary" if in_primary_family(stress, arm, name, preset) else "advisory"
                if name not in old_arm["figures"] or name not in new_arm["figures"]:
                    side = "new" if name not in old_arm["figures"] else "old"
                    moves.append(Move(key, arm, name, tier, None, None, None, None, None,
                                      f"figure only on the {side} side"))
                    continue
                moves.append(Move(key, arm, name, tier, *move(old_arm["figures"][name], new_arm["figures"][name])))
    return moves


def moved(moves: list[Move], min_sigmas: float) -> list[Move]:
    """The moves of at least ``min_sigmas`` replicate noise, and what one side lacks, largest first."""
    shown = [m for m in moves if m.note or (m.sigmas is not None and abs(m.sigmas) >= min_sigmas)]
    return sorted(shown, key=lambda m: (m.tier != "primary", -abs(m.sigmas) if m.sigmas is not None else 0.0))


def moves_table(moves: list[Move]) -> str:
    """The moves as a text table (case, arm, figure, tier, old, new, delta, noise, sigmas, note)."""
    header = ["case", "arm", "figure", "tier", "old", "new", "delta", "noise", "sigmas", "note"]
    return text_table([header] + [[m.case_key, m.arm, m.figure, m.tier, fmt(m.old), fmt(m.new), fmt(m.delta),
                                   fmt(m.noise), fmt(m.sigmas), m.note or "-"] for m in moves])


def settings_differ(old_cases: dict, new_cases: dict) -> list[str]:
    """One line per case both sides hold whose configs differ: the settings (and the fields that make the runs
    other runs) that differ, as ``stability.record.setting_changes`` names them."""
    lines = []
    for key in sorted(set(old_cases) & set(new_cases)):
        runs, settings = setting_changes(old_cases[key].get("config") or {}, new_cases[key].get("config") or {})
        if runs:
            lines.append(f"case {key}: other runs, not comparable: {'; '.join(runs)}")
        if settings:
            lines.append(f"case {key}: settings differ: {'; '.join(settings)}")
    return lines
