"""Judging records (JSON only, no torch).

The merge check (``stability check``): records against a baseline of unperturbed runs and rounding replicates,
one verdict per job at a stated false-alarm rate.

    regression.py   the job's check: ``check(records, baseline)``, case by case, arm by arm, seed by seed
    outcomes.py     outcomes seed by seed: a run that diverged, went non-finite or did not apply its stress
    rows.py         the statistics of one row: a figure against its seeds' replicates, its two hypotheses
    family.py       the primary family at a preset: which rows can fail a job
    verdict.py      the job's verdict: Holm over the primary rows, the exit code, table, Markdown and JSON
    tolerances.py   per-figure overrides of the floors (``--tolerances``)
    junit.py        the failed tests of the job's JUnit XML files (``--junit``)
    baseline.py     the baseline: made from records, merged case by case, written
    baseline_schema.py  its layout (TypedDicts) and reading one back: validated, loaded
    coverage.py     whether a baseline covers what the job's code judges
    calibration.py  the check's false-alarm rate, measured on a baseline's own replicates
    power.py        how far each primary row must move to fail a job alone
    compare.py      what moved between two baselines, or between a baseline and a job
    claims.py       a paper's claims on held-out seeds

Importing any of it imports the registry of stress cases first (``stability.cases.stress``, no torch): each
built-in case declares its figures, its primary rows and the type of its results in its own module, and the
check judges a record by them.

The names below are the merge check's API: what calibration, power, compare, the CLI and the validation
scripts use. The modules they come from import one another by their own names, never from this package.
"""

import stability.cases.stress  # noqa: F401  (registering the cases fills the figure table)
from stability.check.family import in_primary_family
from stability.check.junit import suite_failures
from stability.check.regression import (
    check,
    judge_cases,
    mark_duplicates,
    paired_arm,
    paired_values,
    rows_of_case,
    single_replicate,
)
from stability.check.rows import DOF_RULE, Row, judge
from stability.check.tolerances import load_tolerances, resolve_tolerances
from stability.check.verdict import DEFAULT_ALPHA, CheckResult, Outcome, decide

__all__ = [
    "DEFAULT_ALPHA", "DOF_RULE", "CheckResult", "Outcome", "Row", "check", "decide", "in_primary_family", "judge",
    "judge_cases", "load_tolerances", "mark_duplicates", "paired_arm", "paired_values", "resolve_tolerances",
    "rows_of_case", "single_replicate", "suite_failures",
]
