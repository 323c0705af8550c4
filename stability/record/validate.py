"""Checking a record against its layout (``stability.record.schema``), when it is written and when it is read.

    validate_record(record, "record 'reports/runs/.../smoke-standard-regression-1a2b3c4d.json'")

Walks the record along the schema's types: every key must be one its entry declares (an unknown key
at any level is an error), every value of its type, every key of a ``final`` or ``paired`` table a
figure of ``stability.record.figures`` and every figure value a number, true/false or null. A number
(``float``) may always be null: the JSON of a NaN or an Inf, which a run may produce anywhere (a NaN
learning rate, an overflowing norm) and which is a result to keep, never a reason to refuse the record. The first
problem is a RecordError (exit 2) naming the record, the key's path (``arms[1].final.heldout_loss``)
and what was expected. Keys starting with "_" at the top (``_path``) are notes in memory, never checked.

A record is data: nothing it names is imported. The extensions it was made with (``config.plugins`` and
``env.extensions``) are only read: when some of them are not loaded in this process (a process loads its
own, from the installed entry points and its own configuration: ``stability.config.extensions``), a figure
or a case result the table does not know is taken to be theirs and kept unread (``foreign_extensions``
names them); readers judge the figures they know, and a check whose baseline judges a figure this
process does not know fails closed, naming the extension to load.

A case's own results (``results[<case>]``) and its own figures are checked against what its case declares
in its module when this process registered the case (``stability.cases.stress``: every command, the check
and the pytest plugin import it). A reader that never imports the registry checks that the results are an
object and keeps them, and a figure the table lacks, unread; the results of any other case are an error.
"""

from __future__ import annotations

import functools
import types
import typing
from enum import Enum
from typing import Any, Literal, Union

from stability.config import extensions
from stability.record.cases import is_declared, result_type
from stability.record.figures import figure
from stability.record.identity import case_name
from stability.record.schema import (
    FIGURES_BESIDE,
    PURPOSES,
    RESULTS_BEFORE_THE_SLOT,
    SCHEMA_VERSION,
    CaseRecord,
    FigureName,
    FigureValue,
    RecordError,
)

_NAMES = {float: "a number", int: "a whole number", bool: "true/false", str: "a string", type(None): "null"}


def validate_record(record, where: str) -> CaseRecord:
    """``record`` itself when it is a case record of this schema; RecordError naming ``where`` otherwise."""
    if not isinstance(record, dict):
        raise RecordError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    version = record.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(f"{where}: schema_version={version!r} is unknown: this version of stability reads "
                          f"record schema_version={SCHEMA_VERSION}")
    for key in _fields(CaseRecord)[1]:
        if key not in record:
            raise RecordError(f"{where}: the record has no {key!r} field (truncated or not a record)")
    if record.get("purpose", "regression") not in PURPOSES:
        raise RecordError(f"{where}: purpose={record.get('purpose')!r} is unknown: expected one of {PURPOSES}")
    arms = record["arms"]
    if not isinstance(arms, list) or not all(isinstance(a, dict) for a in arms):
        raise RecordError(f"{where}: 'arms' must be a list of arm objects, got "
                          f"{type(arms).__name__ if not isinstance(arms, list) else 'a list holding non-objects'}")
    if not isinstance(record["config"], dict):
        raise RecordError(f"{where}: config = {shown(record['config'])}: expected an object (the resolved config)")
    extension = foreign_extensions(record)
    own = case_name(record) if isinstance(record.get("case"), (str, type(None))) else None  # else _entry says
    # a figure the table lacks, in a record of a case this process did not register (a reader that imports no
    # case), is taken to be that case's: kept, unread
    foreign = extension or (() if own is None or is_declared(own) else (f"case {own}",))
    _entry({k: v for k, v in record.items() if not k.startswith("_")}, CaseRecord, "", where, foreign)
    results = record.get("results") or {}
    if not isinstance(results, dict):
        raise RecordError(f"{where}: results = {shown(results)}: expected an object (case name -> its results)")
    slots = [(f"results.{case}", case, result) for case, result in results.items()]
    slots += [(case, case, record[case]) for case in RESULTS_BEFORE_THE_SLOT if case in record]
    for path, case, result in slots:
        if case == own and not is_declared(case):
            if not isinstance(result, dict):
                raise RecordError(f"{where}: {path} = {shown(result)}: expected an object (the case's results)")
            continue          # the results of its own case, which this process did not register: kept, unread
        try:
            kind = result_type(case)
        except RecordError as error:
            if extension:
                continue      # the results of a case an extension this process lacks registered: kept, unread
            raise RecordError(f"{where}: {path}: {error}") from None
        _check(result, kind, path, where, foreign)
    _check_config(record["config"], where)
    for index, arm in enumerate(arms):
        _check_series(arm.get("series") or {}, _item("arms", index, arm), where)
    return record


