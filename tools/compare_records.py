"""Compare every number of two sets of run directories: the proof that a refactor changed no figure.

    python tools/compare_records.py BEFORE AFTER [--ignore KEY ...] [--rename OLD=NEW ...]

BEFORE and AFTER are folders holding run directories (or records) written by the same commands
before and after a change. Records are matched by what they are (name, case label, purpose,
case, config and the command's folder below BEFORE / AFTER), never by their random ids; per-step files
(``steps/<case id>/<run name>-<run hash>.jsonl``) by their run name. Every value below them is
compared exactly (floats bit for bit, NaN equal to NaN) except the keys that say when, where and how
fast something ran (``VOLATILE``: times, durations, ids, paths, git, host details) and the keys named
with ``--ignore`` (left out everywhere, in what matches records too: a config field added by the change,
say, or a record key whose value changed on purpose). ``--results-slot`` reads a case's results in
``results[case]`` as the top-level key ``case`` that held them before the slot. ``--rename OLD=NEW`` reads
a key OLD of BEFORE's documents (at every level, per-step files included) as NEW: a key renamed on purpose,
its value still compared. ``--upgrade`` reads BEFORE's records as the current schema holds them
(``stability.record.upgraded``: a capture made before a schema change) and its per-step files with the
same run names (``stability.record.upgrade.upgraded_run``). Exit 0 when nothing differs, 1 otherwise; the
summary line says how many numbers were compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import sys
from pathlib import Path

# keys whose values are about when, where or how fast a run happened, never what it measured
VOLATILE = {
    "created_at", "id", "case_id", "git", "env", "timing", "started_at", "ended_at", "wall_seconds",
    "train_seconds", "probe_seconds", "eval_seconds", "tokens_per_second", "tracking_seconds", "setup_seconds",
    "record_path", "steps_file", "checkpoint_dir", "path", "file", "tracking", "seconds", "elapsed",
    "run_dir", "_path", "pid", "hostname", "node", "address", "worker", "ray", "attempts", "duration_s",
    "time", "wall",
}


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


def same_number(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        return (math.isnan(a) and math.isnan(b)) or bits(a) == bits(b)
    return a == b


class Comparison:
    def __init__(self, ignore: set[str]):
        self.ignore = VOLATILE | ignore
        self.numbers = 0
        self.differences: list[str] = []

    def walk(self, a, b, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key in self.ignore:
                    continue
                if key not in a or key not in b:
                    self.differences.append(f"{where}.{key}: only {'after' if key not in a else 'before'}")
                    continue
                self.walk(a[key], b[key], f"{where}.{key}")
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.differences.append(f"{where}: {len(a)} items before, {len(b)} after")
            for index, (x, y) in enumerate(zip(a, b, strict=False)):
                self.walk(x, y, f"{where}[{index}]")
        elif isinstance(a, (int, float)) and not isinstance(a, bool) and isinstance(b, (int, float)) \
                and not isinstance(b, bool):
            self.numbers += 1
            if not same_number(a, b):
                self.differences.append(f"{where}: {a!r} before, {b!r} after")
        elif a != b:
            self.differences.append(f"{where}: {a!r} before, {b!r} after")


def without(value, ignore: set[str]):
    """``value`` with the keys in ``ignore`` left out, at every level."""
    if isinstance(value, dict):
        return {k: without(v, ignore) for k, v in value.items() if k not in ignore}
    if isinstance(value, list):
        return [without(v, ignore) for v in value]
    return value


def record_key(root: Path, path: Path, record: dict, ignore: set[str] = frozenset()) -> str:
    command = path.relative_to(root).parts[0]
    config = hashlib.sha256(json.dumps(without(record.get("config"), ignore), sort_keys=True).encode()).hexdigest()[:8]
    fields = [record.get(key) for key in ("name", "case_label", "purpose", "case") if key not in ignore]
    return "/".join(str(x) for x in (command, *fields, config))


def unslotted(document: dict) -> dict:
    """A record with its case results (``results[case]``) back under top-level keys named after the case: the
    layout records had before the results slot."""
    results = document.get("results") or {}
    return {**{k: v for k, v in document.items() if k != "results"}, **results}


def renamed(value, names: dict[str, str]):
    """``value`` with every key in ``names`` replaced by its new name, at every level."""
    if isinstance(value, dict):
        return {names.get(k, k): renamed(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, names) for v in value]
    return value


def records(root: Path, ignore: set[str] = frozenset(), slot: bool = False,
            names: dict[str, str] | None = None, upgrade: bool = False) -> dict[str, dict]:
    from stability.record.upgrade import upgraded, upgraded_run, upgraded_run_name

    same = (lambda value: value)
    record_as, run_as, name_as = (upgraded, upgraded_run, upgraded_run_name) if upgrade else (same, same, same)
    found: dict[str, dict] = {}
    for path in sorted(root.rglob("*.json")):
        if path.name == "manifest.json" or "mlartifacts" in path.parts:
            continue
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(document, dict) or "arms" not in document:
            continue
        document = record_as(document)
        if slot:
            document = unslotted(document)
        document = renamed(document, names or {})
        key = record_key(root, path, document, ignore)
        if key in found:
            raise SystemExit(f"two records of {key} under {root}: compare one command's output per folder")
        found[key] = document
        for steps in sorted(path.parent.glob(f"steps/{document.get('id')}/*.jsonl")):
            lines = [renamed(run_as(json.loads(line)), names or {}) for line in steps.read_text().splitlines()
                     if line.strip()]
            found[f"{key}/steps/{name_as(steps.stem.rsplit('-', 1)[0])}"] = {"lines": lines}   # without the run hash
    return found


def compare(before: Path, after: Path, ignore: set[str] = frozenset(), slot: bool = False,
            names: dict[str, str] | None = None, upgrade: bool = False) -> Comparison:
    result = Comparison(set(ignore))
    old, new = records(before, result.ignore, slot, names, upgrade), records(after, result.ignore, slot)
    for key in sorted(set(old) | set(new)):
        if key not in old or key not in new:
            result.differences.append(f"{key}: only {'after' if key not in old else 'before'}")
            continue
        result.walk(old[key], new[key], key)
    result.documents = len(set(old) & set(new))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--ignore", action="append", default=[], help="another key to leave out (repeatable)")
    parser.add_argument("--results-slot", action="store_true",
                        help="compare a case's results in the slot results[case] with a top-level key named after "
                             "the case (the layout before the slot), on either side")
    parser.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                        help="a key of BEFORE read as NEW (repeatable)")
    parser.add_argument("--upgrade", action="store_true",
                        help="read BEFORE's records (and per-step files) as the current record schema holds them")
    args = parser.parse_args(argv)
    bad = [r for r in args.rename if r.count("=") != 1 or "" in r.split("=")]
    if bad:
        parser.error(f"--rename {bad[0]!r}: expected OLD=NEW, two key names")
    names = dict(r.split("=") for r in args.rename)
    result = compare(args.before, args.after, set(args.ignore), args.results_slot, names, args.upgrade)
    for line in result.differences[:50]:
        print(line)
    if len(result.differences) > 50:
        print(f"... and {len(result.differences) - 50} more")
    print(f"{result.documents} documents, {result.numbers} numbers compared, {len(result.differences)} differences")
    return 1 if result.differences or not result.documents else 0


if __name__ == "__main__":
    sys.exit(main())
