"""A case: the runs of one experiment (every arm at every seed, times the LRs of a sweep or the precisions
of a ladder), trained and kept.

    experiment.py   the paired experiment (``run_pair``) and how every case trains its runs
    stress.py       the stress cases and their registry ``CASES``
    runs.py         one run of a case (``Unit``): its name, key and stable id
    session.py      what a command keeps while it trains: the record after every run, per-step files,
                    checkpoints, replay bundles, resuming
    steplog.py      the per-step file of a run
    progress.py     progress bars on a terminal, progress lines in a log
    pipeline.py     the record on disk first, then the report, then MLflow
    ray_runner.py   the runs of a case as Ray tasks
    gpus.py         one GPU per pytest-xdist worker (imports nothing heavy)
"""
