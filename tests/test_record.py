"""The record contract: the run status, the schema's validation (when written and when read), the builder,
and a record of every stress case against the schema."""

from __future__ import annotations

import ast
import copy
import json
from pathlib import Path

import pytest
import torch
from _stability_records import as_schema_3, pair_record

from stability.cases.pipeline import run_recorded
from stability.cases.stress import CASES
from stability.config import resolve
from stability.record import (
    SERIES_KEYS,
    UNFINISHED,
    USABLE,
    RecordError,
    Status,
    add_arm,
    add_event,
    add_figures,
    append_step,
    case_name,
    finish_case,
    finish_status,
    mark_case_killed,
    mark_completed,
    mark_diverged,
    mark_error,
    mark_killed,
    mark_running,
    new_arm_record,
    new_case_record,
    note_attempts,
    note_run,
    note_skipped,
    read_record,
    schema,
    set_case_result,
    set_ray,
    set_tracking,
    start_timing,
    stop_case,
    upgraded,
    validate_record,
    write_record,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = {"seeds": "0", "steps": 12, "probes.every": 6, "probes.eval_batches": 1, "probes.probe_batch_size": 2,
        "model.d_model": 32, "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32,
        "data.batch_size": 4, "data.builtin_bytes": 100_000}


# ----------------------------------------------------------------------------- the status

def test_status_values_are_the_plain_strings_of_the_json():
    assert [s.value for s in Status] == ["running", "completed", "diverged", "killed", "error"]
    assert Status.KILLED == "killed" and json.dumps({"status": Status.KILLED}) == '{"status": "killed"}'
    assert Status("diverged") is Status.DIVERGED and f"{Status.ERROR}" == "error"


def test_status_groups():
    assert USABLE == {"completed", "diverged"} and UNFINISHED == {"running", "killed"}
    assert [s for s in Status if s.usable] == [Status.COMPLETED, Status.DIVERGED]
    assert [s for s in Status if s.unfinished] == [Status.RUNNING, Status.KILLED]
    assert "killed" in UNFINISHED and None not in UNFINISHED   # a record's plain string, or a missing status


def test_case_status_from_its_runs_error_then_killed_then_completed():
    record = {"arms": [{"status": "completed"}, {"status": "diverged"}]}
    assert finish_status(record) is Status.COMPLETED
    assert finish_status(record, ["running"]) is Status.KILLED
    assert finish_status(record, ["killed", "error"]) is Status.ERROR


# ----------------------------------------------------------------------------- validation

@pytest.fixture(scope="module")
def record():
    """A complete record of the trainer's layout (synthetic numbers), with a sweep and quantization."""
    return pair_record(seeds=(0, 1), lrs=(1e-3, 1e-2, 1e-1), quant=True)


def broken(record, change) -> dict:
    out = copy.deepcopy(record)
    change(out)
    return out


@pytest.mark.parametrize(("change", "path"), [
    (lambda r: r.update(bogus=1), "bogus is not a key of CaseRecord"),
    (lambda r: r["arms"][1].update(bogus=1), "arms[1] (arm gated, seed 0).bogus is not a key of ArmRecord"),
    (lambda r: r["arms"][0]["series"].update(bogus=[]), "arms[0] (arm reference, seed 0).series.bogus is not a key of Series"),
    (lambda r: r["arms"][0]["probes"][0].update(bogus=1.0), "arms[0] (arm reference, seed 0).probes[0].bogus is not a key of ProbeSnapshot"),
    (lambda r: r["arms"][0]["timing"].update(bogus=1.0), "arms[0] (arm reference, seed 0).timing.bogus is not a key of ArmTiming"),
    (lambda r: r["arms"][0]["quant"]["schemes"]["int8"].update(bogus=1.0),
     "arms[0] (arm reference, seed 0).quant.schemes.int8.bogus is not a key of QuantScheme"),
    (lambda r: r["paired"]["gated"]["accuracy"].update(bogus=1.0),
     "paired.gated.accuracy.bogus is not a key of PairedFigure"),
    (lambda r: r["results"]["lr_sweep"]["per_arm"][0].update(bogus=1.0),
     "results.lr_sweep.per_arm[0].bogus is not a key of SweepArm"),
    (lambda r: r.update(lr_sweep=r.pop("results")["lr_sweep"]) or r["lr_sweep"]["per_arm"][0].update(bogus=1.0),
     "lr_sweep.per_arm[0].bogus is not a key of SweepArm"),   # a record written before the results slot
    (lambda r: r["git"].update(bogus=1), "git.bogus is not a key of Git"),
    (lambda r: r.update(tracking={"status": "tracked", "bogus": 1}), "tracking.bogus is not a key of Tracking"),
])
def test_an_unknown_key_at_any_level_is_a_record_error_naming_its_path(record, change, path):
    with pytest.raises(RecordError) as error:
        validate_record(broken(record, change), "record 'r.json'")
    module = "stability.cases.lr_sweep" if path.endswith("SweepArm") else "stability.record.schema"   # its layout
    assert str(error.value).startswith(f"record 'r.json': {path} ({module}): expected one of ")


def test_an_unknown_figure_is_a_record_error_naming_it(record):
    for change, path in ((lambda r: r["arms"][1]["final"].update(heldout_los=3.0), "arms[1] (arm gated, seed 0).final.heldout_los"),
                         (lambda r: r["paired"]["gated"].update(heldout_los={}), "paired.gated.heldout_los")):
        with pytest.raises(RecordError) as error:
            validate_record(broken(record, change), "record 'r.json'")
        assert str(error.value) == (f"record 'r.json': {path} is not a figure of the table (stability.record.figures): "
                                    f"expected one of its figures, or an entry for it there")


def test_a_figure_value_that_is_not_a_number_is_a_record_error(record):
    with pytest.raises(RecordError) as error:
        validate_record(broken(record, lambda r: r["arms"][0]["final"].update(accuracy="0.14")), "record 'r.json'")
    assert str(error.value) == "record 'r.json': arms[0] (arm reference, seed 0).final.accuracy = '0.14': expected a number, true/false or null"
    for value in (3, 0.5, True, None):   # numbers, flags and null are figure values
        validate_record(broken(record, lambda r, v=value: r["arms"][0]["final"].update(accuracy=v)), "r")


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["arms"][0].update(status="done"),
     "arms[0] (arm reference, seed 0).status = 'done': expected one of 'running', 'completed', 'diverged', 'killed', 'error'"),
    (lambda r: r["arms"][0].update(seed="0"), "arms[0] (arm reference, seed 0).seed = '0': expected a whole number"),
    (lambda r: r["arms"][0]["series"]["loss"].__setitem__(2, "x"), "arms[0] (arm reference, seed 0).series.loss[2] = 'x': expected a number or null"),
    (lambda r: r["arms"][0].pop("status"), "arms[0] (arm reference, seed 0) has no 'status' field"),
    (lambda r: r.update(tracking={"uri": "sqlite:///m.db"}), "tracking has no 'status' field"),
    (lambda r: r.update(tracking={"status": "sent"}),
     "tracking.status = 'sent': expected one of 'live', 'tracked', 'not tracked'"),
    (lambda r: r.pop("config"), "the record has no 'config' field (truncated or not a record)"),
    (lambda r: r["arms"][0].update(final=[]), "arms[0] (arm reference, seed 0).final = []: expected an object"),
])
def test_a_value_of_another_type_or_a_missing_key_is_a_record_error(record, change, message):
    with pytest.raises(RecordError) as error:
        validate_record(broken(record, change), "record 'r.json'")
    assert str(error.value) == f"record 'r.json': {message}"


