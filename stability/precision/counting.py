"""What a low-precision format cannot hold: the formats' ranges and the tally of what the casts lost.

The counts stay in device tensors (no host sync per call); ``Tally.pop`` does the one sync.
"""

from __future__ import annotations

import torch

LIMITS = {
    "fp16": {"max": 65504.0, "min_normal": 2.0 ** -14, "min_subnormal": 2.0 ** -24},
    "bf16": {"max": 3.3895313892515355e38, "min_normal": 2.0 ** -126, "min_subnormal": 2.0 ** -133},
    "e4m3": {"max": 448.0, "min_normal": 2.0 ** -6, "min_subnormal": 2.0 ** -9},
    "e5m2": {"max": 57344.0, "min_normal": 2.0 ** -14, "min_subnormal": 2.0 ** -16},
}


def format_limits(dtype: str) -> dict:
    """Range of a low-precision format ("fp16", "bf16", "e4m3", "e5m2"): a dict with
    "max" (largest finite value), "min_normal" and "min_subnormal" (smallest non-zero value).
    With round-to-nearest-even, a value with |v| <= min_subnormal / 2 becomes exactly zero."""
    if dtype not in LIMITS:
        raise ValueError(f"format {dtype!r} is unknown: expected one of {tuple(LIMITS)}")
    return dict(LIMITS[dtype])



class Tally:
    """Counts of values cast to a low-precision format. The counts stay on the device
    (no host sync per call); ``pop`` does the one sync and resets. While ``counting`` is False
    the counters skip their work (the trainer counts on every ``probes.cast_every``-th step)."""

    def __init__(self) -> None:
        self.values = 0        # host int: numel is known without a sync
        self._counts = None    # int64 device tensor (3,): overflow, underflow, non-zero
        self.counting = True

    def add(self, numel: int, overflow: torch.Tensor, underflow: torch.Tensor, nonzero: torch.Tensor) -> None:
        counts = torch.stack((overflow, underflow, nonzero))
        if self._counts is None:
            self._counts = counts
        else:
            self._counts += counts
        self.values += numel

    def pop(self) -> dict[str, float]:
        """{"overflow_fraction": overflowed / all values, "underflow_fraction": zeroed / non-zero values}."""
        overflow, underflow, nonzero = (0, 0, 0) if self._counts is None else self._counts.tolist()
        values = self.values
        self.values, self._counts = 0, None
        return {"overflow_fraction": overflow / values if values else 0.0,
                "underflow_fraction": underflow / nonzero if nonzero else 0.0}

