"""Judging records (JSON only, no torch).

    regression.py   the merge check: records against a baseline of unperturbed runs and rounding replicates,
                    one verdict per job at a stated false-alarm rate (``stability check``)
    claims.py       a paper's claims on held-out seeds

Importing any of it imports the registry of stress cases first (``stability.cases.stress``, no torch): each
built-in case declares its figures, its primary rows and the type of its results in its own module, and the
check judges a record by them.
"""

import stability.cases.stress  # noqa: F401  (registering the cases fills the figure table)
