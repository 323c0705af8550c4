"""Which non-finite events fail the precision ladder's invariant: only those fp16's loss scaler did not
handle (a gradient overflow whose step was skipped is GradScaler doing its job)."""

import pytest

from stability.cases.precision_ladder import CASE, unhandled_events


def ladder_record(precision: str, events: list[dict]) -> dict:
    """A ladder record with one run of the reference arm at seed 0 holding ``events``."""
    return {CASE.name: {"runs": [{"precision": precision, "arm": "reference", "seed": 0, "events": events}]}}


def event(what: str, skipped: bool) -> dict:
    return {"step": 23, "what": what, "skipped": skipped, "module": None, "layer": None, "grad_params": []}


def test_a_skipped_gradient_overflow_in_fp16_is_handled():
    assert unhandled_events(ladder_record("fp16", [event("grad", True)]), "fp16", "reference", 0) == []


@pytest.mark.parametrize("precision, what, skipped", [
    ("fp16", "grad", False),        # the scaler let a non-finite step through
    ("fp16", "activation", True),   # a forward overflow: no loss scale repairs it
    ("fp16", "loss", True),
    ("bf16", "grad", True),         # no loss scaler on this rung
    ("fp8", "grad", True),
])
def test_any_other_event_is_unhandled(precision, what, skipped):
    found = event(what, skipped)
    assert unhandled_events(ladder_record(precision, [found]), precision, "reference", 0) == [found]
