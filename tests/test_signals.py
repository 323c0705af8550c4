"""Real signals against the real command: Ctrl-C (SIGINT) and kill -9 in the middle of an arm.

Each test starts ``python -m stability.cli`` in a subprocess, waits for a progress line of the arm it
wants to interrupt, sends the signal (Ctrl-C to the command's process group, as a terminal does), and
then reads what is on disk (and in MLflow). The resumed runs are compared with an uninterrupted run of
the same config trained in this process. What MLflow holds after every other way of stopping a tracked
run: tests/test_tracking_stops.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _stopping import CONFIG, SETS, STEPS, ctrl_c, finish, start, store_copier, the_record, wait_for

from stability.cases.stress import run_case
from stability.config import resolve
from stability.record import Status
from stability.session.steplog import read_steplog


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return run_case("standard", resolve("smoke", CONFIG))   # what `stability run` trains (quantized too)


@pytest.mark.slow   # the same command continuing is also tested in-process (test_long_runs.py)
def test_ctrl_c_stops_the_command_with_exit_130_and_the_same_command_continues(tmp_path, reference):
    process = start(["run", "--no-track", *SETS], tmp_path)
    wait_for(process, f"gated-seed0: step 65/{STEPS}")
    ctrl_c(process)
    code, _, err = finish(process)
    assert code == 130, err[-2000:]
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    _, record = the_record(tmp_path)
    assert record["status"] == Status.KILLED
    baseline, gated = record["arms"]
    assert (baseline["status"], gated["status"]) == (Status.COMPLETED, Status.KILLED) and len(gated["series"]["loss"]) >= 65
    stopped_at = len(gated["series"]["loss"])
    assert gated["series"]["loss"] == reference["arms"][1]["series"]["loss"][:stopped_at]

    again = start(["run", "--no-track", *SETS], tmp_path)       # the same command again
    code, out, err = finish(again)
    assert code == 0, err[-2000:]
    assert "continuing an interrupted run" in out and f"resuming after step {stopped_at - 1}" in out
    _, record = the_record(tmp_path)
    assert record["status"] == Status.COMPLETED
    for expected, got in zip(reference["arms"], record["arms"]):
        assert got["series"]["loss"] == expected["series"]["loss"]
        assert got["final"]["heldout_loss"] == expected["final"]["heldout_loss"]


def test_after_kill_9_the_steps_trained_are_on_disk_and_resume_finishes_the_run(tmp_path, reference):
    process = start(["run", "--no-track", *SETS], tmp_path)
    wait_for(process, f"gated-seed0: step 97/{STEPS}")
    process.kill()                                               # SIGKILL: nothing runs on the way out
    finish(process)
    run_dir, record = the_record(tmp_path)
    assert record["status"] == Status.RUNNING and [r["status"] for r in record["runs"]] == [Status.COMPLETED]
    (steps_file,) = (run_dir / "steps" / record["id"]).glob("gated-*.jsonl")
    rows = read_steplog(steps_file)["steps"]
    assert len(rows) >= 97 and [r["step"] for r in rows] == list(range(len(rows)))
    assert [r["loss"] for r in rows] == reference["arms"][1]["series"]["loss"][:len(rows)]
    kept = tmp_path / "kept.jsonl"
    shutil.copy(steps_file, kept)

    resumed = start(["run", "--no-track", "--resume", str(run_dir)], tmp_path)
    code, out, err = finish(resumed)
    assert code == 0, err[-2000:]
    assert "resuming after step 79" in out     # the last periodic checkpoint before the kill (every 40 steps)
    _, record = the_record(tmp_path)
    for expected, got in zip(reference["arms"], record["arms"]):
        assert got["series"]["loss"] == expected["series"]["loss"]
        assert got["final"] == expected["final"]


def test_ctrl_c_in_stress_exits_130_with_the_partial_record_and_killed_mlflow_runs(tmp_path, template_store):
    uri = template_store(tmp_path / "m.db")
    lrs = ["--set", "stress.sweep_lrs=0.001,0.003,0.01", "--set", "steps=96"]
    process = start(["stress", "lr_sweep", "--tracking-uri", uri, *SETS, *lrs], tmp_path)
    wait_for(process, "[lr_sweep] reference-seed0-lr0.003: step 28/96")
    ctrl_c(process)
    code, _, err = finish(process)
    assert code == 130, err[-2000:]
    (run_dir,) = (tmp_path / "reports" / "runs").iterdir()
    (path,) = run_dir.glob("smoke-lr_sweep-*.json")
    record = json.loads(path.read_text())
    assert record["status"] == Status.KILLED
    assert [(r["name"], r["status"]) for r in record["runs"]] == [("reference-seed0-lr0.001", Status.COMPLETED),
                                                                  ("reference-seed0-lr0.003", Status.KILLED)]
    assert record["tracking"]["status"] == "tracked", record["tracking"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(record["tracking"]["parent_run_id"])
    assert parent.info.status == "KILLED" and parent.info.run_name == "lr_sweep"
    children = {name: client.get_run(run_id) for name, run_id in record["tracking"]["child_run_ids"].items()}
    assert {n: r.info.status for n, r in children.items()} == {"reference-seed0-lr0.001": "FINISHED",
                                                               "reference-seed0-lr0.003": "KILLED"}
    killed = children["reference-seed0-lr0.003"]
    assert killed.data.tags["case"] == "lr_sweep" and killed.data.tags["status"] == Status.KILLED
    assert len(client.get_metric_history(killed.info.run_id, "loss")) >= 28   # sent live while it trained


@pytest.mark.slow   # a case stopped and resumed twice, each through MLflow: a long test
@pytest.mark.long
def test_stopped_and_resumed_twice_every_step_is_in_mlflow_and_in_the_per_step_file_once(tmp_path, template_store):
    """Ctrl-C in the reference arm, --resume, Ctrl-C in the gated arm, --resume: each child run holds every
    step's loss once (the parts sent live by three processes and the record sent at each stop)."""
    uri = template_store(tmp_path / "m.db")
    process = start(["run", "--tracking-uri", uri, *SETS], tmp_path)
    wait_for(process, f"reference-seed0: step 65/{STEPS}")
    ctrl_c(process)
    assert finish(process)[0] == 130
    run_dir, _ = the_record(tmp_path)
    process = start(["run", "--tracking-uri", uri, "--resume", str(run_dir)], tmp_path)
    wait_for(process, f"gated-seed0: step 49/{STEPS}")
    ctrl_c(process)
    assert finish(process)[0] == 130
    code, _, err = finish(start(["run", "--tracking-uri", uri, "--resume", str(run_dir)], tmp_path))
    assert code == 0, err[-2000:]
    _, record = the_record(tmp_path)
    assert record["status"] == "completed" and record["tracking"]["status"] == "tracked"

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    children = record["tracking"]["child_run_ids"]
    assert sorted(children) == ["gated-seed0", "reference-seed0"]
    for name, run_id in children.items():
        for metric in ("loss", "lr", "update_norm"):
            steps = sorted(point.step for point in client.get_metric_history(run_id, metric))
            assert steps == list(range(STEPS)), (name, metric, len(steps))
        (steps_file,) = (run_dir / "steps" / record["id"]).glob(f"{name.split('-')[0]}-*.jsonl")
        assert [row["step"] for row in read_steplog(steps_file)["steps"]] == list(range(STEPS))
    assert client.get_run(record["tracking"]["parent_run_id"]).info.status == "FINISHED"


@pytest.fixture(scope="module")
def template_store(request, tmp_path_factory):
    return store_copier(request.config, tmp_path_factory)
