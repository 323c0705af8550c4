"""Plain-text tables for the terminal: one number format and one column layout for every command; and
``markdown_text``, the one escape of every text the Markdown outputs quote."""

from __future__ import annotations

import math

from stability.record import REFERENCE_ARM, declared_case, usable_value


def fmt(value) -> str:
    """A figure as table text: 4 significant digits, "-" for missing, yes/no for flags."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


MARKDOWN_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\\": "\\\\", "`": "\\`", "*": "\\*",
                                  "|": "\\|", "[": "\\[", "]": "\\]"})


def markdown_text(value) -> str:
    """``value`` as Markdown that shows it as it is, on one line (in a table cell, a list item, a heading):
    ``< > &`` as HTML entities; backslash, backtick, ``*``, ``|``, ``[`` and ``]`` backslash-escaped; line
    breaks and runs of white space as one space; a leading ``#`` escaped. Every text the Markdown of the report
    and of the check's summary quotes from a record, a baseline or a check goes through here."""
    text = " ".join(str(value).split()).translate(MARKDOWN_ESCAPES)
    return "\\" + text if text.startswith("#") else text


def text_table(rows: list) -> str:
    """Left-aligned columns; the first row is the header, underlined with dashes."""
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def side_means(record: dict, arm: str, figure: str, summary: dict) -> tuple:
    """(reference, arm) means of a paired figure. A figure no seed has on both sides (the gate score: the
    reference arm has no gate) pairs nothing, so its summary holds no means; each side then shows its own mean
    over its seeds ("-" for a side without the figure)."""
    if summary.get("n"):
        return summary["reference"], summary["treatment"]

    def mean(name):
        values = [v for a in record.get("arms") or [] if a["arm"] == name
                  for v in [usable_value(a, figure)] if v is not None]
        return sum(values) / len(values) if values else None
    return mean(REFERENCE_ARM), mean(arm)


def paired_table(record: dict) -> str:
    """Per treatment arm and figure: reference mean, arm mean, difference, 95% interval, sign-flip p, n (the
    seeds paired; 0 for a figure only one side has, shown with each side's own mean)."""
    rows = [("arm", "figure", "reference", "arm", "arm-reference", "95% CI", "p", "n")]
    for arm, table in (record.get("paired") or {}).items():
        for figure, s in table.items():
            ci = f"[{fmt(s['ci_low'])}, {fmt(s['ci_high'])}]" if s["ci_low"] is not None else "-"
            reference, treatment = side_means(record, arm, figure, s)
            rows.append((arm, figure, fmt(reference), fmt(treatment), fmt(s["difference"]), ci,
                         fmt(s["p_value"]), str(s["n"])))
    status = [f"{a['arm']}/seed{a['seed']}: {a['status']}" + (
        f" at step {a['diverged_at_step']}" if a.get("diverged_at_step") is not None else "") for a in record["arms"]]
    return "\n".join([text_table(rows), "", "arms: " + ", ".join(status)])


def paired_cells(summary: dict | None) -> list[str]:
    """reference, arm, arm-reference and 95% CI cells of one paired figure ("-" when missing)."""
    if not summary:
        return ["-", "-", "-", "-"]
    ci = f"[{fmt(summary['ci_low'])}, {fmt(summary['ci_high'])}]" if summary["ci_low"] is not None else "-"
    return [fmt(summary["reference"]), fmt(summary["treatment"]), fmt(summary["difference"]), ci]


def source_text(source: dict | None) -> tuple[str, str]:
    """(library with its version, recipe) of a ladder rung or quantization scheme, for a table row."""
    if not source:
        return "-", "-"
    library = f"{source.get('library')} {source.get('version') or ''}".strip()
    recipe = str(source.get("recipe") or source.get("method") or "-")
    if source.get("emulated"):
        recipe += " (emulated)"
    return library, recipe


def quant_rows(record: dict) -> list[list[str]]:
    """Post-training quantization, one row per scheme and treatment arm: the library (and version),
    each arm's damage (quantized minus full precision, mean over seeds) in
    held-out loss, the paired difference with its 95% interval, the accuracy damage and the KL
    (full || quantized) on the probe batch, and the recipe; a skipped scheme gets one row with its
    reason. Only the header when no scheme ran."""
    entries: dict[str, dict] = {}
    for arm in record["arms"]:
        for scheme, entry in ((arm.get("quant") or {}).get("schemes") or {}).items():
            if not entries.get(scheme) or "skipped" in entries[scheme]:
                entries[scheme] = entry
    rows = [["quant scheme", "library", "arm", "reference dmg loss", "arm dmg loss", "arm-reference", "95% CI",
             "reference dmg acc", "arm dmg acc", "reference KL", "arm KL", "recipe"]]
    for scheme, entry in entries.items():
        library, recipe = source_text(entry)
        if "skipped" in entry:
            rows.append([scheme, library, "all", "skipped", "skipped"] + ["-"] * 6 + [f"skipped: {entry['skipped']}"])
            continue
        for arm, paired in (record.get("paired") or {}).items():
            loss, acc, kl = (paired.get(f"quant_{scheme}_{figure}") for figure in ("damage_loss", "damage_accuracy",
                                                                                    "kl"))
            if loss is None:
                continue
            rows.append([scheme, library, arm, *paired_cells(loss), *(paired_cells(acc)[:2]),
                         *(paired_cells(kl)[:2]), recipe])
    return rows


def quant_table(record: dict) -> str:
    """``quant_rows`` as text; empty when no scheme ran."""
    rows = quant_rows(record)
    return text_table(rows) if len(rows) > 1 else ""


def case_tables_text(record: dict) -> list[str]:
    """Each table the record's case declares (``stability.record.declared_case``: the ladder's rungs ...) as text
    under its title; a table with nothing to show is left out."""
    texts = []
    for table in declared_case(record).tables:
        rows = table.rows(record)
        if len(rows) > 1:
            texts.append(f"{table.title}\n{text_table(rows)}")
    return texts
