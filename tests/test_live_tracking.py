"""Live tracking (stability/track/live.py): steps in MLflow while the arm trains, the training's own start
and end times, and a dead or silent store that degrades to "not tracked" with one message."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time

import pytest
import torch
from _watch import watching

from stability.cases.pipeline import keep
from stability.cases.standard import run_pair
from stability.cli import main
from stability.config import resolve
from stability.record import Status
from stability.session.session import Session
from stability.track import runs as tracking
from stability.track.live import LiveTracker

TINY = {"seeds": "0", "steps": 24, "probes.every": 12, "probes.eval_batches": 1, "model.d_model": 32,
        "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 4,
        "data.builtin_bytes": 100_000}
TINY_SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(autouse=True)
def _fresh_failure_memory(monkeypatch):
    monkeypatch.setattr(tracking, "_FAILED", {})
    monkeypatch.setattr(tracking, "_REPORTED", set())


@pytest.fixture()
def store(request, tmp_path_factory, tmp_path):
    from _mlflow_store import migrated_template

    shutil.copy(migrated_template(request.config, tmp_path_factory), tmp_path / "m.db")
    return f"sqlite:///{tmp_path}/m.db"


def test_steps_reach_mlflow_while_the_arm_trains_and_runs_carry_the_training_times(store, tmp_path):
    from mlflow.tracking import MlflowClient

    torch.set_num_threads(1)
    tracker = LiveTracker(store, flush_seconds=0.2)
    session = Session(tmp_path / "run", tracker=tracker)
    client = MlflowClient(tracking_uri=store)
    seen = {}

    def look(arm, seed, step, figures):       # called inside the training loop, before step 15 is queued
        if arm == "gated" and step == 15:
            assert tracker.flush()
            child = tracker.runs_of(session.current)["child_run_ids"]["gated-seed0"]
            seen["steps"] = [m.step for m in client.get_metric_history(child, "loss")]
            seen["status"] = client.get_run(child).info.status

    record = run_pair(resolve("smoke", TINY), session=watching(session, look))
    keep(record, tmp_path / "run", store, plots=False, session=session)
    session.close()
    assert seen == {"steps": list(range(15)), "status": "RUNNING"}
    assert record["tracking"]["status"] == "tracked"
    parent = client.get_run(record["tracking"]["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.info.run_name == "standard"
    assert parent.data.tags["case"] == "standard"
    ends = []
    for arm in record["arms"]:
        child = client.get_run(record["tracking"]["child_run_ids"][f"{arm['arm']}-seed0"])
        assert child.info.start_time == int(arm["timing"]["started_at"] * 1000)   # the training's own times
        assert child.info.end_time == int(arm["timing"]["ended_at"] * 1000)
        assert parent.info.start_time <= child.info.start_time
        ends.append(child.info.end_time)
        assert {k: child.data.tags[k] for k in ("arm", "seed", "case", "status")} == {
            "arm": arm["arm"], "seed": "0", "case": "standard", "status": Status.COMPLETED}
        assert [m.step for m in client.get_metric_history(child.info.run_id, "loss")] == list(range(24))  # once
        assert len(client.get_metric_history(child.info.run_id, "update_norm")) == 24
        assert "final.heldout_loss" in child.data.metrics
    assert parent.info.end_time == max(ends)
    experiment = client.get_experiment(record["tracking"]["experiment_id"])
    assert experiment.name == "stability-smoke"
    assert experiment.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_a_dead_store_is_one_message_and_upload_sends_everything_later(workdir, store, capsys):
    assert main(["run", *TINY_SETS, "--tracking-uri", f"http://127.0.0.1:{_free_port()}"]) == 0
    err = capsys.readouterr().err
    assert err.count("NOT TRACKED") == 1 and "stability upload" in err and "Traceback" not in err
    (path,) = workdir.glob("reports/runs/*/smoke-standard-*.json")
    record = json.loads(path.read_text())
    assert record["tracking"]["status"] == "not tracked" and len(record["arms"][1]["series"]["loss"]) == 24
    tracking._FAILED.clear()
    assert main(["upload", str(path), "--tracking-uri", store]) == 0
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("stability-smoke").experiment_id])
    children = {r.info.run_name: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    gated = children["gated-seed0"]
    assert gated.info.start_time == int(record["arms"][1]["timing"]["started_at"] * 1000)   # not the upload's time
    assert len(client.get_metric_history(gated.info.run_id, "loss")) == 24


class SilentServer:
    """Accepts TCP connections on loopback and never answers: a tracking store that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self):
        for connection in self.held:
            connection.close()
        self.sock.close()


