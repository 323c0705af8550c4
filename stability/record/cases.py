"""The stress cases as records know them: each case's name, the type of its own results and the run length
the merge check uses, declared once (``RECORDED_CASES``).

    declare(RecordedCase("high_lr", result=HighLr))     # stability.cases.stress.register does it for a case
    set_case_result(record, "lr_sweep", {...})      # stability.record.build: into record["results"]["lr_sweep"]
    case_result(record, "lr_sweep")                 # read it back (a record written before the slot: its key)
    case_steps(record)                              # the steps one run of the case trained

A case's own results live in one open slot of the record, ``results[<case>]``, checked against the type its
case declared (a ``TypedDict`` of ``stability.record.schema``, or your own). Records written before the slot
hold them under a top-level key named after the case; ``case_result`` reads both. Imports no torch: the
check and the report read this table, and the stress case registry (``stability.cases.stress``) fills it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stability.record.identity import case_name
from stability.record.schema import (
    BatchRamp,
    CaseRecord,
    LrRamp,
    LrSweep,
    PrecisionLadder,
    RecordError,
    Shock,
)


@dataclass(frozen=True)
class RecordedCase:
    """name: the case's name (``stability stress NAME``; its records say it under "stress"). result: the type
    of ``results[name]`` (a TypedDict), None for a case with no results of its own. steps: the run length
    of one of its runs, from the record's config (a dict), None for ``run.steps``."""

    name: str
    result: type | None = None
    steps: Callable[[dict], int] | None = None

    def run_steps(self, config: dict) -> int:
        if self.steps is not None:
            return self.steps(config)
        return (config.get("run") or {}).get("steps", 1)


def ladder_steps(config: dict) -> int:
    """The precision ladder trains ``stress.ladder_steps`` steps per rung (0: the run's own)."""
    return (config.get("stress") or {}).get("ladder_steps") or (config.get("run") or {}).get("steps", 1)


RECORDED_CASES: dict[str, RecordedCase] = {case.name: case for case in (
    RecordedCase("standard"),
    RecordedCase("lr_sweep", LrSweep),
    RecordedCase("lr_ramp", LrRamp),
    RecordedCase("batch_ramp", BatchRamp),
    RecordedCase("precision_ladder", PrecisionLadder, ladder_steps),
    RecordedCase("shock", Shock),
)}


def declare(case: RecordedCase) -> RecordedCase:
    """Add a case's entry (a name not declared, or declared with the same entry: registering twice is one
    declaration)."""
    known = RECORDED_CASES.get(case.name)
    if known is not None and known != case:
        raise ValueError(f"stress case {case.name!r} is declared already, with another result type or run length")
    RECORDED_CASES[case.name] = case
    return case


def result_type(name: str) -> type:
    """The type of ``results[name]``; RecordError when no case of that name declared results."""
    case = RECORDED_CASES.get(name)
    if case is None or case.result is None:
        declared = tuple(k.name for k in RECORDED_CASES.values() if k.result is not None)
        raise RecordError(f"case result {name!r} is unknown: expected a case that declared results {declared} "
                          f"(stability.record.cases)")
    return case.result


def case_result(record: CaseRecord, name: str) -> Any:
    """The results of the case ``name`` in ``record`` (None when it has none)."""
    results = record.get("results") or {}
    return results.get(name) if name in results else record.get(name)


def case_steps(record: CaseRecord) -> int:
    """The steps one run of ``record``'s case trained (its declared run length; ``run.steps`` otherwise)."""
    config = record.get("config") or {}
    case = RECORDED_CASES.get(case_name(record))
    return (case or RecordedCase("")).run_steps(config)
