"""A replayed training step as text (``stability.train.replay.replay`` makes the report): what was replayed,
whether the loss and gradient norm came out bit for bit, and per module the largest |output|, the gradient
norm and the largest attention logit."""

from __future__ import annotations

import math

from stability.report.tables import text_table


def _number(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def replay_text(report: dict) -> str:
    """The report as text: what was replayed, whether it reproduced, then one row per module."""
    reasons = ", ".join(report["reasons"]) or "flagged"
    severity = report.get("severity")
    lines = [f"replay of {report['bundle']}",
             f"  run {report['name']} (case {report['case']}), step {report['step']}: {reasons}"
             + (f" (severity {severity:.3g} std)" if isinstance(severity, float) and math.isfinite(severity) else ""),
             *(f"  note: {note}" for note in report["notes"])]
    for what in ("loss", "grad_norm"):
        value, recorded = report[what], report[f"recorded_{what}"]
        verdict = "reproduced exactly" if report[f"reproduced_{what}"] else (
            f"NOT reproduced (differs by {value - recorded:.3g})" if value is not None and recorded is not None
            else "NOT reproduced")
        lines.append(f"  {what.replace('_', ' '):9s} {value!r:>24}   recorded {recorded!r:>24}   {verdict}")
    lines.append(f"  first module that went non-finite: {report['first_nonfinite_module'] or 'none'}"
                 + (f"; non-finite gradients in {', '.join(report['nonfinite_grads'])}"
                    if report["nonfinite_grads"] else ""))
    if report["update_norm"] is not None:
        lines.append(f"  update norm ||W_after - W_before|| {_number(report['update_norm']['global'])} (per group: "
                     + ", ".join(f"{k} {_number(v)}" for k, v in report["update_norm"].items() if k != "global")
                     + ")")
    rows = [[m["module"], _number(m["max_abs_output"]), _number(m["grad_norm"]), _number(m["attn_logit_max"])]
            for m in report["modules"]]
    lines += ["", text_table([["module", "max |output|", "grad norm", "attn logit max"], *rows])]
    return "\n".join(lines)
