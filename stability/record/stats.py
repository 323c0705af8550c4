"""Paired statistics over seeds: mean difference, 95% t-interval, exact sign-flip p-value.

For n paired seeds with differences d_i = treatment_i - reference_i, the interval is
mean(d) +/- t_{0.975, n-1} * sd(d) / sqrt(n), and the p-value is the two-sided exact
permutation test that flips the sign of each d_i (2^n arrangements, no distribution
assumed). With one seed there is no interval and no p-value.
"""

from __future__ import annotations

import itertools
import math

# Two-sided 95% Student-t critical values by degrees of freedom (standard tables).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
         18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}


def t_critical(df: int) -> float:
    """Two-sided 95% t quantile for ``df`` degrees of freedom (next tabulated df below, so conservative)."""
    usable = [d for d in T_975 if d <= df]
    return T_975[max(usable)] if usable else float("nan")


def t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with ``df`` (integer >= 1) degrees of freedom: the finite sums of
    Abramowitz & Stegun 26.7.3 (odd df) and 26.7.4 (even df), with theta = atan(t / sqrt(df))."""
    if df < 1:
        raise ValueError(f"degrees of freedom df={df!r}: expected an integer >= 1")
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:  # odd: (2/pi) [theta + sin cos (1 + 2/3 c^2 + 2*4/(3*5) c^4 + ...)], df - 2 terms in the sum
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for j in range(1, (df - 1) // 2):
            term *= c2 * (2 * j) / (2 * j + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    term, total = 1.0, 1.0  # even: sin [1 + 1/2 c^2 + 1*3/(2*4) c^4 + ...]
    for j in range(1, df // 2):
        term *= c2 * (2 * j - 1) / (2 * j)
        total += term
    return math.sin(theta) * total


def t_upper_tail(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (a one-sided p-value; the two-sided mass
    can round a hair above 1 far out in the tail: never below 0)."""
    tail = max(0.0, (1 - t_two_sided_mass(t, df)) / 2)
    return tail if t >= 0 else 1 - tail


def t_quantile_for_z(z: float, df: int) -> float:
    """The Student-t value with ``df`` degrees of freedom whose one-sided tail equals the normal tail
    beyond ``z`` (z = 3: 0.135%): what "z standard errors" becomes when the standard deviation is itself
    estimated from df + 1 values (df = 2: 19.2; df = 5: 5.5; df = infinity: z)."""
    return t_quantile(0.5 * math.erfc(z / math.sqrt(2)), df)


def t_quantile(tail: float, df: int) -> float:
    """The t >= 0 whose one-sided upper tail P(T > t) under ``df`` degrees of freedom is ``tail`` (< 0.5)."""
    low, high = 0.0, 1.0
    while 1 - t_two_sided_mass(high, df) > 2 * tail:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if 1 - t_two_sided_mass(middle, df) > 2 * tail else (low, middle)
    return high


def sign_flip_p_value(differences: list[float]) -> float | None:
    """Exact two-sided sign-flip test of mean(differences) == 0 (None for n < 2; sampled above n=16)."""
    n = len(differences)
    if n < 2:
        return None
    observed = abs(sum(differences))
    if n <= 16:
        signs = itertools.product((1, -1), repeat=n)
        total = extreme = 0
        for pattern in signs:
            total += 1
            extreme += abs(sum(s * d for s, d in zip(pattern, differences))) >= observed - 1e-12
        return extreme / total
    import random

    rng = random.Random(0)
    draws = 20000
    extreme = sum(abs(sum(d if rng.random() < 0.5 else -d for d in differences)) >= observed - 1e-12
                  for _ in range(draws))
    return (extreme + 1) / (draws + 1)


def sample_std(values: list[float]) -> float:
    """Sample standard deviation (n - 1), computed scaled so that the figures of a diverged
    arm (finite but ~1e200) do not overflow when squared; 0.0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    deviations = [v - mean for v in values]
    scale = max(abs(v) for v in deviations)
    return scale * math.sqrt(sum((v / scale) ** 2 for v in deviations) / (n - 1)) if scale > 0 else 0.0


def paired_difference(reference: list[float], treatment: list[float]) -> dict:
    """Summary of treatment - reference over paired seeds; pairs with a non-finite side are dropped."""
    pairs = [(b, t) for b, t in zip(reference, treatment)
             if b is not None and t is not None and math.isfinite(b) and math.isfinite(t)]
    n = len(pairs)
    out = {"n": n, "reference": None, "treatment": None, "difference": None, "ci_low": None, "ci_high": None,
           "p_value": None}
    if n == 0:
        return out
    diffs = [t - b for b, t in pairs]
    mean = sum(diffs) / n
    out.update(reference=sum(b for b, _ in pairs) / n, treatment=sum(t for _, t in pairs) / n, difference=mean)
    if n >= 2:
        half = t_critical(n - 1) * sample_std(diffs) / math.sqrt(n)
        out.update(ci_low=mean - half, ci_high=mean + half, p_value=sign_flip_p_value(diffs))
    return out


# ----------------------------------------------------------------------------- many rows, one verdict

def holm(p_values: list[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected with family-wise error rate <= alpha,
    whatever the dependence between them (Holm 1979). The i-th smallest p is compared with
    alpha / (m - i); rejection stops at the first that is not below."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] > alpha / (m - rank):
            break
        rejected[index] = True
    return rejected


# ----------------------------------------------------------------------------- a rate from a count

def binomial_upper_bound(failed: int, trials: int, confidence: float = 0.95) -> float:
    """The exact one-sided upper confidence bound of a binomial rate (Clopper-Pearson) after ``failed`` of
    ``trials``: the largest rate under which ``failed`` or fewer happen with chance at least 1 - confidence
    (0 of 150 at 95%: 1.98%; bisection to 1e-12)."""
    if trials <= 0 or failed >= trials:
        return 1.0

    def tail(rate):   # P(X <= failed) under rate
        return sum(math.comb(trials, k) * rate ** k * (1 - rate) ** (trials - k) for k in range(failed + 1))
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if tail(middle) > 1 - confidence else (low, middle)
    return high