def test_a_snapshot_may_hold_any_figure_of_the_table_and_private_keys_stay_in_memory(record):
    extra = broken(record, lambda r: r["arms"][0]["probes"][0].update(extrap_loss_plain_x2=3.1))
    assert validate_record({**extra, "_path": "somewhere.json"}, "r") is not None


def test_write_record_refuses_a_record_the_schema_does_not_know_and_writes_nothing(tmp_path, record):
    with pytest.raises(RecordError, match=r"arms\[0\] \(arm reference, seed 0\)\.bogus is not a key of ArmRecord"):
        write_record(broken(record, lambda r: r["arms"][0].update(bogus=1)), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_read_record_refuses_a_file_with_an_unknown_key_naming_the_file(tmp_path, record):
    path = write_record(copy.deepcopy(record), tmp_path)
    document = json.loads(path.read_text())
    document["arms"][0]["final"]["not_a_figure"] = 1.0
    path.write_text(json.dumps(document))
    with pytest.raises(RecordError) as error:
        read_record(path)
    assert str(error.value).startswith(f"record {str(path)!r}: arms[0] (arm reference, seed 0).final.not_a_figure is not a figure")
    assert error.value.exit_code == 2


def test_a_slimmed_record_validates(record):
    """The zoo keeps records without their per-step detail (validation/regression_zoo.py ``slim``)."""
    slim = {**record, "arms": [{k: v for k, v in a.items() if k not in ("series", "probes", "events",
                                                                         "precision_stats")} for a in record["arms"]]}
    validate_record(slim, "r")


def test_every_key_of_the_series_is_typed_and_the_builder_makes_them_in_order():
    assert SERIES_KEYS == tuple(schema.Series.__annotations__)
    assert tuple(new_arm_record("gated", "G1", 0, "standard")["series"]) == SERIES_KEYS


# ----------------------------------------------------------------------------- the builder

def test_the_builder_writes_plain_statuses_and_every_stop():
    arm = new_arm_record("gated", "G1-elementwise", 0, "standard")
    assert arm["status"] == "running" and type(arm["status"]) is str
    mark_diverged(arm, 7, "non-finite loss")
    assert (arm["status"], arm["diverged_at_step"], arm["stop_reason"]) == ("diverged", 7, "non-finite loss")
    mark_running(arm)
    assert (arm["status"], arm["stop_reason"]) == ("running", None)
    mark_killed(arm)
    assert (arm["status"], arm["stop_reason"]) == ("killed", "interrupted (Ctrl-C)")
    mark_error(arm, ValueError("bad"), "Traceback ...")
    assert (arm["status"], arm["stop_reason"], arm["traceback"]) == ("error", "ValueError: bad", "Traceback ...")
    mark_completed(arm)
    assert arm["status"] == "completed" and all(type(v) is str for v in (arm["status"], arm["stop_reason"]))


def test_the_builder_appends_steps_and_events():
    arm = new_arm_record("reference", "ungated", 0, "standard")
    row = dict.fromkeys(SERIES_KEYS, 0.0)
    append_step(arm, row)
    assert all(arm["series"][key] == [0.0] for key in SERIES_KEYS)
    add_event(arm, 3, "activation", "blocks.1.attn", 1, ["blocks.1.attn.q_proj.weight"], {})
    note_skipped(arm, True)
    assert arm["events"] == [{"step": 3, "what": "activation", "skipped": True, "module": "blocks.1.attn", "layer": 1,
                              "grad_params": ["blocks.1.attn.q_proj.weight"]}]


def test_a_record_made_by_the_builder_alone_is_written_and_read_back(tmp_path):
    config = resolve("smoke", {"seeds": "0"})
    record = new_case_record(config, "standard", "by hand")
    assert record["status"] == "running" and record["arms"] == [] and record["paired"] == {}
    for name in ("reference", "gated"):
        arm = new_arm_record(name, name, 0, "standard")
        mark_completed(arm)
        add_figures(arm, {"heldout_loss": 3.0 if name == "reference" else 2.9, "diverged": False})
        start_timing(arm, started_at=0.0, wall_seconds=1.0)
        note_run(record, arm, f"steps/{record['id']}/{name}.jsonl")
        add_arm(record, arm)
    set_tracking(record, {"status": "not tracked", "uri": "http://127.0.0.1:1", "error": "refused"})
    finish_case(record, [a["timing"] for a in record["arms"]], 2.5)
    assert record["status"] == "completed" and record["timing"]["runs"] == 2
    assert record["paired"]["gated"]["heldout_loss"]["difference"] == pytest.approx(-0.1)
    back = read_record(write_record(record, tmp_path))
    assert back["runs"][1]["steps_file"].endswith("gated.jsonl") and back["tracking"]["status"] == "not tracked"


def test_a_killed_run_stops_the_case_and_ray_notes_attempts():
    record = pair_record(seeds=(0,))
    arm = copy.deepcopy(record["arms"][0])
    mark_killed(arm)
    stop_case(record, arm)
    assert record["status"] == "killed" and record["arms"][-1] is arm and "timing" in record
    mark_case_killed(record)
    set_ray(record, "local:2", {"num_cpus": 1}, 3, [("a1", "pair/baseline/seed0"), ("b2", "pair/gated/seed0")])
    note_attempts(record, 1, 2, 1)
    assert record["ray"]["units"] == [{"id": "a1", "name": "pair/baseline/seed0", "attempts": None},
                                      {"id": "b2", "name": "pair/gated/seed0", "attempts": 2}]
    assert record["ray"]["retries"] == 1
    mark_error(record["arms"][0], RuntimeError("a process was lost"), "Traceback (most recent call last): ...")
    validate_record(record, "r")   # the stop of every kind, its traceback and the Ray notes are in the schema


def test_a_case_result_must_be_one_the_schema_knows():
    with pytest.raises(RecordError, match="case result 'lr_swep' is unknown"):
        set_case_result({}, "lr_swep", {})


def test_only_the_builder_writes_into_records():
    """No module outside stability.record assigns a record's keys or changes its lists and tables in place
    (keys starting with "_" are notes in memory)."""
    def names(node):
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            if isinstance(node, ast.Attribute):
                yield node.attr
            node = node.value
        if isinstance(node, ast.Name):
            yield node.id

    def private(node):
        return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
            and str(node.slice.value).startswith("_")

    def a_record(node):
        return isinstance(node, ast.Subscript | ast.Attribute | ast.Name) and any(
            n.endswith("record") or n == "reference" for n in names(node))

    offenders = []
    for path in sorted((ROOT / "stability").rglob("*.py")):
        if path.parent.name in ("record", "check"):   # the check builds tables of its own, never records
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AugAssign) else []
            for target in (t for each in targets for t in (each.elts if isinstance(each, ast.Tuple) else [each])):
                if isinstance(target, ast.Subscript) and a_record(target.value) and not private(target):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(target)} = ...")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "update", "append", "extend", "setdefault", "pop", "insert", "clear") and a_record(node.func.value):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node.func)}(...)")
    assert offenders == []


