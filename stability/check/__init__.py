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
    baseline.py     the baseline: made from records, validated, loaded, written
    coverage.py     whether a baseline covers what the job's code judges
    calibration.py  the check's false-alarm rate, measured on a baseline's own replicates
    power.py        how far each primary row must move to fail a job alone
    compare.py      what moved between two baselines, or between a baseline and a job
    claims.py       a paper's claims on held-out seeds

Importing any of it imports the registry of stress cases first (``stability.cases.stress``, no torch): each
built-in case declares its figures, its primary rows and the type of its results in its own module, and the
check judges a record by them.

"""

import stability.cases.stress  # noqa: F401  (registering the cases fills the figure table)
