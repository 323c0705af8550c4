"""The merge check's earlier rule, kept to measure the present one against it on the same records.

Until the rounding replicates, a figure's band came from the baseline's seed-to-seed spread:
``band = max(floor, rel_floor * |mean|, k * s * sqrt(2 / n))`` with ``s`` the sample standard deviation of
the baseline's per-seed values and ``k = 3`` when the records hold the baseline's seeds (paired), and
``t_{n-1} * s * sqrt(1/n_b + 1/n_c)`` (Student's t of the same one-sided tail as k) when they do not; a
figure regressed when it moved in its worse direction by more than its band, every row on its own (no
family-wise control); a seed whose baseline arm completed and whose arm now diverged regressed.

``judge(records, baseline)`` applies it to a replicate baseline (schema 3) by reading only its
unperturbed runs (replicate 0), as the baselines of that rule held them. Used by validation/regression_zoo.py
and validation/power_curve.py for their "before" columns.
"""

from __future__ import annotations

import math

from stability.check import paired_arm, paired_values, single_replicate
from stability.check.baseline import case_values, regression_records
from stability.record import REFERENCE_ARM, Status, arm_names
from stability.record import figures as fig
from stability.record.stats import sample_std, t_quantile_for_z

K = 3.0


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def compare(base: dict, cur: dict, name: str) -> str:
    """"regressed", "improved" or "ok" for one figure: seed -> value maps (None: left out)."""
    entry = fig.figure(name)
    base = {s: v for s, v in base.items() if v is not None}
    lost = [s for s, v in cur.items() if v is None and s in base]
    cur = {s: v for s, v in cur.items() if v is not None}
    if not base or (not cur and not lost):
        return "ok"
    if lost:
        return "regressed"
    spread = sample_std(list(base.values()))
    common = sorted(set(base) & set(cur))
    if common and set(cur) <= set(base):
        delta = _mean(cur[s] - base[s] for s in common)
        band = K * spread * math.sqrt(2.0 / len(common))
    else:
        delta = _mean(cur.values()) - _mean(base.values())
        multiplier = t_quantile_for_z(K, len(base) - 1) if len(base) > 1 else K
        band = multiplier * spread * math.sqrt(1.0 / len(base) + 1.0 / len(cur))
    band = max(entry.floor, entry.rel_floor * abs(_mean(base.values())), band)
    worse = delta if entry.better == "lower" else -delta
    return "regressed" if worse > band else ("improved" if -worse > band else "ok")


def _reference(arm: dict) -> dict:
    """A baseline arm reduced to its unperturbed runs (replicate 0): seed -> value."""
    def first(per_seed):
        return {s: runs["0"] for s, runs in per_seed.items() if "0" in runs}
    return {"status": first(arm["status"]), "diverged_at_step": first(arm["diverged_at_step"]),
            "figures": {name: first(values) for name, values in arm["figures"].items()}}


def judge(records: list[dict], baseline: dict) -> list[str]:
    """The rows the seed-spread rule calls regressed ("case arm figure"); empty: the job passes."""
    records = regression_records(records)[0]
    regressed = []
    for key, case in sorted(case_values(records).items()):
        base = baseline["cases"].get(key)
        if base is None:
            continue
        current = single_replicate(case, key)
        reference = {arm: _reference(entry) for arm, entry in base["arms"].items()}
        for arm in arm_names([{"arm": a} for a in {**reference, **current}]):
            b, c = reference.get(arm), current.get(arm)
            if b is None or c is None:
                continue
            for seed, status in c["status"].items():
                if status == Status.DIVERGED and b["status"].get(seed) == Status.COMPLETED:
                    regressed.append(f"{key} {arm} status")
            names = fig.judged(set(b["figures"]) | set(c["figures"]))
            for name in names:
                if compare(b["figures"].get(name, {}), c["figures"].get(name, {}), name) == "regressed":
                    regressed.append(f"{key} {arm} {name}")
            if arm == REFERENCE_ARM:
                continue
            for name in names:
                base_d, cur_d = paired_values(reference, arm, name, False), paired_values(current, arm, name, False)
                if compare(base_d, cur_d, name) == "regressed":
                    regressed.append(f"{key} {paired_arm(arm)} {name}")
    return regressed
