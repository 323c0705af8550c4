"""A case: the runs of one experiment (every arm at every seed, times the LRs of a sweep or the precisions
of a ladder), trained and kept.

    experiment.py   the paired experiment (``run_pair``) and how every case trains its runs
    stress.py       the stress cases and their registry ``CASES``
    runs.py         one run of a case (``Unit``): its name, key and stable id
    pipeline.py     the record on disk first, then the report, then MLflow
    ray_runner.py   the runs of a case as Ray tasks

What a command keeps and shows while a case trains (its session) is ``stability.session``.
"""
