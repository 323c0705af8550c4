"""What makes two records comparable: the case key, the config fields allowed to differ, fingerprints,
the device kind and the rounding draw.

    case_key(record)                 "smoke/standard": what the merge check compares record to baseline by
    case_name(record)                the stress case a record measured ("standard", "lr_sweep" ...)
    comparable_config(config)        the flattened config without the fields allowed to differ
    config_fingerprint(config)       16 hex digits of that
"""

from __future__ import annotations

import hashlib
import json

from stability.config import flatten
from stability.record.schema import CaseRecord


def case_key(record: CaseRecord) -> str:
    """``<name>/<schedule>``: what the regression check compares record to baseline by."""
    return f"{record.get('name')}/{record.get('schedule')}"


STANDARD = "standard"
# what records written before the plain pair was called "standard" say under "stress"
OLD_CASE_NAMES = {"pair": STANDARD}


def case_name(record: CaseRecord) -> str:
    """The stress case a record measured: its "stress" value, the name ``stability stress`` takes; an older
    record's "pair" (or none) is "standard"."""
    stress = record.get("stress") or STANDARD
    return OLD_CASE_NAMES.get(stress, stress)


IDENTITY_IGNORES = ("seeds", "run.seed", "run.device", "name", "preset", "run.replicate", "replicates")
IDENTITY_IGNORED_SECTIONS = ("run.checkpoint.",)   # how a run is kept, never what it measures


def _field_defaults() -> dict:
    """Every config field at its dataclass default, flattened (dotted keys)."""
    from stability.config import ExperimentConfig, to_dict

    return flatten(to_dict(ExperimentConfig()))


def comparable_config(config: dict) -> dict:
    """The flattened config without the fields allowed to differ between comparable records.

    A field the config lacks (a record or baseline written before the field existed) counts as its
    default: new fields default to the behaviour the code had before them."""
    flat = {**_field_defaults(), **flatten(config or {})}
    flat = {k: list(v) if isinstance(v, tuple) else v for k, v in flat.items()}
    return {k: v for k, v in sorted(flat.items())
            if k not in IDENTITY_IGNORES and not k.startswith(IDENTITY_IGNORED_SECTIONS)}


def config_fingerprint(config: dict) -> str:
    return hashlib.sha256(json.dumps(comparable_config(config), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(expected: dict, actual: dict, limit: int = 4) -> str:
    """A readable list of the first fields that differ between two flattened configs."""
    keys = sorted(set(expected) | set(actual))
    diffs = [f"{k}: baseline {expected.get(k, '<absent>')!r}, record {actual.get(k, '<absent>')!r}"
             for k in keys if expected.get(k, "<absent>") != actual.get(k, "<absent>")]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more if diffs else "no field differs"


def record_draw(record: CaseRecord) -> int:
    """The rounding draw a record's runs were trained under: ``run.replicate`` (0: the reference runs)."""
    return int(((record.get("config") or {}).get("run") or {}).get("replicate", 0) or 0)


def device_kind(device: str | None) -> str:
    """"cuda:1" -> "cuda", None -> "cpu"."""
    return (device or "cpu").split(":")[0]


def record_device(record: CaseRecord) -> str:
    return device_kind(((record.get("config") or {}).get("run") or {}).get("device"))