def foreign_extensions(record: dict) -> tuple[str, ...]:
    """The extensions (``module[:function]``) the record was made with that this process has not loaded:
    its ``config.plugins`` and ``env.extensions`` specs, read, never imported."""
    named = []
    plugins = (record.get("config") or {}).get("plugins") if isinstance(record.get("config"), dict) else None
    if isinstance(plugins, list):
        named += [p for p in plugins if isinstance(p, str)]
    env = record.get("env") if isinstance(record.get("env"), dict) else {}
    if isinstance(env.get("extensions"), list):
        named += [e.get("spec") for e in env["extensions"] if isinstance(e, dict) and isinstance(e.get("spec"), str)]
    here = {extension.spec for extension in extensions.loaded()}
    return tuple(dict.fromkeys(name.strip() for name in named if name.strip() not in here))


def is_whole(value) -> bool:
    """Whether ``value`` is a whole number (an int, never a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _whole(low: int):
    """A test for a whole number >= ``low`` (never a bool)."""
    return lambda value: is_whole(value) and value >= low


# The config fields that the readers of a record use (its device, rounding replicate and run length, and the
# figures' resolution: stability.record.identity, .cases, .figures.quantum), with what each must hold. The
# rest of the config is the config's own business (stability.config): readers only fingerprint it.
CONFIG_FIELDS = {
    "run": (lambda v: isinstance(v, dict), "an object"),
    "stress": (lambda v: isinstance(v, dict), "an object"),
    "run.data": (lambda v: isinstance(v, dict), "an object"),
    "run.model": (lambda v: isinstance(v, dict), "an object"),
    "run.probes": (lambda v: isinstance(v, dict), "an object"),
    "run.device": (lambda v: v is None or isinstance(v, str), "a device name (\"cpu\", \"cuda:0\") or null"),
    "run.replicate": (lambda v: v is None or _whole(0)(v), "a rounding replicate: a whole number >= 0"),
    "run.seed": (_whole(0), "a whole number >= 0"),
    "run.steps": (_whole(1), "a whole number of steps >= 1"),
    "stress.ladder_steps": (lambda v: v is None or _whole(0)(v), "a whole number of steps >= 0"),
    "run.data.batch_size": (_whole(1), "a whole number >= 1"),
    "run.model.context": (_whole(1), "a whole number >= 1"),
    "run.model.n_heads": (_whole(1), "a whole number >= 1"),
    "run.model.n_layers": (_whole(1), "a whole number >= 1"),
    "run.probes.eval_batches": (_whole(1), "a whole number >= 1"),
}


def _check_config(config: dict, where: str) -> None:
    """The config fields of ``CONFIG_FIELDS`` that ``config`` holds, each of its type."""
    for name, (fits, expected) in CONFIG_FIELDS.items():
        *parents, key = name.split(".")
        holder = config
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and key in holder and not fits(holder[key]):
            raise RecordError(f"{where}: config.{name} = {shown(holder[key])}: expected {expected}")


def _check_series(series: dict, path: str, where: str) -> None:
    """Every per-step list of an arm has one entry per step trained: the same length as the others."""
    lengths = {key: len(values) for key, values in series.items() if isinstance(values, list)}
    if len(set(lengths.values())) > 1:
        first = next(iter(lengths))
        other = next(key for key, n in lengths.items() if n != lengths[first])
        raise RecordError(f"{where}: {path}.series.{other} has {lengths[other]} entries and series.{first} "
                          f"{lengths[first]}: expected one entry per step trained in every series")


@functools.cache
def _fields(kind) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(key -> type, the required keys in declaration order) of a TypedDict."""
    hints = typing.get_type_hints(kind)
    return hints, tuple(k for k in hints if k in kind.__required_keys__)


def _at(path: str, key) -> str:
    return f"{path}.{key}" if path else str(key)


def _item(path: str, index: int, item) -> str:
    """``arms[1]``, or for an arm ``arms[1] (arm gated, seed 0)``: a message names the arm and seed."""
    if path == "arms" and isinstance(item, dict) and "arm" in item and "seed" in item:
        return f"arms[{index}] (arm {item['arm']}, seed {item['seed']})"
    return f"{path}[{index}]"


