"""Every registered stress case (``stability.cases.stress.CASES``: the harness's own and those extensions
registered), trained once per session at the preset, and what its record must show.

Each case declares its checks (``StressCase.checks``, in its module of ``stability.cases``); each check is
one test here, named ``<case>/<property>``. A property of the harness (the schedule followed, every run
trained, the figures consistent) fails the test; a property of the model (it completes, its loss falls, a
rung stays within its loss gap) is recorded through ``model_invariant`` and judged, with the figures, by
``stability check`` against the committed baseline once per job. The paired figures each case names are
reported (``report_figures``), never asserted. The settings' ``cases`` select cases by name (the ``case``
marker of each test).
"""

from __future__ import annotations

import pytest

from stability.cases.stress import CASES, run_case
from stability.config import ExperimentConfig, from_dict
from stability.record import clean

pytestmark = pytest.mark.stress


def each_case(cases=CASES):
    return [pytest.param(name, marks=pytest.mark.case(name), id=name) for name in cases]


def each_check():
    return [pytest.param(name, check, marks=pytest.mark.case(name), id=f"{name}/{check.__name__}")
            for name, case in CASES.items() for check in case.checks]


@pytest.fixture(scope="module")
def record_of(stress_record, report_figures):
    """Callable: ``record_of(name)`` is the case's record (trained once per session), its paired figures
    reported the first time."""
    reported = set()

    def get(name):
        record = stress_record(name)
        case = CASES[name]
        if name not in reported and case.reported is not None:
            report_figures(record, case.reported(record), case.title or name)
        reported.add(name)
        return record
    return get


@pytest.mark.parametrize("name", each_case())
def test_the_record_is_written_then_tracked(name, record_of, assert_kept):
    assert_kept(record_of(name))


@pytest.mark.parametrize(("name", "check"), each_check())
def test_the_record_shows(name, check, record_of, model_invariant):
    check(record_of(name), model_invariant)


@pytest.mark.parametrize("name", each_case([name for name, case in CASES.items() if case.rerun]))
def test_a_second_run_gives_the_same_figures(name, record_of, stress_baseline):
    """Same config and seed give the same figures on this device (what the baseline relies on): the case
    re-run in-process reproduces every arm's final figures, its loss curve and the paired table. Run where a
    baseline is committed (smoke on the CPU); elsewhere it would only cost time."""
    if stress_baseline is None:
        pytest.skip("no committed baseline for this preset and device: determinism not needed here")
    record = record_of(name)
    again = run_case(name, from_dict(ExperimentConfig, record["config"]))
    for first, second in zip(record["arms"], again["arms"]):
        assert clean(first["final"]) == clean(second["final"]), (first["arm"], first["seed"])
        assert clean(first["series"]["loss"]) == clean(second["series"]["loss"])
    assert clean(record["paired"]) == clean(again["paired"])
