"""The stress cases as records know them: where a case keeps its own results and how long its runs were.

    declare(RecordedCase("high_lr", result=HighLr))    # stability.cases.stress.register does it for every case
    set_case_result(record, "lr_sweep", {...})         # stability.record.build: into record["results"]["lr_sweep"]
    case_result(record, "lr_sweep")                    # read it back (a record written before the slot: its key)
    case_steps(record)                                 # the steps one run of the case trained
    declared_case(record).tables                       # the tables (and .plots) only the record's case makes

A case declares everything about itself in its own module (``stability.cases.lr_sweep`` ...), the type of its
results included. Registering it (``stability.cases.stress``) declares that type here, so a process that
that imports the registry (every command, the check, the pytest plugin) checks their results against it.
The record says the rest itself: its case under "stress" and the steps one run of it trains under
"run_steps". A reader that never imports the registry keeps its case's results unread
(``stability.record.validate``). Imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stability.record.identity import case_name
from stability.record.schema import CaseRecord, RecordError


@dataclass(frozen=True)
class CaseTable:
    """A table only one case makes, in the HTML report and under ``stability stress``: ``rows(record)`` gives
    the header, then one list of text cells per row (only the header: the record has nothing to show). name:
    the HTML table's class; title: its heading."""

    name: str
    title: str
    rows: Callable[[CaseRecord], list[list[str]]]


@dataclass(frozen=True)
class CasePlot:
    """A plot only one case makes, in the HTML report: ``png(record)`` gives PNG bytes (None: nothing to plot).
    name: its key among the record's plots (the image's id and file name); title: its heading."""

    name: str
    title: str
    png: Callable[[CaseRecord], bytes | None]


@dataclass(frozen=True)
class RecordedCase:
    """name: the case's name (``stability stress NAME``; its records say it under "stress"). result: the type
    of ``results[name]`` (a TypedDict), None for a case with no results of its own. tables, plots: what only
    this case shows of its records (``CaseTable``, ``CasePlot``)."""

    name: str
    result: type | None = None
    tables: tuple[CaseTable, ...] = ()
    plots: tuple[CasePlot, ...] = ()


# the cases this process registered (stability.cases.stress fills it), by name
RECORDED_CASES: dict[str, RecordedCase] = {}

# Records written before "run_steps" (schema 2, until it was added) said a case's run length through its
# settings: the precision ladder trained stress.ladder_steps steps per rung (0: the run's), every other case
# run.steps. Read for those records only; a record of today says "run_steps" itself.
RUN_LENGTH_SETTINGS_OF_OLD_RECORDS = {"precision_ladder": "ladder_steps"}


def declare(case: RecordedCase) -> RecordedCase:
    """Add a case's entry (a name not declared, or declared with the same entry: registering twice is one
    declaration)."""
    known = RECORDED_CASES.get(case.name)
    if known is not None and known != case:
        raise ValueError(f"stress case {case.name!r} is declared already, with another result type or output")
    RECORDED_CASES[case.name] = case
    return case


def is_declared(name: str) -> bool:
    """Whether this process registered a case called ``name``."""
    return name in RECORDED_CASES


def result_type(name: str) -> type:
    """The type of ``results[name]``; RecordError when no case of that name declared results here."""
    case = RECORDED_CASES.get(name)
    if case is None or case.result is None:
        declared = tuple(k.name for k in RECORDED_CASES.values() if k.result is not None)
        raise RecordError(f"case result {name!r} is unknown: expected a case this process registered with "
                          f"results {declared} (stability.cases.stress.register)")
    return case.result


def declared_case(record: CaseRecord) -> RecordedCase:
    """What the record's case declared (its tables and plots...); an entry declaring nothing when this
    process did not register it."""
    name = case_name(record)
    return RECORDED_CASES.get(name) or RecordedCase(name)


def case_result(record: CaseRecord, name: str) -> Any:
    """The results of the case ``name`` in ``record`` (None when it has none)."""
    results = record.get("results") or {}
    return results.get(name) if name in results else record.get(name)


def case_steps(record: CaseRecord) -> int:
    """The steps one run of ``record``'s case trained: its "run_steps" (of an older record, the setting that
    held it, ``run.steps`` otherwise)."""
    if "run_steps" in record:
        return record["run_steps"]
    config = record.get("config") or {}
    run_steps = (config.get("run") or {}).get("steps", 1)
    setting = RUN_LENGTH_SETTINGS_OF_OLD_RECORDS.get(case_name(record))
    return ((config.get("stress") or {}).get(setting) or run_steps) if setting else run_steps
