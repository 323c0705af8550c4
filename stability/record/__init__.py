"""The record: the one JSON document per stress case that crosses from training to everything after it.

Tracking, the merge check and the report read records and nothing else, so this package holds the
contract. It imports neither torch nor MLflow (``stability check``, ``baseline`` and ``report`` run
without them). One idea per module:

    schema.py     the layout: every key of a case record, an arm record and their entries, typed; the
                  schema version, the purposes, the run status (``Status``), ``RecordError``
    validate.py   ``validate_record``: a record against the schema (unknown keys, types, figures);
                  ``check_layout``: any document against its TypedDicts
    build.py      the builders: the only code that writes into a record (new records, arms, steps,
                  statuses, figures, a case's results, a session's notes, tracking, Ray)
    summary.py    the figures of a record: an arm's trajectory figures, usable values, the paired summary
    io.py         reading and writing records (strict JSON, atomic, validated both ways)
    upgrade.py    a record of the schema before, read as this schema holds it (the reference arm renamed)
    cases.py      where a case keeps its results, the result types of the cases registered here, its run length
    identity.py   what makes records comparable: case key, comparable config, fingerprints, device, replicate
    machine.py    the machine a record was made on (``env.machine``): ``describe`` (imports torch, inside),
                  ``machine_key``, the label that groups jobs by machine
    figures.py    the one table of figures; stats.py: paired statistics; rundir.py: run directories

A case record (``CaseRecord``) holds ``schema_version``, ``id``, ``created_at``, ``name``, ``preset``,
``schedule``, ``stress``, ``run_steps``, ``purpose``, ``description``, ``status``, ``git``, ``env``, ``config`` (the
resolved ExperimentConfig), ``corpus``, ``arms`` (one ``ArmRecord`` per arm and seed), ``paired`` (per
treatment arm and figure a ``PairedFigure``), ``timing``, the stress case's own results in ``results``
under its name (``results["lr_sweep"]`` ..., of the type its case declares in its module), and, written
by a training command, ``runs``, ``replay_bundles``, ``checkpoint_dir``, ``resumed_from``, ``tracking``, ``record_path`` and ``ray``. An arm record is one
arm at one seed: its status, what was built, the per-step ``series``, ``events``, ``probes``,
``final`` figures, ``quant``, ``extrapolation``, ``timing`` and the run's names. Every key with its
type and meaning: ``stability.record.schema``.

``from stability.record import X`` reaches everything below.
"""

from stability.record.build import (
    add_arm,
    add_event,
    add_figures,
    add_precision_stats,
    add_probes,
    add_tracking_seconds,
    append_step,
    case_timing,
    describe_arm,
    ensure_id,
    env_info,
    finish_case,
    finish_status,
    git_info,
    library_version,
    mark_case_killed,
    mark_completed,
    mark_diverged,
    mark_error,
    mark_killed,
    mark_running,
    name_run,
    new_arm_record,
    new_case_record,
    note_attempts,
    note_linear_calls,
    note_lr_off_log,
    note_probe_modules_missed,
    note_resumed,
    note_run,
    note_skipped,
    note_wall_seconds,
    set_arm_timing,
    set_case_result,
    set_checkpoint_dir,
    set_corpus,
    set_extrapolation,
    set_paired,
    set_probe_steps_missed,
    set_quant,
    set_ray,
    set_record_path,
    set_replay_bundles,
    set_tracking,
    set_unit,
    start_applied,
    start_timing,
    stop_case,
)
from stability.record.cases import (
    RECORDED_CASES,
    CasePlot,
    CaseTable,
    RecordedCase,
    case_result,
    case_steps,
    declare,
    declared_case,
)
from stability.record.identity import (
    FIELDS_ABOUT,
    STANDARD,
    case_key,
    case_name,
    comparable_config,
    config_diff,
    config_fingerprint,
    device_kind,
    record_device,
    record_replicate,
    resume_config,
    setting_changes,
)
from stability.record.io import clean, read_record, record_filename, where, write_json, write_record
from stability.record.schema import (
    PURPOSES,
    SCHEMA_VERSION,
    SERIES_KEYS,
    UNFINISHED,
    USABLE,
    ArmRecord,
    CaseRecord,
    PairedFigure,
    RecordError,
    Status,
)
from stability.record.summary import (
    REFERENCE_ARM,
    arm_names,
    final_figures,
    paired_summary,
    spike_score,
    usable_value,
)
from stability.record.upgrade import upgraded
from stability.record.validate import check_layout, validate_record

__all__ = [
    "FIELDS_ABOUT",
    "PURPOSES",
    "RECORDED_CASES",
    "REFERENCE_ARM",
    "SCHEMA_VERSION",
    "SERIES_KEYS",
    "STANDARD",
    "UNFINISHED",
    "USABLE",
    "ArmRecord",
    "CasePlot",
    "CaseRecord",
    "CaseTable",
    "PairedFigure",
    "RecordError",
    "RecordedCase",
    "Status",
    "add_arm",
    "add_event",
    "add_figures",
    "add_precision_stats",
    "add_probes",
    "add_tracking_seconds",
    "append_step",
    "arm_names",
    "case_key",
    "case_name",
    "case_result",
    "case_steps",
    "case_timing",
    "check_layout",
    "clean",
    "comparable_config",
    "config_diff",
    "config_fingerprint",
    "declare",
    "declared_case",
    "describe_arm",
    "device_kind",
    "ensure_id",
    "env_info",
    "final_figures",
    "finish_case",
    "finish_status",
    "git_info",
    "library_version",
    "mark_case_killed",
    "mark_completed",
    "mark_diverged",
    "mark_error",
    "mark_killed",
    "mark_running",
    "name_run",
    "new_arm_record",
    "new_case_record",
    "note_attempts",
    "note_linear_calls",
    "note_lr_off_log",
    "note_probe_modules_missed",
    "note_resumed",
    "note_run",
    "note_skipped",
    "note_wall_seconds",
    "paired_summary",
    "read_record",
    "record_device",
    "record_filename",
    "record_replicate",
    "resume_config",
    "set_arm_timing",
    "set_case_result",
    "set_checkpoint_dir",
    "set_corpus",
    "set_extrapolation",
    "set_paired",
    "set_probe_steps_missed",
    "set_quant",
    "set_ray",
    "set_record_path",
    "set_replay_bundles",
    "set_tracking",
    "set_unit",
    "setting_changes",
    "spike_score",
    "start_applied",
    "start_timing",
    "stop_case",
    "upgraded",
    "usable_value",
    "validate_record",
    "where",
    "write_json",
    "write_record",
]
