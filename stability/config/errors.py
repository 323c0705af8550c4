"""ConfigError and the small checks every config uses in its ``__post_init__``."""

from __future__ import annotations

import math
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and what was expected."""


def check(condition: bool, name: str, value: Any, expected: str) -> None:
    """ConfigError "<name>=<value> is invalid: expected <expected>" unless ``condition``."""
    if not condition:
        raise ConfigError(f"{name}={value!r} is invalid: expected {expected}")


def positive_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_strength(value: Any, name: str, what: str) -> None:
    """A stabilizer's strength: a positive finite number, or 0 for off."""
    check(is_number(value) and value >= 0, name, value, f"a positive finite {what} (0 turns it off)")
