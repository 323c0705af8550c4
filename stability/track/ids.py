"""The MLflow run ids of a case record, in a file beside it, written before any metric is sent.

    path = ids_file(record_path)        # <run dir>/<record>.mlflow beside <run dir>/<record>.json
    write_ids(path, ids)                # {"uri", "experiment", "experiment_id", "parent_run_id", "child_run_ids"}
    known = known_runs(record)          # the record's tracking entry, completed from its file

The live-tracking process makes the runs of a case and writes their ids here (atomically) right after
each run is made, before it sends anything to that run; the training process writes the same ids into
the record only when it next writes the record. So whenever a command stops (two Ctrl-C, kill -9), a
run that holds anything is named here, and a resume, live or ``--no-live``, continues it
(``stability.track.runs.reopen`` adopts by their tags the few runs made in the moment before their
ids reached this file). The file is named ``.mlflow``, not ``.json``: it is no record.
"""

from __future__ import annotations

import json
from pathlib import Path

from stability.record import write_json

SUFFIX = ".mlflow"
KEYS = ("uri", "experiment", "experiment_id", "parent_run_id", "child_run_ids")


def ids_file(record_path: str | Path) -> Path:
    """The ids file of the record at ``record_path``."""
    return Path(record_path).with_suffix(SUFFIX)


def write_ids(path: str | Path, ids: dict) -> None:
    """Write the ids (``KEYS``) atomically: a killed writer leaves the previous version."""
    write_json(Path(path), {key: ids.get(key) for key in KEYS})


def read_ids(path: str | Path) -> dict:
    """The ids in ``path``; {} when there is none or it cannot be read (the store's tags still find the runs)."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {key: found[key] for key in KEYS if isinstance(found, dict) and found.get(key) is not None}


def known_runs(record: dict) -> dict:
    """The runs ``record`` (read from disk: ``_path`` set) is known to have: its ``tracking`` entry with the
    ids of its ids file added ({} when neither names a run). Ids of another store than the entry's are
    left out."""
    tracking = dict(record.get("tracking") or {})
    found = read_ids(ids_file(record["_path"])) if record.get("_path") else {}
    if found and tracking.get("uri") not in (None, found.get("uri")):
        found = {}
    children = {**(tracking.get("child_run_ids") or {}), **(found.get("child_run_ids") or {})}
    known = {**tracking, **{k: v for k, v in found.items() if k != "child_run_ids"}}
    if children:
        known["child_run_ids"] = children
    if not known.get("parent_run_id") and not children:
        return {}
    known.setdefault("status", "live")
    return known