# ----------------------------------------------------------------------------- every stress case

CASE_SETTINGS = {
    "standard": {"quant_schemes": "w8a8-tensor", "extrapolation.factors": "1,2", "extrapolation.eval_batches": 1},
    "lr_sweep": {"stress.sweep_lrs": "1e-3,1e-1"},
    "lr_ramp": {},
    "batch_ramp": {"stress.batch.double_every": 4, "stress.batch.max_size": 8},
    "precision_ladder": {"stress.precisions": "fp32,bf16"},
    "shock": {"stress.shock.at_step": 6, "stress.recovery_smoothing": 2},
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_record_of_every_stress_case_validates(tmp_path, case):
    """Trained (tiny), written through a session and the pipeline (validated on every write), read back."""
    assert set(CASE_SETTINGS) <= set(CASES)   # a case without settings here trains at TINY as it is
    torch.set_num_threads(1)
    config = resolve("smoke", {**TINY, **CASE_SETTINGS.get(case, {})})
    record = run_recorded(case, config, tmp_path, track=False, plots=False)
    back = read_record(record["record_path"])
    assert back["status"] == Status.COMPLETED and back["case"] == case
    assert (case in back.get("results", {})) == (CASES[case].result is not None)   # results of the type it declares
    assert not set(back) & set(CASES)   # the case's results in the one slot, never under a key of their own
    assert {r["status"] for r in back["runs"]} <= USABLE and "checkpoint_dir" in back
    if case == "standard":
        assert all("quant" in arm and "extrapolation" in arm for arm in back["arms"])


def test_the_case_of_a_record_is_named_as_stability_stress_names_it():
    """New records say "standard" for the plain pair; older ones said "pair" (or nothing): the same case."""
    assert case_name(pair_record()) == "standard" and new_case_record(resolve("smoke"), "standard")["case"] == "standard"
    assert case_name(upgraded(as_schema_3(pair_record(), stress="pair"))) == "standard"
    assert case_name(upgraded({k: v for k, v in as_schema_3(pair_record()).items() if k != "stress"})) == "standard"
    assert case_name(upgraded(as_schema_3(pair_record(), stress="shock"))) == "shock"


# ----------------------------------------------------------------------------- a NaN is a result

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny trained pair with quantization and extrapolation figures, as the pipeline wrote it."""
    torch.set_num_threads(1)
    config = resolve("smoke", {**TINY, **CASE_SETTINGS["standard"]})
    record = run_recorded("standard", config, tmp_path_factory.mktemp("nan"), track=False, plots=False)
    return read_record(record["record_path"])


def _number_paths(value, path=()):
    """The paths of every number (float) in a JSON document."""
    if isinstance(value, float):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _number_paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _number_paths(item, (*path, index))


def test_a_nan_or_inf_in_any_number_of_a_record_is_written_and_read_back_as_null(trained, tmp_path):
    """Wherever a run puts a number (the LR of a step, a norm, a figure, a timing), a NaN or Inf there is a
    result: the record is written (as strict JSON, null) and read back, never refused. Every number of a
    trained record, each poisoned in turn with NaN, +Inf or -Inf."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    paths = sorted(set(_number_paths({k: v for k, v in trained.items() if not k.startswith("_")})), key=str)
    assert len(paths) > 500 and any(p[:1] == ("arms",) and "lr" in p for p in paths)

    @settings(max_examples=60, deadline=None)
    @given(st.sampled_from(paths), st.sampled_from([float("nan"), float("inf"), float("-inf")]))
    def poisoned_is_kept(path, value):
        record = copy.deepcopy({k: v for k, v in trained.items() if not k.startswith("_")})
        holder = record
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
        back = read_record(write_record(record, tmp_path))
        for key in path:
            back = back[key]
        assert back is None
    poisoned_is_kept()
    lr = ("arms", 0, "series", "lr", 3)
    assert lr in paths
