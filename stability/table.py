"""Plain-text tables for the terminal: one number format and one column layout for every command."""

from __future__ import annotations

import math


def fmt(value) -> str:
    """A figure as table text: 4 significant digits, "-" for missing, yes/no for flags."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def text_table(rows: list) -> str:
    """Left-aligned columns; the first row is the header, underlined with dashes."""
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def paired_table(record: dict) -> str:
    """Per treatment arm and figure: baseline mean, arm mean, difference, 95% interval, sign-flip p, n."""
    rows = [("arm", "figure", "baseline", "arm", "arm-baseline", "95% CI", "p", "n")]
    for arm, table in (record.get("paired") or {}).items():
        for figure, s in table.items():
            ci = f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" if s["ci_low"] is not None else "-"
            rows.append((arm, figure, fmt(s["baseline"]), fmt(s["treatment"]), fmt(s["difference"]), ci,
                         fmt(s["p_value"]), str(s["n"])))
    status = [f"{a['arm']}/seed{a['seed']}: {a['status']}" + (
        f" at step {a['diverged_at_step']}" if a.get("diverged_at_step") is not None else "") for a in record["arms"]]
    return "\n".join([text_table(rows), "", "arms: " + ", ".join(status)])


def quant_table(record: dict) -> str:
    """Post-training quantization: per scheme and treatment arm, each arm's damage (quantized minus full
    precision, mean over seeds) in held-out loss and accuracy, the paired difference of the loss damage,
    and the KL(full || quantized) on the probe batch. Empty when no scheme ran."""
    schemes = list(dict.fromkeys(scheme for a in record["arms"]
                                 for scheme in ((a.get("quant") or {}).get("schemes") or {})))
    if not schemes:
        return ""
    rows = [("quant scheme", "arm", "baseline dmg loss", "arm dmg loss", "arm-baseline", "95% CI",
             "baseline dmg acc", "arm dmg acc", "baseline KL", "arm KL")]
    skipped = []
    for scheme in schemes:
        reasons = {a["quant"]["schemes"][scheme].get("skipped") for a in record["arms"]
                   if scheme in ((a.get("quant") or {}).get("schemes") or {})}
        reasons.discard(None)
        for arm, paired in (record.get("paired") or {}).items():
            loss, acc, kl = (paired.get(f"quant_{scheme}_{figure}") for figure in ("damage_loss", "damage_accuracy",
                                                                                    "kl"))
            if loss is None:
                continue
            ci = f"[{fmt(loss['ci_low'])}, {fmt(loss['ci_high'])}]" if loss["ci_low"] is not None else "-"
            rows.append((scheme, arm, fmt(loss["baseline"]), fmt(loss["treatment"]), fmt(loss["difference"]), ci,
                         fmt(acc["baseline"] if acc else None), fmt(acc["treatment"] if acc else None),
                         fmt(kl["baseline"] if kl else None), fmt(kl["treatment"] if kl else None)))
        if reasons:
            skipped.append(f"{scheme}: skipped ({'; '.join(sorted(reasons))})")
    return "\n".join(([text_table(rows)] if len(rows) > 1 else []) + skipped)
