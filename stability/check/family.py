"""The primary family at a preset: whether a row (stress case, arm, figure) is one of the rows that can fail
a job (``stability.record.figures.primary_rows()``: the rows the figure table, the cases and the extensions
declare), and which of the judged cases' primary rows are advisory at this preset.

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import fnmatch

from stability.record import REFERENCE_ARM
from stability.record import figures as fig


def in_primary_family(stress: str, arm: str, figure: str, preset: str | None = None) -> fig.Primary | None:
    """The primary-family entry that declares the row (stress case, arm or "<arm>-reference", figure) primary
    at ``preset`` (None: at any); None for an advisory row."""
    paired = arm.endswith(f"-{REFERENCE_ARM}")
    arms_match = {"all": True, "arms": not paired, "paired": paired, "reference": arm == REFERENCE_ARM}
    for entry in fig.primary_rows():
        if entry.case == stress and fnmatch.fnmatchcase(figure, entry.figure) and arms_match[entry.arms] \
                and entry.applies(preset):
            return entry
    return None


def advisory_here(preset: str, stresses: set[str]) -> list[str]:
    """Notes naming the primary rows of the judged stress cases that are advisory at ``preset``, and why."""
    return [f"{entry.case} {entry.figure} is advisory at {preset} (primary at {', '.join(entry.presets)}): "
            f"{entry.elsewhere}" for entry in fig.primary_rows() if entry.case in stresses and not entry.applies(preset)]
