"""Run directories: each command or test session writes its records into a directory of its own.

    reports/runs/<UTC time>-<label>-<id>/manifest.json     what made it: label, command line, git, time
    reports/runs/<UTC time>-<label>-<id>/<record>.json     the case records of that session

``stability check`` and ``stability report`` read one session, by default the newest one under
``reports/runs``, so records of earlier runs never pile up into one comparison. A session
directory is created when its first record is written (a test session that trains nothing leaves
nothing behind). Several processes of one session (pytest-xdist workers) share the directory: the
controller picks its path and hands it to the workers in ``$STABILITY_RUN_DIR``.

``record_files`` turns command-line paths into record files: a record file is itself; a session
directory gives its records; a directory of sessions gives its newest session's records (or every
session's with ``all_sessions``). A job names its own session (``$STABILITY_RUN_DIR``, set by the
workflow) and passes it to the check; the newest session is a convenience for a person at a terminal,
and ``chosen_sessions`` says which one was taken. Two records of one (case, arm, seed, replicate, config)
are never settled by a date inside them: ``duplicate_runs`` names them and the reader refuses them.

A manifest is written whole or not at all (a temporary file linked into place). One that cannot be read
(cut short by an older writer, not a JSON object, too large) makes its directory no session for the scans
of a directory of sessions: they skip it and name it in a warning on stderr; a command given that directory
itself gets a RecordError naming the manifest.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import uuid
from pathlib import Path

from stability.record import (
    RecordError,
    case_key,
    config_fingerprint,
    git_info,
    read_record,
    record_replicate,
)
from stability.record.io import read_json

DEFAULT_ROOT = Path("reports") / "runs"
MANIFEST = "manifest.json"
ENV_VAR = "STABILITY_RUN_DIR"


def new_run_dir(root: str | Path = DEFAULT_ROOT, label: str = "run") -> Path:
    """A fresh session path ``<root>/<UTC time>-<label>-<id>`` (created with its first record)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in label)[:40] or "run"
    return Path(root) / f"{stamp}-{safe}-{uuid.uuid4().hex[:6]}"


