"""The statistics of one row: a judged figure of one case and arm, or the paired difference ``<arm> -
reference`` of a treatment arm, against the baseline runs of each seed.

A baseline holds, per seed, the values of the seed's unperturbed run and of its rounding replicates; their
spread is the noise a harmless change has to be told from. A row's ``delta = mean_s(current_s - m_s)`` over
the seeds, where ``m_s`` and ``v_s`` are the mean and variance of seed s's baseline runs (never below the
figure's resolution squared), standard error ``sqrt(sum_s v_s (1 + 1/n_s)) / n``, degrees of freedom by
``DOF_RULE`` (the fewest of any seed). A row of the primary family is two hypotheses (``Row.hypotheses``):
*regressed*, the p-value of "worse by more than the floor" (``floor = max(floor, rel_floor * |baseline|)``,
the figure table), and *changed*, the p-value of "every seed moved the same way" (no floor: each seed's move
against its own noise, ``every_seed_moved``), left out for a row declared ``floor_only`` (its harmless spread
is heavier-tailed than its replicates show). ``stability.check.verdict.decide`` judges them together.

Why the change hypothesis asks every seed: a change of the code moves the figure of every seed, while a
harmless job's rounding moves each seed's run independently, and now and then one of them far (the
harmless spread of a figure at `smoke` has heavier tails than 20 replicates show: in the 185 kept null jobs
of replicates 20-217, 10 seeds of rows judged both ways held a run beyond 4.5 of the seed's replicate
standard deviations, in 12 jobs, and one of them made job 153 CHANGED through the mean over seeds). The
regressed hypothesis keeps the mean over seeds: worse by more than a floor is worse, however it is spread.

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from stability.record import figures as fig
from stability.record.stats import t_quantile, t_upper_tail

DOF_RULE = "min"
"""How a row's degrees of freedom are counted: "min" (the smallest n_s - 1 of any seed: valid when one seed is
noisier than the others) or "welch" (Welch-Satterthwaite over the seeds' variance estimates, which understates
p in the tail when one seed dominates the variance). Chosen by calibration on the committed ci baseline: with
Welch the closest of 125 arrangements came within 6.5x of failing (one chaotic seed's early gradient norm),
with "min" within 15x; the power of the early-horizon rows (z in the thousands) does not depend on it."""


@dataclass
class Row:
    case_key: str                # the case key ("smoke/batch_ramp-sqrt": stability.record.case_key)
    arm: str
    figure: str
    better: str
    baseline: float | None      # mean of the baseline runs (the seeds' means)
    current: float | None       # mean of the current values
    delta: float | None         # the mean over seeds of (current - the seed's baseline mean)
    floor: float | None         # the smallest change worth acting on
    noise: float | None         # root mean replicate variance over the seeds (at least the resolution)
    se: float | None            # standard error of delta under the noise
    z: float | None             # (worse - floor) / se: the evidence, in standard errors beyond the floor
    p: float | None             # P(T > z) under the row's degrees of freedom: worse by more than the floor
    verdict: str                # ok | regressed | changed | worse | improved | new | missing
    mode: str = ""              # "n=3 df=12"
    note: str = ""
    p_improved: float | None = None   # better by more than the floor
    p_change: float | None = None     # no floor: every seed moved the same way (``every_seed_moved``)
    se_seed: float | None = None      # the largest seed's standard error: what a change must pass in every seed
    tier: str = "advisory"      # primary | advisory | duplicate
    floor_only: bool = False    # a primary row judged by its floor only (no change hypothesis)

    @property
    def hypotheses(self) -> list[tuple[str, float]]:
        """What the family-wise decision judges of a primary row: ("regressed", p), and ("changed", p_change)
        unless the row is judged by its floor only."""
        if self.p is None:
            return []
        moved = [] if self.floor_only or self.p_change is None else [("changed", self.p_change)]
        return [("regressed", self.p)] + moved

    @property
    def p_judged(self) -> float | None:
        """The smallest p-value of the row's hypotheses (what comes closest to failing it)."""
        return min((p for _, p in self.hypotheses), default=self.p)

    def as_dict(self) -> dict:
        return {**self.__dict__, "p_judged": self.p_judged}


def _mean(values) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def _tail(statistic: float, se: float, dof: float) -> float:
    """P(T > statistic / se) under Student's t with ``dof`` degrees of freedom (rounded down to a whole
    number, at least 1; the normal tail for infinite dof); a zero standard error decides by the sign."""
    if se <= 0:
        return 0.0 if statistic > 0 else 1.0
    if not math.isfinite(dof) or dof > 1000:
        return 0.5 * math.erfc(statistic / se / math.sqrt(2))
    return t_upper_tail(statistic / se, max(1, int(dof)))


def seed_noise(groups: dict[str, list[float]], quantum: float) -> dict[str, tuple[float, float]]:
    """Per seed: (variance of one run, its degrees of freedom) from the seed's baseline runs, never below
    ``quantum``^2 (a variance at the quantum is a fixed resolution: infinite degrees of freedom). A seed
    with one run takes the mean variance of the others."""
    noise = {}
    for seed, values in groups.items():
        if len(values) >= 2:
            mean = sum(values) / len(values)
            noise[seed] = (sum((v - mean) * (v - mean) for v in values) / (len(values) - 1), len(values) - 1)
    if noise:
        pooled = sum(v for v, _ in noise.values()) / len(noise)
        dof = sum(d for _, d in noise.values())
    else:
        pooled, dof = 0.0, math.inf
    out = {}
    for seed in groups:
        variance, df = noise.get(seed, (pooled, dof))
        out[seed] = (variance, df) if variance > quantum ** 2 else (quantum ** 2, math.inf)
    return out


def welch_dof(terms: list[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance estimates (value, dof each)."""
    total = sum(v for v, _ in terms)
    spread = sum(v * v / d for v, d in terms if math.isfinite(d) and d > 0)
    return total * total / spread if spread > 0 else math.inf


def row_dof(terms: list[tuple[float, float]], rule: str = DOF_RULE) -> float:
    """The degrees of freedom of a row's standard error under ``rule`` ("welch" or "min")."""
    if rule == "min":
        return min((d for _, d in terms), default=math.inf)
    return welch_dof(terms)


FP32_RESOLUTION = 2.0 ** -23
"""The least relative noise a row is judged at: one fp32 rounding step of its baseline value. The harness trains
in fp32; a figure that every replicate of every seed reproduces to the bit (a maximum that rounding never moves
at `smoke`) would otherwise be judged at zero width, so that one unit in the last place fails a harmless job."""


def judge(baseline: dict, current: dict, name: str, quantum: float = 0.0, tolerance: dict | None = None,
          dof_rule: str = DOF_RULE) -> dict:
    """The statistics of one row: ``baseline`` maps seed -> {replicate: value or None}, ``current`` maps
    seed -> value (seeds of the job that have no finite value are left out of ``current``). Returns the
    fields of ``Row`` from ``baseline`` to ``p_change`` (see the module docstring for the rule)."""
    entry = fig.figure(name)
    tolerance = tolerance or {}
    groups = {s: [v for v in runs.values() if v is not None] for s, runs in baseline.items()}
    groups = {s: g for s, g in groups.items() if g}
    cur = {s: v for s, v in current.items() if v is not None}
    out = {"baseline": None, "current": _mean(cur.values()), "delta": None, "floor": None, "noise": None,
           "se": None, "z": None, "p": None, "mode": "", "note": "", "p_improved": None, "p_change": None,
           "se_seed": None}
    if not groups:
        return out
    centers = {s: sum(g) / len(g) for s, g in groups.items()}
    out["baseline"] = base_mean = sum(centers.values()) / len(centers)
    common = sorted(set(cur) & set(groups))
    if not common:
        return out
    # never narrower than one fp32 rounding step of the figure: two runs that agree to that are the same run
    quantum = max(quantum, FP32_RESOLUTION * max(abs(c) for c in centers.values()))
    noise = seed_noise({s: groups[s] for s in common}, quantum)
    terms = [(noise[s][0] * (1 + 1 / len(groups[s])), noise[s][1]) for s in common]
    delta = sum(cur[s] - centers[s] for s in common) / len(common)
    se = math.sqrt(sum(v for v, _ in terms)) / len(common)
    dof = row_dof(terms, dof_rule)
    floor = max(tolerance.get("floor", entry.floor), tolerance.get("rel_floor", entry.rel_floor) * abs(base_mean))
    worse = delta if entry.better == "lower" else -delta
    z = (worse - floor) / se if se > 0 else (math.inf if worse > floor else -math.inf)
    out.update(current=_mean(cur[s] for s in common), delta=delta, floor=floor,
               noise=math.sqrt(sum(noise[s][0] for s in common) / len(common)), se=se, z=z,
               mode=f"n={len(common)} df={dof:.3g}", p=_tail(worse - floor, se, dof),
               p_improved=_tail(-worse - floor, se, dof),
               p_change=every_seed_moved({s: cur[s] - centers[s] for s in common}, dict(zip(common, terms))),
               se_seed=math.sqrt(max(v for v, _ in terms)))
    return out


def every_seed_moved(deltas: dict[str, float], terms: dict[str, tuple[float, float]]) -> float:
    """The two-sided p-value of "every seed moved the same way": seed s's move ``deltas[s]`` against its own
    noise ``terms[s]`` (the variance of a difference from its baseline mean, its degrees of freedom); per
    direction the largest one-sided p of the seeds (an intersection-union test: every seed must show the move),
    twice the smaller direction's. One seed alone is its two-sided p."""
    def weakest(sign: int) -> float:
        return max(_tail(sign * d, math.sqrt(terms[s][0]), terms[s][1]) for s, d in deltas.items())
    if not deltas or all(d == 0 for d in deltas.values()):
        return 1.0
    return min(1.0, 2 * min(weakest(1), weakest(-1)))


# ----------------------------------------------------------------------------- how far a row must move

def dof_of(mode: str) -> float:
    """The degrees of freedom of a row's ``mode`` ("n=3 df=4")."""
    text = mode.split("df=")[-1]
    return math.inf if text in ("inf", "") else float(text)


def critical_t(tail: float, dof: float) -> float:
    """The t whose upper tail is ``tail`` under ``dof`` degrees of freedom (the check's rounding: whole dof,
    at least 1; the normal quantile for more than 1000)."""
    if not math.isfinite(dof) or dof > 1000:
        return NormalDist().inv_cdf(1 - tail)
    return t_quantile(tail, max(1, int(dof)))


def smallest_moves(row: Row, hypotheses: int, alpha: float) -> tuple[float, float | None]:
    """(move, change) of a primary row judged among ``hypotheses`` by Holm at ``alpha``: the smallest move in its
    worse direction that fails the job alone (``floor + t(alpha / H) se``, exit 1) and the smallest move the
    same in every seed, either way, that makes it CHANGED (``t(alpha / 2H) se_seed``, exit 3; None for a row
    judged by its floor only). ``stability.check.power`` explains both."""
    dof = dof_of(row.mode)
    change = None if row.floor_only else critical_t(alpha / hypotheses / 2, dof) * row.se_seed
    return row.floor + critical_t(alpha / hypotheses, dof) * row.se, change


def move_fields(row: Row, hypotheses: int, alpha: float) -> dict:
    """What the check's JSON adds to a primary row: ``smallest_failing_move`` (in the worse direction, alone:
    exit 1), ``of_the_mean`` (that move over the baseline mean) and ``smallest_change`` (the same in every
    seed, either way: exit 3; None for a row judged by its floor only); all None where the row has no noise."""
    if row.se is None or row.floor is None or not hypotheses:
        return {"smallest_failing_move": None, "of_the_mean": None, "smallest_change": None}
    move, change = smallest_moves(row, hypotheses, alpha)
    return {"smallest_failing_move": move, "of_the_mean": move / abs(row.baseline) if row.baseline else None,
            "smallest_change": change}
