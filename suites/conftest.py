"""Fixtures of the stress suites (``pytest suites/ -m stress``).

Each stress file keeps three kinds of tests apart, by class:

* ``TestInvariants``  - properties that hold at any scale (finite at the reference LR, loss falls, ...);
* ``TestRegression``  - the case's figures against the committed baseline of this preset and device
  (``reports/baselines/<preset>-<device>.json``; skipped where none is committed);
* ``TestPairedClaims`` - the paper's claims (gated at least as good as baseline). ``test_claim_*``
  asserts a claim only at a scale listed as established for it (see reports/effects.md); every
  other figure goes through ``test_report_*``, which prints and records the paired table and only
  asserts that the figures were computed and are finite.

The stress records themselves come from the root ``stress_record`` fixture (one run per case and
session: JSON record first, then MLflow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

BASELINE_DIR = Path("reports/baselines")
CLAIM_REPORT_DIR = Path("reports/claims")


@pytest.fixture(scope="session")
def stress_baseline(scale, device):
    """The committed regression baseline of this preset and device, or None when there is none."""
    from stability.regression import default_baseline_path, load_baseline

    path = default_baseline_path(scale, device or "cpu", BASELINE_DIR)
    return load_baseline(path) if path.is_file() else None


@pytest.fixture
def regression_check(stress_baseline, scale, device):
    """Callable: compare one stress record with the baseline; returns the CheckResult (printed)."""
    from stability.regression import check, default_baseline_path

    def run(record):
        if stress_baseline is None:
            pytest.skip(f"no committed baseline {default_baseline_path(scale, device or 'cpu', BASELINE_DIR)}: "
                        f"make one with `stability stress --preset {scale} --baseline-out PATH`")
        result = check([record], stress_baseline)
        print(result.table())
        return result

    return run


@pytest.fixture
def report_claims(record_property, scale):
    """Callable: print and record the paired table of ``figures`` for a record; assert the figures
    were computed and are finite; assert "gated at least as good" for the figures in ``asserted``.

    Returns the claim rows (``stability.stress.claim_rows``)."""
    from stability.stress import claim_rows, claims_table

    def run(record, figures: dict[str, str], asserted=(), margins=None, title=""):
        rows = claim_rows(record, figures, margins)
        table = claims_table(rows, f"{title or record['schedule']} at {scale} "
                                   f"(seeds {sorted({a['seed'] for a in record['arms']})})")
        print(table)
        CLAIM_REPORT_DIR.mkdir(parents=True, exist_ok=True)
        (CLAIM_REPORT_DIR / f"{scale}-{record['schedule']}.txt").write_text(table + "\n")
        for row in rows:
            record_property(f"paired.{row['figure']}", json.dumps(
                {k: row.get(k) for k in ("baseline", "gated", "difference", "ci_low", "ci_high", "p_value", "n",
                                         "holds")}))
        missing = [row["figure"] for row in rows if row["missing"]]
        assert not missing, f"paired figures not computed: {missing}"
        for row in rows:
            for key in ("baseline", "gated", "difference"):
                assert row[key] is not None and math.isfinite(row[key]), \
                    f"{row['figure']}: {key}={row[key]!r} is not a finite number (n={row['n']})"
        failed = [row for row in rows if row["figure"] in asserted and row["holds"] is not True]
        assert not failed, "claim 'gated at least as good as baseline' not established:\n" + table
        return rows

    return run
