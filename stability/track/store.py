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
completes the schema from where it stands. A creator that failed in the middle of a migration can
leave the schema half made (a ``_alembic_tmp_*`` table of SQLite's copy-and-rename migrations, a
version row ahead of the tables); when a second attempt fails with nobody else touching the file and
the store holds nothing (no run, no experiment besides MLflow's Default, only MLflow's own tables),
its tables are dropped under the lock and the schema made again. A store that holds anything, or a file that is not an
MLflow store, is never touched: the error is raised (as after ``CREATE_LIMIT_S``).
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
    remade = False     # a half-made empty store is made again once at most
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
                if remade:
                    raise
                with store_lock(uri):
                    remade = _clear_if_half_made(db)
                if not remade:
                    raise
                alone = 0


def _clear_if_half_made(db: Path) -> bool:
    """Drop every table of the SQLite file ``db`` when it is an MLflow store that holds nothing: an
    ``alembic_version`` table, only MLflow's own tables (or ``_alembic_tmp_*`` leftovers of a migration),
    no run, no experiment but MLflow's Default. The file stays (other processes and MLflow's cached
    engine keep the same file); the next open creates the schema afresh. True when cleared; False (file
    untouched) otherwise."""
    import sqlite3

    import mlflow.store.model_registry.dbmodels.models  # registers the registry's tables
    import mlflow.store.tracking.dbmodels.models  # noqa: F401  (registers the tracking tables)
    from mlflow.store.db.base_sql_model import Base

    known = set(Base.metadata.tables) | {"alembic_version"}
    try:
        with contextlib.closing(sqlite3.connect(db)) as connection:
            tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            if "alembic_version" not in tables or any(
                    t not in known and not t.startswith("_alembic_tmp_") for t in tables):
                return False
            for table, most in (("runs", 0), ("experiments", 1)):
                if table in tables and connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] > most:
                    return False
            connection.execute("PRAGMA foreign_keys = OFF")
            for table in tables:
                connection.execute(f'DROP TABLE IF EXISTS "{table}"')
            connection.commit()
    except sqlite3.Error:
        return False
    return True


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
