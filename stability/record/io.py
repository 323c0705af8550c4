"""Reading and writing records: strict JSON, written atomically, checked both ways.

    path = write_record(record, run_dir)   # <run dir>/<config name>-<case label>-<purpose>-<id>.json
    record = read_record(path)             # record["_path"] is the file it came from

A record is checked against its schema (``stability.record.validate``) before it is written and after
it is read, so a key nobody declared never reaches the disk unnoticed, and a file from elsewhere is
refused with a RecordError naming it (exit 2).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from stability.record.build import ensure_id
from stability.record.identity import case_key
from stability.record.schema import CaseRecord, RecordError
from stability.record.upgrade import upgraded
from stability.record.validate import validate_record


def clean(value):
    """Recursively replace NaN / Inf floats with None (strict JSON); tuples become lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def record_filename(record: CaseRecord) -> str:
    """``<config name>-<case label>-<purpose>-<id>.json`` (the id is set once, so rewrites keep the name)."""
    return f"{record['name']}-{record['case_label']}-{record.get('purpose', 'regression')}-{record['id']}.json"


def _write_text(path: Path, text: str) -> Path:
    """Write ``text`` atomically: a killed writer leaves the previous version, never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _dumps(document) -> str:
    return json.dumps(document, indent=1, allow_nan=False) + "\n"


def write_json(path: Path, document) -> Path:
    """Write ``document`` as strict JSON (NaN / Inf as null), atomically."""
    return _write_text(path, _dumps(clean(document)))


def write_record(record: CaseRecord, directory: str | Path) -> Path:
    """Write the record into ``directory`` (a run directory) as strict JSON, atomically, after checking it
    against the schema (RecordError naming the key that does not fit); returns the path."""
    ensure_id(record)
    path = Path(directory) / record_filename(record)
    document = clean({k: v for k, v in record.items() if not k.startswith("_")})
    validate_record(document, f"record {str(path)!r}")
    return _write_text(path, _dumps(document))


MAX_BYTES = 64 * 1024 * 1024
"""The largest file a command reads as a record, baseline, invariants or JUnit file: 64 MiB. The largest
record the harness writes (the ``full`` preset's LR sweep, every step's series of every arm and seed) is
a few MiB; a file past the cap is refused before it is read (parsing JSON takes about 3.5x its size in
memory)."""


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _whole(text: str) -> int | float | None:
    """A JSON integer: an int when it fits 64 bits, else the float it names (None past a float's range)."""
    return int(text) if len(text.lstrip("-")) <= 18 else _finite_float(text)


def check_size(path: Path, what: str, limit: int = MAX_BYTES) -> None:
    """RecordError naming ``path`` when it is larger than ``limit`` bytes (see ``MAX_BYTES``)."""
    size = path.stat().st_size
    if size > limit:
        raise RecordError(f"{what} {str(path)!r} is {size / 2**20:.1f} MiB: larger than the {limit / 2**20:.0f} "
                          f"MiB a command reads (stability.record.io.MAX_BYTES); expected a file the harness wrote")


def parse_json(text: str, what: str):
    """A JSON document as data: NaN, Infinity and numbers past a float's range read as null (a non-finite
    value, as the writer stores it), integers past 64 bits as floats; RecordError naming ``what`` for text
    that is not JSON or nests too deep to read."""
    try:
        return json.loads(text, parse_constant=lambda _: None, parse_float=_finite_float, parse_int=_whole)
    except json.JSONDecodeError as error:
        raise RecordError(f"{what} is not valid JSON (corrupt or truncated?): {error}") from None
    except RecursionError:
        raise RecordError(f"{what} nests too deep to read: expected a document the harness wrote") from None


def read_json(path: str | Path, what: str):
    """The JSON document in ``path`` as data (``parse_json``), read only when it exists, is a file and
    is within ``MAX_BYTES``; RecordError naming ``what`` and the path otherwise."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{what} {str(path)!r} does not exist")
    check_size(path, what)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"{what} {str(path)!r} cannot be read: {error}") from None
    return parse_json(text, f"{what} {str(path)!r}")


def read_record(path: str | Path) -> CaseRecord:
    """Load and validate a record file (one of the schema before, read as this schema holds it:
    ``stability.record.upgrade``); RecordError (exit 2) when missing, corrupt, too large, of another
    schema or holding a key or figure the schema does not know."""
    path = Path(path)
    record = upgraded(read_json(path, "record"))
    validate_record(record, f"record {str(path)!r}")
    record["_path"] = str(path)
    return record


def where(record: CaseRecord, index: int = 0) -> str:
    """How to name a record in a message: its file, else its case and id."""
    return str(record.get("_path") or f"record #{index + 1} ({case_key(record)}, id {record.get('id')})")
