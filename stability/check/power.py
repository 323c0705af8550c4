"""How far each primary row must move to fail a job alone: the power of the primary family, row by row.

    moves = smallest_failing_moves(baseline)      # one entry per primary row of the baseline
    print(moves_table(moves))                     # `stability baseline calibrate` prints it

A job fails when Holm over the H hypotheses of the primary rows rejects one (two per row: worse by more
than its floor, and moved at all; one for a row judged by its floor only); a row that moved alone is rejected
when a p of its is at most alpha / H (the first Holm step). Under the check's rule
(stability.check.rows.judge) the p of "regressed" is the upper tail of ``(worse - floor) / se`` under
Student's t with the row's degrees of freedom, so the smallest move in the worse direction that fails the
job by itself (exit 1) is

    move = floor + t(alpha / H, df) * se

and the smallest move either way, the same in every seed, that makes it CHANGED (exit 3; every seed's move
beyond its own noise, no floor: ``stability.check.rows.every_seed_moved``) is

    change = t(alpha / 2H, df) * se_seed

with ``floor`` the larger of the figure's floor and its relative floor times the baseline mean, ``se`` the
standard error of a job's mean difference over the baseline's seeds (its replicate noise) and ``se_seed``
the largest standard error of one seed's difference (about sqrt(seeds) x ``se``). The rows are
computed with the baseline's own unperturbed runs playing the job (``se`` does not depend on the job's values).

A row *cannot fail alone* when that move is out of the figure's reach: a figure whose better direction is
"higher" and whose values are not negative (a learning rate, a step, an accuracy) cannot drop by more than
its baseline mean. Such a row counts in m and guards nothing; it leaves the primary family (docs/figures.md).

This module reads JSON only: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from stability.check import (
    DEFAULT_ALPHA,
    DOF_RULE,
    CheckResult,
    mark_duplicates,
    resolve_tolerances,
    rows_of_case,
)
from stability.check.calibration import split_runs
from stability.check.rows import critical_t, dof_of, smallest_moves
from stability.report.tables import fmt, text_table


@dataclass
class Move:
    case_key: str
    arm: str
    figure: str
    better: str
    baseline: float      # the baseline mean of the row
    floor: float         # the smallest change the row calls a change
    se: float            # standard error of a job's mean difference
    dof: float           # the row's degrees of freedom
    t: float             # the critical t at alpha / H
    move: float          # floor + t * se: the smallest move in the worse direction that fails the job alone
    change: float | None  # t(alpha / 2H) * se_seed: the smallest move either way, in every seed, that makes it
    #                       CHANGED (None: floor only)

    @property
    def relative(self) -> float | None:
        """The move as a fraction of the baseline mean (None at a mean of zero)."""
        return self.move / abs(self.baseline) if self.baseline else None

    @property
    def can_fail_alone(self) -> bool:
        """False when the move is out of reach: a non-negative figure whose better direction is "higher"
        would have to drop below zero."""
        return not (self.better == "higher" and self.baseline >= 0 and self.move >= self.baseline)


def smallest_failing_moves(baseline: dict, alpha: float = DEFAULT_ALPHA, tolerances: dict | None = None,
                           dof_rule: str = DOF_RULE) -> list[Move]:
    """Per primary row of ``baseline`` (validated by the caller), the smallest move that fails a job alone."""
    first = str((baseline.get("replicates") or [0])[0])
    _, picked = split_runs(baseline["cases"], lambda seed: first)
    result = CheckResult(alpha=alpha, preset=baseline["preset"])
    tolerances = resolve_tolerances(tolerances)
    for key, base in sorted(baseline["cases"].items()):
        rows_of_case(result, key, base, picked[key], tolerances, dof_rule, advisory=False)
    mark_duplicates(result.rows, result.signatures)
    rows = [row for row in result.primary if row.se is not None and row.floor is not None]
    hypotheses = sum(len(row.hypotheses) for row in rows)
    return [move_of(row, hypotheses, alpha) for row in rows]


def move_of(row, hypotheses: int, alpha: float = DEFAULT_ALPHA) -> Move:
    """The smallest failing move and change of one primary row (a ``stability.check.rows.Row`` with its
    ``se`` and ``floor``) judged among ``hypotheses`` by Holm at ``alpha``."""
    dof = dof_of(row.mode)
    t = critical_t(alpha / hypotheses, dof)
    move, change = smallest_moves(row, hypotheses, alpha)
    return Move(row.case_key, row.arm, row.figure, row.better, row.baseline, row.floor, row.se, dof, t, move, change)


def moves_table(moves: list[Move]) -> str:
    """The moves as a text table, the rows that cannot fail alone marked."""
    header = ["case", "arm", "figure", "worse", "baseline", "floor", "se", "df", "t*", "smallest failing move",
              "of the mean", "alone", "smallest change, every seed (exit 3)"]
    body = [[m.case_key, m.arm, m.figure, "up" if m.better == "lower" else "down", fmt(m.baseline), fmt(m.floor),
             fmt(m.se), fmt(m.dof), f"{m.t:.3g}", fmt(m.move),
             f"{100 * m.relative:.2g}%" if m.relative is not None else "-", "yes" if m.can_fail_alone else "CANNOT",
             fmt(m.change) if m.change is not None else "floor only"] for m in moves]
    return text_table([header, *body])
