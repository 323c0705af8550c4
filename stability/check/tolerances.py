"""Per-figure overrides of the floors a row is judged by (``stability check --tolerances FILE``): a table
``{figure: {floor, rel_floor}}``, in JSON or TOML, validated before anything is judged.

This module reads JSON only: no torch, no MLflow.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from stability.record import RecordError
from stability.record import figures as fig

TOLERANCE_KEYS = ("floor", "rel_floor")


def resolve_tolerances(overrides: dict | None = None) -> dict[str, dict]:
    """Per-figure overrides of ``floor`` and ``rel_floor``; an unknown figure or key is an error."""
    table: dict[str, dict] = {}
    for name, entry in (overrides or {}).items():
        if fig.figure(name) is None or fig.better(name) is None:
            raise RecordError(f"tolerance for unknown figure {name!r}: known figures and patterns are "
                              f"{', '.join(k for k, f in fig.FIGURES.items() if f.better)}")
        if not isinstance(entry, dict):
            raise RecordError(f"tolerance for {name!r} must be a table of {TOLERANCE_KEYS}, got {entry!r}")
        for key, value in entry.items():
            if key not in TOLERANCE_KEYS:
                raise RecordError(f"tolerance {name}.{key} is unknown: expected one of {TOLERANCE_KEYS}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 \
                    or not math.isfinite(value):
                raise RecordError(f"tolerance {name}.{key}={value!r}: expected a finite number >= 0")
        table[name] = dict(entry)
    return table


def load_tolerances(path) -> dict:
    """Read a JSON or TOML tolerance file ({figure: {floor, rel_floor}}) and validate it."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"tolerance file {str(path)!r} does not exist")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:  # tomllib.TOMLDecodeError, json.JSONDecodeError
        raise RecordError(f"tolerance file {str(path)!r} cannot be parsed: {error}") from None
    if not isinstance(data, dict):
        raise RecordError(f"tolerance file {str(path)!r} must hold a table of figures")
    resolve_tolerances(data)
    return data
