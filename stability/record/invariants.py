"""Model invariants of a test session: what the stress suites found to hold, or not, for the model.

    <run dir>/invariants-<worker>.jsonl      one line per invariant evaluated (worker: the pytest-xdist
                                              worker, "main" without xdist)

    {"case": "smoke/precision_ladder", "name": "mean_loss_gap_fp16", "arm": "baseline", "seed": null,
     "held": false, "value": 0.81, "bound": 0.25, "message": "...", "test": "test_precision_ladder.py::..."}

An invariant of the model (the loss falls, a low-precision rung stays within its loss gap of fp32, ...)
is a property of the model under test, not of the harness: the suites record it here instead of failing
the test, and ``stability check`` judges it against the committed baseline (which says which invariants
held for this model). The fields: ``case`` the case key as the records name it
(``<preset>/<case>[-<schedule>]``), ``name`` the invariant, ``arm`` and ``seed`` (None: over all seeds),
``held``, ``value`` and ``bound`` (numbers or None) and a one-line ``message``; ``test`` names the test
that evaluated it. No torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from stability.record.schema import RecordError

PATTERN = "invariants-*.jsonl"
FIELDS = ("case", "name", "arm", "seed", "held", "value", "bound", "message", "test")


def invariants_file(run_dir: str | Path, worker: str = "main") -> Path:
    """The invariants file of one test process (``worker``: its pytest-xdist name) in ``run_dir``."""
    return Path(run_dir) / f"invariants-{worker}.jsonl"


def _number(value):
    """A finite float, or None (JSON has no NaN or Inf)."""
    if value is None or isinstance(value, bool):
        return value
    value = float(value)
    return value if math.isfinite(value) else None


def invariant_line(case: str, name: str, arm: str | None, seed: int | None, held: bool, value=None, bound=None,
                   message: str = "", test: str = "") -> dict:
    """One invariant as written to the file (see the module docstring)."""
    return {"case": str(case), "name": str(name), "arm": arm, "seed": seed, "held": bool(held),
            "value": _number(value), "bound": _number(bound), "message": " ".join(str(message or "").split()),
            "test": str(test)}


def append_invariant(path: str | Path, line: dict) -> None:
    """Append one line to an invariants file (created with its directory), flushed at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(line, allow_nan=False) + "\n")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# what each field of an invariant holds: (test, what is expected)
FIELD_TYPES = {
    "held": (lambda v: isinstance(v, bool), "true or false"),
    "case": (lambda v: isinstance(v, str), "a case key (a string)"),
    "name": (lambda v: isinstance(v, str), "an invariant's name (a string)"),
    "arm": (lambda v: v is None or isinstance(v, str), "an arm name or null"),
    "seed": (lambda v: v is None or isinstance(v, int) and not isinstance(v, bool), "a whole number or null"),
    "value": (lambda v: v is None or isinstance(v, bool) or _is_number(v), "a number, true/false or null"),
    "bound": (lambda v: v is None or isinstance(v, bool) or _is_number(v), "a number, true/false or null"),
    "message": (lambda v: isinstance(v, str), "a string"),
    "test": (lambda v: isinstance(v, str), "a string"),
}


def check_line(line, where: str) -> dict:
    """``line`` when it is an invariant with the fields of the module docstring, each of its type; RecordError
    naming ``where`` and the field otherwise."""
    if not isinstance(line, dict):
        raise RecordError(f"{where} is not an invariant: expected a JSON object with the fields {FIELDS}")
    missing = [name for name in FIELDS if name not in line]
    if missing:
        raise RecordError(f"{where} is not an invariant: it has no {missing[0]!r} field (expected the fields "
                          f"{FIELDS})")
    extra = [name for name in line if name not in FIELDS]
    if extra:
        raise RecordError(f"{where}: {extra[0]!r} is not a field of an invariant: expected only {FIELDS}")
    for name, (fits, expected) in FIELD_TYPES.items():
        if not fits(line[name]):
            shown = repr(line[name])
            raise RecordError(f"{where}: {name} = {shown if len(shown) <= 60 else shown[:57] + '...'}: "
                              f"expected {expected}")
    return line


def read_invariants(run_dir: str | Path) -> list[dict]:
    """Every invariant recorded in ``run_dir`` (all its ``invariants-*.jsonl`` files, in file then line order);
    [] when there is none. A line that is not a JSON object with the fields of the module docstring, each
    of its type, is a RecordError naming the file, the line and the field; so is a file past the size cap
    (``stability.record.io.MAX_BYTES``)."""
    from stability.record.io import check_size, parse_json

    found = []
    for path in sorted(Path(run_dir).glob(PATTERN)):
        check_size(path, "invariants file")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise RecordError(f"invariants file {str(path)!r} cannot be read: {error}") from None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            found.append(check_line(parse_json(line, where), where))
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
    return f"{line['case']} {who}: {line['name']}{figures}" + (f" - {line['message']}" if line["message"] else "")


def _short(value) -> str:
    return "None" if value is None else f"{value:.4g}"
