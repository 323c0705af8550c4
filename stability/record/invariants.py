"""Model invariants of a test session: what the stress suites found to hold, or not, for the model.

    <run dir>/invariants-<worker>.jsonl      one line per invariant evaluated (worker: the pytest-xdist
                                              worker, "main" without xdist)

    {"case_key": "smoke/precision_ladder", "name": "mean_loss_gap_fp16", "arm": "reference", "seed": null,
     "held": false, "value": 0.81, "bound": 0.25, "message": "...", "test": "test_precision_ladder.py::..."}

An invariant of the model (the loss falls, a low-precision rung stays within its loss gap of fp32, ...)
is a property of the model under test, not of the harness: the suites record it here instead of failing
the test, and ``stability check`` judges it against the committed baseline (which says which invariants
held for this model). The fields: ``case_key`` the case key as the records name it
(``<config name>/<case label>``: ``stability.record.case_key``), ``name`` the invariant, ``arm`` and ``seed``
(None: over all seeds), ``held``, ``value`` and ``bound`` (numbers or None) and a one-line ``message``; ``test`` names the test
that evaluated it. Lines written before the field was called ``case_key`` ("case") and before the reference arm
was named "reference" read with today's names (``stability.record.upgrade.upgraded_invariant``). No torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from stability.record.io import check_size, parse_json
from stability.record.schema import RecordError
from stability.record.upgrade import upgraded_invariant

PATTERN = "invariants-*.jsonl"
NULL = type(None)
FIELD_TYPES = {"case_key": ((str,), "text"), "name": ((str,), "text"), "arm": ((str, NULL), "text or null"),
               "seed": ((int, NULL), "an integer or null"), "held": ((bool,), "true or false"),
               "value": ((int, float, NULL), "a number or null"), "bound": ((int, float, NULL), "a number or null"),
               "message": ((str,), "text"), "test": ((str,), "text")}
"""Each field of an invariant line: the Python types it reads as, and in words."""
FIELDS = tuple(FIELD_TYPES)


def invariants_file(run_dir: str | Path, worker: str = "main") -> Path:
    """The invariants file of one test process (``worker``: its pytest-xdist name) in ``run_dir``."""
    return Path(run_dir) / f"invariants-{worker}.jsonl"


def _number(value):
    """A finite float, or None (JSON has no NaN or Inf); true and false as 1.0 and 0.0 (the reader takes numbers)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def invariant_line(case_key: str, name: str, arm: str | None, seed: int | None, held: bool, value=None, bound=None,
                   message: str = "", test: str = "") -> dict:
    """One invariant as written to the file (see the module docstring)."""
    return {"case_key": str(case_key), "name": str(name), "arm": arm, "seed": seed, "held": bool(held),
            "value": _number(value), "bound": _number(bound), "message": " ".join(str(message or "").split()),
            "test": str(test)}


def append_invariant(path: str | Path, line: dict) -> None:
    """Append one line to an invariants file (created with its directory), flushed at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(line, allow_nan=False) + "\n")


def _fits(value, types: tuple) -> bool:
    """Whether ``value`` is one of ``types`` (true and false are no numbers here)."""
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


def check_line(line, where: str) -> dict:
    """``line`` when it is an invariant (a JSON object with every field of ``FIELD_TYPES``, each of its type);
    RecordError naming ``where`` (file:line), the bad fields and what was expected otherwise."""
    if not isinstance(line, dict):
        raise RecordError(f"{where} is not an invariant: expected a JSON object with the fields {FIELDS}, found "
                          f"a JSON {type(line).__name__}")
    missing = [name for name in FIELDS if name not in line]
    if missing:
        raise RecordError(f"{where} is not an invariant: expected the fields {FIELDS} (missing {missing})")
    extra = [name for name in line if name not in FIELD_TYPES]
    if extra:
        raise RecordError(f"{where} is not an invariant: expected only the fields {FIELDS} (found {extra[0]!r})")
    wrong = [f"{name} {words} (found {_shown(line[name])})" for name, (types, words) in FIELD_TYPES.items()
             if not _fits(line[name], types)]
    if wrong:
        raise RecordError(f"{where} is not an invariant: expected {', '.join(wrong)}")
    return line


def _shown(value) -> str:
    """``value`` as JSON, cut to 60 characters."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_invariants(run_dir: str | Path) -> list[dict]:
    """Every invariant recorded in ``run_dir`` (all its ``invariants-*.jsonl`` files, in file then line order);
    [] when there is none. A file past the size cap (``stability.record.io.MAX_BYTES``) or not UTF-8, or a line
    that is not a JSON object with the fields of ``FIELD_TYPES`` is a RecordError naming the file and line."""
    found = []
    for path in sorted(Path(run_dir).glob(PATTERN)):
        check_size(path, "invariants file")
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise RecordError(f"invariants file {str(path)!r} cannot be read: {error}") from None
        for number, text in enumerate(content.split("\n"), 1):
            if text.strip():
                where = f"{path}:{number}"
                found.append(check_line(upgraded_invariant(parse_json(text, where)), where))
    return found


def failed(invariants: list[dict]) -> list[dict]:
    """The invariants that did not hold."""
    return [line for line in invariants if not line["held"]]


def describe(line: dict) -> str:
    """One line naming an invariant and what was found: case, arm and seed, name, value against bound."""
    who = f"{line['arm']}" + (f" seed {line['seed']}" if line["seed"] is not None else "")
    figures = ""
    if line["value"] is not None or line["bound"] is not None:
        figures = f" ({_short(line['value'])} against bound {_short(line['bound'])})"
    return f"{line['case_key']} {who}: {line['name']}{figures}" + (f" - {line['message']}" if line["message"] else "")


def _short(value) -> str:
    return "None" if value is None else f"{value:.4g}"
