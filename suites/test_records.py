"""Every stress case leaves its JSON record on disk first, then exactly one MLflow parent run."""

from __future__ import annotations

import pytest

from stability.stress import CASES_ORDER
from stability.tracking import read_record

pytestmark = pytest.mark.stress


@pytest.mark.parametrize("kind", CASES_ORDER)
def test_record_written_then_tracked(stress_record, kind):
    record = stress_record(kind)
    on_disk = read_record(record["record_path"])
    assert on_disk["schedule"].startswith(kind) and on_disk["arms"] and on_disk["paired"]
    assert record["tracking"]["status"] == "tracked", record["tracking"]
    assert on_disk["tracking"]["parent_run_id"] == record["tracking"]["parent_run_id"]
