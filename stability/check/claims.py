"""Paired claims: does an arm do at least as well as the baseline on a figure, over held-out seeds?

A claim of the paper ("the gate lowers M-Act") is tested as a non-inferiority (or superiority)
test on the 95% interval of arm - reference from ``record["paired"]``: it *holds* when the whole
interval is on the better side of the margin, *fails* when the whole interval is on the worse side,
and is *undecided* otherwise or with fewer than two seeds. The exact sign-flip p-value is reported
beside it.

A claim is asserted only on seeds that were not used to find it: the suites name the discovery
seeds and the held-out confirmation seeds of each claim, and ``held_out`` refuses a record whose
seeds overlap the discovery seeds.
"""

from __future__ import annotations

from stability.record import REFERENCE_ARM, paired_summary
from stability.record import figures as fig
from stability.report.tables import fmt, text_table


def held_out(record: dict, discovery_seeds) -> list[int]:
    """The record's seeds, after checking none of them was used to discover the claim."""
    seeds = sorted({arm["seed"] for arm in record["arms"]})
    overlap = sorted(set(seeds) & set(discovery_seeds))
    if overlap:
        raise ValueError(f"seeds {overlap} were used to discover this claim: a claim is asserted only on "
                         f"held-out seeds (discovery seeds {sorted(discovery_seeds)})")
    return seeds


def claim_rows(record: dict, figures, arm: str = "gated", margins: dict[str, float] | None = None,
               reference: str = REFERENCE_ARM, expect: str = "better") -> list[dict]:
    """Per figure of ``figures`` (names; directions from ``stability.record.figures``): the paired summary of
    ``arm`` - ``reference`` (the reference arm, or another arm such as the gate a control is compared with;
    the row names it under "against" and holds its mean under "reference") plus ``holds`` (True, False or
    None as in the module docstring). ``expect="worse"`` turns the claim around: it holds when the arm is
    worse than the reference (a control that takes an effect back)."""
    if expect not in ("better", "worse"):
        raise ValueError(f"expect={expect!r} is invalid: expected 'better' or 'worse'")
    margins = margins or {}
    table = record.get("paired") if reference == REFERENCE_ARM else paired_summary(record["arms"], reference)
    paired = (table or {}).get(arm) or {}
    rows = []
    for name in figures:
        better = fig.better(name)
        summary = paired.get(name)
        if summary is None or better is None:
            rows.append({"figure": name, "better": better, "n": 0, "holds": None, "missing": True})
            continue
        margin = margins.get(name, 0.0)
        low, high = summary.get("ci_low"), summary.get("ci_high")
        holds = None
        if expect == "worse":
            better = "higher" if better == "lower" else "lower"
        if low is not None and high is not None:
            if better == "lower":
                holds = True if high <= margin else (False if low > margin else None)
            else:
                holds = True if low >= -margin else (False if high < -margin else None)
        rows.append({"figure": name, "better": better, "margin": margin, "holds": holds, "missing": False,
                     "arm": arm, "against": reference,
                     **{k: summary.get(k) for k in ("reference", "treatment", "difference", "ci_low", "ci_high",
                                                    "p_value", "n")}})
    return rows


def claims_table(rows: list[dict], title: str = "", arm: str = "gated", reference: str = REFERENCE_ARM) -> str:
    """A plain-text table of ``claim_rows`` (``better``: the direction the claim expects)."""
    header = ("figure", "claimed", reference, arm, f"{arm}-{reference}", "95% CI", "sign-flip p", "n", "holds")
    lines = [header]
    for row in rows:
        if row.get("missing"):
            lines.append((row["figure"], str(row["better"]), "-", "-", "-", "-", "-", "0", "not measured"))
            continue
        ci = f"[{fmt(row['ci_low'])}, {fmt(row['ci_high'])}]" if row["ci_low"] is not None else "-"
        verdict = {True: "yes", False: "NO", None: "undecided" if row["n"] and row["n"] >= 2 else "n<2"}[row["holds"]]
        lines.append((row["figure"], row["better"], fmt(row["reference"]), fmt(row["treatment"]),
                      fmt(row["difference"]), ci, fmt(row["p_value"]), str(row["n"]), verdict))
    return "\n".join(([title] if title else []) + [text_table(lines)])
