"""Judging records (JSON only, no torch).

    regression.py   the merge check: records against a baseline of reference runs and rounding replicates,
                    one verdict per job at a stated false-alarm rate (``stability check``)
    claims.py       a paper's claims on held-out seeds
"""