def ensure_run_dir(path: str | Path, label: str = "run", argv: list[str] | None = None) -> Path:
    """Create the session directory and its manifest if they do not exist yet; returns the path."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    manifest = path / MANIFEST
    if not manifest.exists():
        document = {"kind": "stability-run-dir", "label": label,
                    "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                    "argv": list(sys.argv if argv is None else argv), "git": git_info(), "pid": os.getpid()}
        _write_once(manifest, json.dumps(document, indent=1) + "\n")
    return path


def _write_once(path: Path, text: str) -> None:
    """Write ``path`` unless it exists, whole or not at all: the text goes to a temporary file beside it, which
    is then linked into place, so the first writer of a shared session wins and no reader sees half a file
    (on a file system without hard links it is renamed into place: the last writer wins)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        tmp.write_text(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        except OSError:
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_manifest(path: str | Path) -> dict | None:
    """The manifest of the session directory ``path``, None when it has none; RecordError naming the file when
    it is not what ``ensure_run_dir`` writes (cut short, too large, not a JSON object, a label that is not text)."""
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return None
    what = f"run directory manifest {str(manifest)!r}"
    document = read_json(manifest, "run directory manifest")
    if not isinstance(document, dict):
        raise RecordError(f"{what} holds a JSON {type(document).__name__}: expected an object (the manifest "
                          f"`stability run` writes)")
    if not isinstance(document.get("label", ""), str):
        raise RecordError(f"{what} has label {document['label']!r}: expected the name of a command (text)")
    return document


_SKIPPED: set[Path] = set()   # the damaged manifests this process has warned about


def _readable(session: Path) -> bool:
    """True when the manifest of ``session`` can be read; else False, with a warning (once per process)."""
    try:
        read_manifest(session)
    except RecordError as error:
        if session not in _SKIPPED:
            _SKIPPED.add(session)
            print(f"warning: {error}; run directory {str(session)!r} skipped", file=sys.stderr)
        return False
    return True


def session_dir(root: str | Path = DEFAULT_ROOT, label: str = "run") -> Path:
    """The session of this process: ``$STABILITY_RUN_DIR`` when set (shared by workers), else a new one."""
    shared = os.environ.get(ENV_VAR)
    return Path(shared) if shared else new_run_dir(root, label)


def is_session(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def sessions(root: str | Path) -> list[Path]:
    """The session directories under ``root``, oldest first (names start with their UTC time); a session
    whose manifest cannot be read is skipped and named in a warning."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and is_session(p) and _readable(p)),
                  key=lambda p: (p.name[:15], p.stat().st_mtime))


def newest_session(root: str | Path) -> Path:
    """The newest session under ``root`` that holds at least one record; RecordError when there is none."""
    found = [s for s in sessions(root) if _record_files(s)]
    if not found:
        raise RecordError(f"no run directory with records under {str(root)!r}: run the stress suites "
                          f"(`pytest suites/ -m stress`) or `stability run` first")
    return found[-1]


def _record_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*.json") if p.name != MANIFEST and not p.name.startswith("."))


def record_files(paths, all_sessions: bool = False) -> list[Path]:
    """The record files named by ``paths`` (files, session directories, directories of sessions)."""
    files: list[Path] = []
    for item in paths:
        path = Path(item)
        if path.is_file():
            files.append(path)
        elif path.is_dir() and is_session(path):
            read_manifest(path)   # a damaged manifest of the directory asked for is an error, not skipped
            files.extend(_record_files(path))
        elif path.is_dir() and sessions(path):
            chosen = sessions(path) if all_sessions else [newest_session(path)]
            for session in chosen:
                files.extend(_record_files(session))
        elif path.is_dir():
            files.extend(_record_files(path))
        else:
            raise RecordError(f"{str(path)!r} does not exist: expected a record file, a run directory or a "
                              f"directory of run directories (such as reports/runs)")
    if not files:
        raise RecordError(f"no record files found in {[str(p) for p in paths]}")
    return files


def chosen_sessions(paths, all_sessions: bool = False) -> list[str]:
    """One line per directory of sessions among ``paths``: which of its sessions a reader took (the newest by
    name, or every one with ``all_sessions``), so that a verdict says what it judged."""
    lines = []
    for item in paths:
        path = Path(item)
        if path.is_dir() and not is_session(path) and sessions(path):
            if all_sessions:
                lines.append(f"read every run directory under {str(path)!r} ({len(sessions(path))})")
            else:
                lines.append(f"read run directory {str(newest_session(path))!r}, the newest under {str(path)!r} "
                             f"(name the job's own run directory to judge exactly its runs)")
    return lines


def duplicate_runs(records: list[dict]) -> list[str]:
    """One line per run that two records hold: the same (case, arm, seed, rounding replicate, config), naming both
    files. Which of them is the job's cannot be told (a date inside a file says nothing), so a reader refuses
    them."""
    first: dict[tuple, dict] = {}
    lines = []
    for index, record in enumerate(records):
        fingerprint = config_fingerprint(record["config"])
        for arm in record["arms"]:
            key = (case_key(record), arm["arm"], arm["seed"], record_replicate(record), fingerprint)
            earlier = first.setdefault(key, record)
            if earlier is not record:
                lines.append(f"case {key[0]} arm {arm['arm']} seed {arm['seed']} replicate {key[3]} is in two records, "
                             f"{earlier.get('_path') or earlier.get('id')!s} and {record.get('_path') or record.get('id')!s}: "
                             f"expected one run each (pass the run directory of one job)")
    return lines


def load_records(paths, all_sessions: bool = False) -> list[dict]:
    """Read and validate the records named by ``paths`` (see ``record_files``)."""
    return [read_record(p) for p in record_files(paths, all_sessions)]
