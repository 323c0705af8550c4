"""The per-step file of one training run: a line of JSON per step, flushed as training goes.

    <run dir>/steps/<case id>/<run key>.jsonl

    {"kind": "header", "run_key": ..., "arm": ..., "seed": ..., "variant": ..., "schedule": ..., ...}
    {"step": 0, "loss": 5.61, "lr": 0.0003, "grad_norm": 1.9, "update_norm": 0.01, ...}   one per step
    ...
    {"kind": "end", "status": "completed", "record": {the arm record}}                     when it ended

A step's line is written and flushed to the operating system before the next step starts, so a
process killed with ``kill -9`` leaves every step it trained on disk (a power cut may still lose
the last few: the file is fsynced only at checkpoints and at the end). The ``end`` line holds the
finished arm record, so a resumed case takes a finished run from here instead of training it again.
NaN and Inf are written as null (strict JSON, like the record). A finished file may be gzipped
(``end(..., compress=True)``: ``<run key>.jsonl.gz``, about a tenth of the size); ``read_steplog`` reads
either. No torch import.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

from stability.record import RecordError, clean


class StepLog:
    """Appends the lines of one run's per-step file (see the module docstring).

    ``resume_after``: continue an existing file after step ``resume_after`` (the step of the checkpoint
    the run resumes from): lines of later steps, trained before a crash and trained again now, and any
    ``end`` line are dropped first. None starts the file afresh."""

    def __init__(self, path: str | Path, header: dict, resume_after: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_after is None or not self.path.is_file():
            lines = [{"kind": "header", **header}]
        else:
            kept = read_steplog(self.path)
            lines = [kept["header"] or {"kind": "header", **header}]
            lines += [row for row in kept["steps"] if row.get("step", -1) <= resume_after]
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(clean(line), allow_nan=False) + "\n" for line in lines))
        os.replace(tmp, self.path)
        self._handle = open(self.path, "a")  # noqa: SIM115  (open for the run's whole life)

    def append(self, row: dict) -> None:
        """Write one step's line and flush it to the operating system."""
        self._handle.write(json.dumps(clean(row), allow_nan=False) + "\n")
        self._handle.flush()

    def sync(self) -> None:
        """Also ask the operating system to put the file on the disk (at checkpoints)."""
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def end(self, record: dict, compress: bool = False) -> None:
        """Write the ``end`` line with the finished arm record, sync and close; ``compress``: then replace the
        file by its gzipped copy (``compressed(path)``)."""
        self.append({"kind": "end", "status": record.get("status"), "record": record})
        self.sync()
        self.close()
        if compress:
            target = compressed(self.path)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            with open(self.path, "rb") as source, gzip.open(tmp, "wb") as sink:
                shutil.copyfileobj(source, sink)
            os.replace(tmp, target)
            self.path.unlink()
            self.path = target

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()


def compressed(path: str | Path) -> Path:
    """The gzipped name of a per-step file: ``<run key>.jsonl.gz``."""
    path = Path(path)
    return path if path.suffix == ".gz" else path.with_name(path.name + ".gz")


def read_steplog(path: str | Path) -> dict:
    """{"header": dict | None, "steps": [row, ...], "end": arm record | None} of a per-step file (plain, or
    gzipped: a name ending in .gz).

    A last line cut short by a crash is skipped; a broken line anywhere else is a RecordError."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"per-step file {str(path)!r} does not exist")
    try:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise RecordError(f"per-step file {str(path)!r} cannot be read: {error}") from None
    lines = text.splitlines()
    out: dict = {"header": None, "steps": [], "end": None}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                break  # the line being written when the process died
            raise RecordError(f"per-step file {str(path)!r} line {number} is not JSON: {error}") from None
        kind = item.get("kind")
        if kind == "header":
            out["header"] = item
        elif kind == "end":
            out["end"] = item.get("record")
        else:
            out["steps"].append(item)
    return out
