"""A case: the runs of one experiment (every arm at every seed, times the LRs of a sweep or the precisions
of a ladder), trained and kept.

    experiment.py   how every case trains its runs (seed by seed, every arm on the same data and init)
    case.py         what a stress case declares (``StressCase``) and the bookkeeping of its runs (``CaseRun``)
    standard.py, lr_sweep.py, lr_ramp.py, batch_ramp.py, precision_ladder.py, shock.py
                    one stress case each: its training, its figures, the checks its record must pass
    checks.py       what those checks use
    stress.py       the registry of stress cases ``CASES``
    runs.py         one run of a case (``Unit``): its name, key and stable id
    pipeline.py     the record on disk first, then the report, then MLflow
    ray_runner.py   the runs of a case as Ray tasks

What a command keeps and shows while a case trains (its session) is ``stability.session``.
"""
