"""What a stress case's checks use (``StressCase.checks``; run by ``suites/test_stress_cases.py``).

    require(condition, what)                 a property of the harness: CheckFailed naming ``what`` when not
    close(a, b)                              two floats equal to a relative 1e-6 (pytest.approx's default)
    learns(record, arm, first_loss, invariant)   the model invariants of a run at the configured LR
    arm_names(record), gated(record, arm)    the arms the config trains; whether an arm's gate is on

A property of the harness (the schedule followed, every run trained, the figures consistent) fails the test;
a property of the model (it completes, its loss falls, a rung stays within its loss gap) is recorded through
the suites' ``invariant`` and judged by ``stability check`` against the baseline, never failed here.
"""

from __future__ import annotations

import math

from stability.cases.case import finite
from stability.config import GateConfig, from_dict
from stability.record import Status

LEARNS = 0.9   # the final training loss below this fraction of the first: the run learned


class CheckFailed(AssertionError):
    """A property of the harness that a case's record does not show."""


def require(condition, what: str) -> None:
    """Raise ``CheckFailed(what)`` unless ``condition``."""
    if not condition:
        raise CheckFailed(what)


def close(a, b, rel: float = 1e-6, abs_tol: float = 1e-12) -> bool:
    """``a`` and ``b`` equal within ``rel`` of ``b`` (or ``abs_tol``), as pytest.approx compares."""
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


def arm_names(record: dict) -> list[str]:
    """The names of the arms ``record``'s config trains, in its order."""
    return [arm["name"] for arm in record["config"]["arms"]]


def gated(record: dict, arm: str) -> bool:
    """Whether the config gives ``arm`` an attention gate."""
    return any(a["name"] == arm and a.get("gate") is not None and from_dict(GateConfig, a["gate"]).enabled
               for a in record["config"]["arms"])


def learns(record: dict, arm: dict, first_loss, invariant) -> None:
    """Record the model invariants of one run at the configured LR in fp32 (``arm``: its arm record, or a run
    of the case): it completed, with no non-finite event and a finite held-out loss, and its final training
    loss fell below ``LEARNS`` x ``first_loss``."""
    final, name, seed = arm["final"], arm["arm"], arm["seed"]
    invariant(record, "completed", name, seed, arm["status"] == Status.COMPLETED, message=arm["stop_reason"])
    invariant(record, "no_nonfinite_events", name, seed, final["nonfinite_events"] == 0, final["nonfinite_events"], 0)
    invariant(record, "finite_heldout_loss", name, seed, finite(final["heldout_loss"]), final["heldout_loss"])
    ratio = final["final_train_loss"] / first_loss if finite(final["final_train_loss"]) and first_loss else None
    invariant(record, "loss_falls", name, seed, ratio is not None and ratio < LEARNS, ratio, LEARNS,
              f"final training loss / first loss ({final['final_train_loss']} / {first_loss})")