def _entry(value, kind, path: str, where: str, foreign: tuple[str, ...] = ()) -> None:
    """``value`` is an object holding the keys of the TypedDict ``kind``, each of its type (``foreign``: the
    record's extensions this process lacks, whose figures are kept unread)."""
    if not isinstance(value, dict):
        raise RecordError(f"{where}: {path} = {shown(value)}: expected an object ({kind.__name__})")
    hints, required = _fields(kind)
    for key in required:
        if key not in value:
            raise RecordError(f"{where}: {path or 'the top level'} has no {key!r} field")
    for key, item in value.items():
        if key in hints:
            _check(item, hints[key], _at(path, key), where, foreign)
        elif kind in FIGURES_BESIDE and (figure(key) is not None or foreign):
            _check(item, FigureValue, _at(path, key), where)
        else:
            also = " or a figure of the table" if kind in FIGURES_BESIDE else ""
            raise RecordError(f"{where}: {_at(path, key)} is not a key of {kind.__name__} "
                              f"({kind.__module__}): expected one of {', '.join(hints)}{also}")


def check_layout(document, kind, where: str) -> None:
    """``document`` holds the keys of the TypedDict ``kind`` and no other, each value of its declared type, all
    the way down (a record's, a baseline's layout); RecordError naming ``where`` and the key's path otherwise."""
    _entry(document, kind, "", where)


def _check(value, kind, path: str, where: str, foreign: tuple[str, ...] = ()) -> None:
    """``value`` is of type ``kind`` (see the module docstring); RecordError naming ``path`` otherwise."""
    origin = typing.get_origin(kind)
    if kind is Any:
        return
    if typing.is_typeddict(kind):
        _entry(value, kind, path, where, foreign)
    elif origin in (Union, types.UnionType):
        if value is None and type(None) in typing.get_args(kind):
            return
        options = [option for option in typing.get_args(kind) if option is not type(None)]
        if len(options) == 1 and (typing.is_typeddict(options[0]) or typing.get_origin(options[0]) in (list, dict)):
            _check(value, options[0], path, where, foreign)   # an entry or null: the entry's own problem says most
            return
        for option in options:
            try:
                _check(value, option, path, where, foreign)
                return
            except RecordError:
                continue
        raise RecordError(f"{where}: {path} = {shown(value)}: expected {_describe(kind)}")
    elif origin is list:
        if not isinstance(value, list):
            raise RecordError(f"{where}: {path} = {shown(value)}: expected a list")
        (item_kind,) = typing.get_args(kind)
        plain = _plain(item_kind)
        if plain is not None and all(type(item) in plain for item in value):
            return                 # a long list of plain values (a series): one pass, no per-item call
        for index, item in enumerate(value):
            _check(item, item_kind, _item(path, index, item), where, foreign)
    elif origin is dict:
        if not isinstance(value, dict):
            raise RecordError(f"{where}: {path} = {shown(value)}: expected an object")
        key_kind, item_kind = typing.get_args(kind)
        for key, item in value.items():
            if key_kind is FigureName and figure(key) is None and not foreign:
                raise RecordError(f"{where}: {_at(path, key)} is not a figure of the table "
                                  f"(stability.record.figures): expected one of its figures, or an entry for it there")
            _check(item, item_kind, _at(path, key), where, foreign)
    elif not _is(value, kind):
        raise RecordError(f"{where}: {path} = {shown(value)}: expected {_describe(kind)}")


@functools.cache
def _plain(kind) -> frozenset | None:
    """The Python types a plain ``kind`` (numbers, flags, strings, null and their unions) accepts; None for
    any other kind."""
    types_of = {float: {int, float, type(None)}, int: {int}, bool: {bool}, str: {str}, type(None): {type(None)}}
    options = typing.get_args(kind) if typing.get_origin(kind) in (Union, types.UnionType) else (kind,)
    if not all(option in types_of for option in options):
        return None
    return frozenset().union(*(types_of[option] for option in options))


def _is(value, kind) -> bool:
    """``value`` is a plain value of ``kind``: a number or null for float (an int too; null is a NaN or
    Inf), one of a Literal's or an Enum's values, a bool only for bool."""
    if typing.get_origin(kind) is Literal:
        return value in typing.get_args(kind)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return value in {member.value for member in kind}
    if kind is float:   # null: a NaN or Inf, written as JSON
        return value is None or isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is type(None):
        return value is None
    return isinstance(value, kind)


def _describe(kind) -> str:
    """What a type expects, in words ("a number, true/false or null")."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        words = [_describe(option) for option in typing.get_args(kind)]
        return ", ".join(words[:-1]) + " or " + words[-1]
    if typing.get_origin(kind) is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(kind)))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return "one of " + ", ".join(repr(member.value) for member in kind)
    if typing.get_origin(kind) is list:
        return "a list"
    if typing.get_origin(kind) is dict or typing.is_typeddict(kind):
        return "an object"
    return _NAMES.get(kind, getattr(kind, "__name__", str(kind)))


def shown(value) -> str:
    """``value`` as an error message quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
