"""What makes two records comparable: the case key, the config fields allowed to differ, fingerprints,
the device kind and the rounding replicate.

    case_key(record)                 "smoke/batch_ramp-sqrt": the one identity of a case's record, rows,
                                     invariants and baseline entry
    case_name(record)                the stress case a record measured ("standard", "lr_sweep" ...)
    FIELDS_ABOUT                     what the config fields that may differ are about (keeping, seeding, ...)
    comparable_config(config)        the flattened config without what may differ between compared records
    resume_config(config)            ... between an interrupted run and the command continuing it
    config_fingerprint(config)       16 hex digits of the comparable config: the one "fingerprint" of the
                                     harness (a baseline's case holds it; one run's own hash is
                                     ``stability.cases.runs.hash_run``)
"""

from __future__ import annotations

import hashlib
import json

from stability.config import flat_names, flatten
from stability.record.schema import CaseRecord


def case_key(record: CaseRecord) -> str:
    """``<config name>/<case label>`` ("smoke/batch_ramp-sqrt"): what the merge check compares record to
    baseline by. The label (the record's "case_label") is derived from the registered case, its name then its
    qualifier (``stability.cases.case.StressCase.label``); the name alone is the record's "case"
    (``case_name``)."""
    return f"{record.get('name')}/{record.get('case_label')}"


# The plain pair's name: what `stability run` trains; the one place outside its case module that names a case
# (tests/test_architecture.py)
STANDARD = "standard"


def case_name(record: CaseRecord) -> str:
    """The stress case a record measured: its "case", the name ``stability stress`` takes."""
    return record.get("case") or STANDARD


# What the config fields that may differ between two records are about: how a run is kept, which seeds and
# rounding replicate it was trained under, where it runs, what it is called. A key ending in "." stands for
# every field under it. Every other field is about what is measured: two records that differ in one measured
# different things.
FIELDS_ABOUT = {
    "run.checkpoint.": "keeping",      # checkpoints and replay bundles: never change a figure
    "seeds": "seeding",                # the seeds of the initialisation and data order
    "run.seed": "seeding",
    "run.replicate": "seeding",        # the rounding replicate (0: the unperturbed runs)
    "replicates": "seeding",           # how many rounding replicates a baseline takes
    "run.device": "place",             # where the run trains ("cuda:1": its kind is compared by the check)
    "quant_schemes": "evaluation",     # what is measured after training (the plain pair's default: every scheme)
    "name": "naming",
    "preset": "naming",
}
# the views: which of these may differ ...
RESUMING = ("keeping", "evaluation")               # between an interrupted run and the command continuing it
COMPARING = ("keeping", "seeding", "place", "naming")  # between records the merge check compares


def about(key: str) -> str:
    """What the flattened config field ``key`` is about ("keeping", "seeding", "place", "naming", "evaluation";
    "measure" for every field ``FIELDS_ABOUT`` does not name)."""
    for field, what in FIELDS_ABOUT.items():
        if key == field or (field.endswith(".") and key.startswith(field)):
            return what
    return "measure"


def _field_defaults() -> dict:
    """Every config field at its dataclass default, flattened (dotted keys)."""
    from stability.config import ExperimentConfig, to_dict

    return flat_names(flatten(to_dict(ExperimentConfig())))


def config_view(config: dict, may_differ: tuple[str, ...]) -> dict:
    """The flattened config (dotted keys, sorted, tuples as lists) without the fields about ``may_differ``.

    A field the config lacks (a record or baseline written before the field existed) counts as its
    default: new fields default to the behaviour the code had before them. The stress schedules' settings
    go by their flat names (``stress.ramp_end_lr`` for ``stress.ramp.end_lr``: ``stability.config.FLAT_NAMES``),
    the names older records and the committed baselines hold, so that they keep matching."""
    flat = {**_field_defaults(), **flat_names(flatten(config or {}))}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(flat.items()) if about(k) not in may_differ}


def comparable_config(config: dict) -> dict:
    """What must be equal for the merge check to compare two records (``config_view`` of ``COMPARING``)."""
    return config_view(config, COMPARING)


def resume_config(config: dict) -> dict:
    """What must be equal for a command to continue an interrupted run (``config_view`` of ``RESUMING``)."""
    return config_view(config, RESUMING)


def config_fingerprint(config: dict) -> str:
    """16 hex digits of ``comparable_config(config)``: records of the same fingerprint may be compared."""
    return hashlib.sha256(json.dumps(comparable_config(config), sort_keys=True).encode()).hexdigest()[:16]


def config_diff(expected: dict, actual: dict, limit: int = 4, names: tuple[str, str] = ("baseline", "record")) -> str:
    """A readable list of the first fields that differ between two flattened configs, each value named by
    ``names`` (expected's, actual's)."""
    keys = sorted(set(expected) | set(actual))
    diffs = [f"{k}: {names[0]} {expected.get(k, '<absent>')!r}, {names[1]} {actual.get(k, '<absent>')!r}"
             for k in keys if expected.get(k, "<absent>") != actual.get(k, "<absent>")]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "; ".join(diffs[:limit]) + more if diffs else "no field differs"


# The measured fields that make two cases' runs different runs, not the same runs under other settings: the
# model's shape and where it comes from, the data its figures are measured on, how long it trains, which runs a
# case is made of, the extensions loaded. A key ending in "." stands for every field under it. Two records that
# differ here cannot be compared row by row; any other measured field that differs is a *setting* (the
# optimiser, the precision recipe, the gate, a stress schedule's knobs), and the check judges the job under it.
RUN_SHAPE = ("run.model.context", "run.model.d_ff", "run.model.d_model", "run.model.head_dim", "run.model.n_heads",
             "run.model.n_kv_heads", "run.model.n_layers", "run.model.vocab_size", "run.model.family",
             "run.model.source", "run.model.hf_config", "run.model.factory", "run.data.", "run.steps",
             "run.probes.eval_batches", "run.probes.probe_batch_size", "arms", "stress.precisions",
             "stress.sweep_lrs", "stress.ladder_steps", "plugins")


def _shapes_runs(key: str) -> bool:
    return any(key == field or (field.endswith(".") and key.startswith(field)) for field in RUN_SHAPE)


def setting_changes(expected: dict, actual: dict) -> tuple[list[str], list[str]]:
    """(the fields that make the runs of two comparable configs (flattened, ``comparable_config``) different
    runs, the settings that differ), each as "field: baseline X, job Y"."""
    keys = sorted(set(expected) | set(actual))
    differ = [k for k in keys if expected.get(k, "<absent>") != actual.get(k, "<absent>")]
    text = {k: f"{k}: baseline {expected.get(k, '<absent>')!r}, job {actual.get(k, '<absent>')!r}" for k in differ}
    return [text[k] for k in differ if _shapes_runs(k)], [text[k] for k in differ if not _shapes_runs(k)]


def record_replicate(record: CaseRecord) -> int:
    """The rounding replicate a record's runs were trained under: ``run.replicate`` (0: the unperturbed runs)."""
    return int(((record.get("config") or {}).get("run") or {}).get("replicate", 0) or 0)


def device_kind(device: str | None) -> str:
    """"cuda:1" -> "cuda", None -> "cpu"."""
    return (device or "cpu").split(":")[0]


def record_device(record: CaseRecord) -> str:
    return device_kind(((record.get("config") or {}).get("run") or {}).get("device"))
