"""MLflow: the copy of a record in a tracking store (never imported by the trainer).

    runs.py     a finished case as one parent run and a child run per arm and seed; fetching records back
    live.py     the per-step metrics while training, from a separate process
    store.py    opening a store, a new SQLite store created beside another process included
    ids.py      the run ids of a case record, in a file beside it, written before anything is sent
"""
