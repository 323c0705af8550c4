"""Opening an MLflow store: SQLite files under a lock, and a new store created safely.

    client = open_client(uri)        # an MlflowClient on a store whose schema exists
    with store_lock(uri):            # around writes to a SQLite store (parallel workers)
        ...

A new SQLite store gets its tables and schema migrations from whichever process opens it first.
The processes of this package take turns under the store's file lock (``store_lock``), but an
``mlflow ui`` or ``mlflow server`` started on the same new file at the same moment does not take
it, and MLflow's schema creation is not safe against a second creator: one of the two fails with a
migration error (a table that already exists, a duplicate column, an alembic version row that
moved). ``open_client`` outlasts that race: after a failure it waits until the database file has
stopped changing (the other creator finished or gave up), then opens the store again, which
completes the schema from where it stands. It gives up when a second attempt fails with nobody
else having touched the file (a broken or foreign store: waiting would not help), or after
``CREATE_LIMIT_S``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

CREATE_LIMIT_S = 600.0   # the longest a command waits for another process to finish creating a store
QUIET_S = 3.0            # a store file unchanged for this long: nobody is creating it now
QUIET_LIMIT_S = 60.0     # the longest one wait for quiet lasts (a store in use keeps changing)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///...`` URI (None for other stores or in-memory)."""
    if not uri.startswith("sqlite:"):
        return None
    path = uri.split(":///", 1)[1] if ":///" in uri else ""
    path = path.split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(uri: str, timeout: float = 300.0):
    """Serialise writers of one SQLite store across processes (pytest-xdist workers): an fcntl lock on
    ``<db>.lock`` next to the DB file, held while the schema is created/migrated and the run is written.
    Other stores need no lock (the server serialises)."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    import fcntl

    db.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db) + ".lock", "a+") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {timeout:.0f} s for the lock {db}.lock") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def open_client(uri: str, limit: float = CREATE_LIMIT_S):
    """An ``MlflowClient`` on ``uri`` whose schema exists (created here when the store is new; see the
    module docstring for a store another process creates at the same moment). Raises the store's
    error when it cannot be opened."""
    from mlflow.tracking import MlflowClient

    db = sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    deadline = time.monotonic() + limit
    alone = 0          # failed attempts in a row with nobody else changing the file
    while True:
        try:
            with store_lock(uri):
                client = MlflowClient(tracking_uri=uri)
                client.search_experiments(max_results=1)   # creates and migrates the schema of a new store
            return client
        except Exception:
            if not db.exists() or time.monotonic() > deadline:   # no file: nobody is creating it
                raise
            alone = 0 if _wait_until_quiet(db, min(deadline, time.monotonic() + QUIET_LIMIT_S)) else alone + 1
            if alone >= 2:
                raise


def _wait_until_quiet(db: Path, until: float) -> bool:
    """Wait until the database file (with its journal) has not changed for ``QUIET_S`` seconds, or until
    the monotonic time ``until``; True when it changed meanwhile (another process is writing it)."""
    state = _file_state(db)
    changed, quiet_since = False, time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S and time.monotonic() < until:
        time.sleep(0.2)
        now = _file_state(db)
        if now != state:
            state, changed, quiet_since = now, True, time.monotonic()
    return changed


def _file_state(db: Path) -> tuple:
    """(size, modification time) of the database file and its journal files, None for a missing one."""
    out = []
    for suffix in ("", "-journal", "-wal"):
        try:
            stat = Path(f"{db}{suffix}").stat()
            out.append((stat.st_size, stat.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)