def test_a_silent_store_never_holds_training_up_and_degrades_with_one_message(tmp_path, capsys):
    server = SilentServer()
    uri = f"http://127.0.0.1:{server.port}"
    try:
        tracker = LiveTracker(uri, flush_seconds=0.2, patience_seconds=1.0)
        session = Session(tmp_path / "run", tracker=tracker)
        record = run_pair(resolve("smoke", TINY), session=session)
        for _ in range(600):                       # the sending process starts in its own time
            if server.held:
                break
            time.sleep(0.1)
        assert server.held   # it did connect: its calls go unanswered, not refused
        keep(record, tmp_path / "run", uri, plots=False, session=session)
        session.close()
    finally:
        server.close()
    assert record["status"] == Status.COMPLETED and len(record["arms"][1]["series"]["loss"]) == 24
    assert record["tracking"]["status"] == "not tracked"
    err = capsys.readouterr().err
    assert err.count("NOT TRACKED") == 1 and ("did not answer" in err or "took more than" in err), err


def test_a_run_continued_in_another_process_sends_only_the_steps_the_store_lacks(store):
    """After kill -9 a run resumes from its last checkpoint, before the last step sent live: the steps trained
    again are not sent again, so the child run holds every step once."""
    from mlflow.tracking import MlflowClient

    record = {"id": "r1", "preset": "smoke", "name": "smoke", "case": "standard", "case_label": "standard",
              "config": {"run": {"steps": 15}}, "status": "running"}
    arm = {"arm": "gated", "seed": 0, "variant": "G1", "status": "running", "run_name": "gated-seed0"}

    def row(step):
        return {"step": step, "loss": 5.0 - 0.1 * step, "lr": 1e-3, "grad_norm": 1.0, "update_norm": 0.1}

    first = LiveTracker(store, flush_seconds=0.1)
    first.case_started(record)
    first.arm_started(record, arm, 0)
    for step in range(10):                      # steps 0..9 reach the store, then the process dies
        first.step(record, arm, row(step))
    assert first.flush()
    ids = first.runs_of(record)
    first.close()

    second = LiveTracker(store, flush_seconds=0.1)
    second.case_started(record, ids)
    second.arm_started(record, arm, 5)          # its checkpoint was taken after step 4
    for step in range(5, 15):
        second.step(record, arm, row(step))
    assert second.flush() and second.runs_of(record)["child_run_ids"] == ids["child_run_ids"]
    second.close()
    history = MlflowClient(tracking_uri=store).get_metric_history(ids["child_run_ids"]["gated-seed0"], "loss")
    assert sorted(point.step for point in history) == list(range(15))


def test_where_to_watch_is_printed_while_the_first_run_trains(store, tmp_path):
    """The runs-table link and the command that starts the UI on the store are printed as soon as the live
    runs exist, before training ends (here: waited for at step 15 of the gated arm), and the record on disk
    names the live run of the arm in flight."""
    import io

    torch.set_num_threads(1)
    out = io.StringIO()
    tracker = LiveTracker(store, flush_seconds=0.2)
    session = Session(tmp_path / "run", tracker=tracker, progress=True, stream=out)
    seen = {}

    def look(arm, seed, step, figures):
        if arm == "gated" and step == 15:
            assert tracker.flush()                 # the sending process has made the runs
        if arm == "gated" and step == 17:
            seen["text"] = out.getvalue()
            (path,) = (tmp_path / "run").glob("smoke-standard-*.json")
            seen["on disk"] = json.loads(path.read_text())["tracking"]

    run_pair(resolve("smoke", TINY), session=watching(session, look))
    session.close()
    lines = [line for line in seen["text"].splitlines() if line.startswith("mlflow: live in experiment")]
    assert len(lines) == 1 and "'stability-smoke'" in lines[0]
    db = store.removeprefix("sqlite:///")
    assert f"mlflow ui --backend-store-uri sqlite:///{db}" in lines[0]
    assert "#/experiments/" in lines[0] and "/runs?workflowType=machine_learning" in lines[0]
    assert out.getvalue().count("mlflow: live in experiment") == 1        # once per experiment
    # the record on disk names the live run of the arm in flight: a resume after kill -9 continues it
    assert "gated-seed0" in seen["on disk"]["child_run_ids"]
