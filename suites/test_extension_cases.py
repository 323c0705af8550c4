"""The stress cases extensions registered (``stability.cases.stress.register``) that have no suite file of their
own: each is trained once per session, on the preset, and its record is kept like every case's; its figures
are judged by ``stability check`` after the suites. The settings' ``cases`` select them by name, as they
select the suites' own cases. Without such a case (no extension registered one) the file holds no test."""

from __future__ import annotations

from pathlib import Path

import pytest

from stability.plugin.pytest_plugin import suite_cases
from stability.record.cases import RECORDED_CASES

pytestmark = pytest.mark.stress
REGISTERED = [name for name in RECORDED_CASES if name not in suite_cases(Path(__file__).parent)]

if REGISTERED:
    @pytest.mark.parametrize("case", [pytest.param(name, marks=pytest.mark.case(name)) for name in REGISTERED])
    def test_the_registered_case_trains_and_its_record_is_kept(case, stress_record, assert_kept):
        assert_kept(stress_record(case))
