"""A command's session: what a training command keeps and shows while it trains, apart from what it trains.

    session.py      the record after every run, per-step files, checkpoints, replay bundles, resuming
    steplog.py      the per-step file of a run
    progress.py     progress bars on a terminal, progress lines in a log
"""
