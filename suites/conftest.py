"""Fixtures of the stress suites (``pytest --pyargs stability.suites -m stress``; ``pytest suites/`` here).

Every stress case is trained by one suite, ``test_stress_cases.py``, parametrized over the registered
cases (the settings' ``cases`` select them); the other stress files (faults, config properties) check the
harness's own model and detectors. What a case's record must show is declared with the case
(``StressCase.checks``), of two kinds:

* properties that hold at any scale. Those of the harness (a record written, the schedule followed, every
  run trained) fail the test. Those of the model (it completes without a non-finite event at the reference
  LR, its loss falls, a low-precision rung stays within its loss gap of fp32, ...) are recorded through the
  plugin's ``model_invariant`` fixture, never failed here: they are properties of whichever model the
  suites train (a user's model may well break one), judged by ``stability check`` against the committed
  baseline, which says which of them held for that model;
* the figures themselves are judged once per job, after the suites, by ``stability check`` against the
  committed baseline of the preset and device (``<baselines>/<preset>-<device>.json``, the settings'
  ``baselines`` directory, reports/baselines by default): one verdict with one stated false-alarm rate,
  not one per file.

Paired figures (arm - reference, with the 95% interval and the sign-flip p) are *reported*, not
tested: ``report_figures`` writes them into the session's run directory (``reported-figures.md``) and
the terminal summary. A paper claim is asserted only in ``suites/test_claims.py``, on held-out seeds.

The stress records themselves come from the plugin's ``stress_record`` fixture (one run per case and
session: JSON record first, then MLflow).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BASELINE_DIR = Path("reports/baselines")   # without settings
REPORTED = "reported-figures"


@pytest.fixture(scope="session")
def stress_baseline(preset, device, stability_settings):
    """The path of the committed regression baseline of this preset and device, or None when there is none."""
    from stability.check.baseline import default_baseline_path

    directory = stability_settings.baseline_dir if stability_settings is not None else BASELINE_DIR
    path = default_baseline_path(preset, device or "cpu", directory)
    return path if path.is_file() else None


@pytest.fixture
def assert_kept(run_dir):
    """Callable: the record is on disk in this session's run directory (purpose "regression"), then in
    MLflow as one parent run whose id the record holds."""
    from stability.record import read_record

    def check(record):
        on_disk = read_record(record["record_path"])
        assert on_disk["_path"].startswith(str(run_dir)) and (run_dir / "manifest.json").is_file()
        assert on_disk["purpose"] == "regression" and on_disk["arms"] and on_disk["paired"]["gated"]
        assert record["tracking"]["status"] == "tracked", record["tracking"]
        assert on_disk["tracking"]["parent_run_id"] == record["tracking"]["parent_run_id"]
    return check


@pytest.fixture(scope="session")
def report_figures(pytestconfig, run_dir):
    """Callable: ``report_figures(record, figures, title)`` adds the paired table of ``figures`` (each
    treatment arm - reference) to this session's reported figures (a file in the run directory, and the terminal
    summary). Reporting is not testing: nothing is asserted here."""
    from stability.check.claims import claim_rows, claims_table

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    collected = pytestconfig.stash.setdefault(_REPORTED_KEY, [])

    def add(record, figures, title):
        seeds = sorted({a["seed"] for a in record["arms"]})
        table = "\n\n".join(claims_table(claim_rows(record, figures, arm=arm), f"{title}, {arm} ({record['preset']}, "
                                                                                f"seeds {seeds})", arm=arm)
                            for arm in record.get("paired") or {"gated": {}})
        collected.append(table)
        path = Path(run_dir) / f"{REPORTED}-{worker}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as handle:
            handle.write(f"```\n{table}\n```\n\n")

    return add


_REPORTED_KEY = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, config):
    tables = config.stash.get(_REPORTED_KEY, [])
    if tables:
        terminalreporter.section("reported paired figures (not asserted)")
        for table in tables:
            terminalreporter.write_line(table)
            terminalreporter.write_line("")
