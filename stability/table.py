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
