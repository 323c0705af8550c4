"""Properties of the MLflow tracking (stability/track/runs.py) against SQLite stores and a local server.

Stores live under tmp_path (sqlite:///{tmp_path}/m.db). A fresh MLflow SQLite schema takes
seconds to create, so most tests copy one migrated template; the parallel-writer test starts
from an empty file on purpose (schema creation under concurrency). The `mlflow server` of the
server tests is started when this module starts and awaited only by those tests (at the end).
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request

import pytest
from _stability_records import edited, pair_record, with_replicates

from stability.cases.pipeline import report_artifacts
from stability.cli import main
from stability.record import Status, write_record
from stability.track import runs as tracking

SERVER_START_TIMEOUT_S = 600
TINY_RUN = {"seeds": "0", "steps": 12, "probes.every": 6, "probes.eval_batches": 1, "model.d_model": 32,
            "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 4,
            "data.builtin_bytes": 100_000}


@pytest.fixture(autouse=True)
def _fresh_failure_memory(monkeypatch):
    """Each test starts with no remembered store failures (they are per process)."""
    monkeypatch.setattr(tracking, "_FAILED", {})
    monkeypatch.setattr(tracking, "_REPORTED", set())


@pytest.fixture(scope="module")
def template_db(request, tmp_path_factory):
    """An empty, migrated MLflow SQLite store to copy from (tests/_mlflow_store.py)."""
    from _mlflow_store import migrated_template

    return migrated_template(request.config, tmp_path_factory)


@pytest.fixture
def store(tmp_path, template_db):
    shutil.copy(template_db, tmp_path / "m.db")
    return f"sqlite:///{tmp_path}/m.db"


@pytest.fixture(scope="module")
def record():
    return pair_record(seeds=(0, 1, 2), quant=True)


def _client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs(uri, experiment="stability-smoke"):
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    return client.search_runs([found.experiment_id]) if found else []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------- the mlflow server, started early

@pytest.fixture(scope="module", autouse=True)
def _start_server_early(request):
    """Start the server when the module starts, so its slow start-up overlaps the other tests; under
    pytest-xdist (tests of this module spread over workers) only the worker that needs it starts one."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        request.getfixturevalue("mlflow_server")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, template_db):
    """`mlflow server` on SQLite, loopback, a free port; started at module start, killed after."""
    root = tmp_path_factory.mktemp("server")
    shutil.copy(template_db, root / "server.db")
    port = _free_port()
    log = open(root / "server.log", "w")  # noqa: SIM115  (open for the server's whole life)
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/server.db",
         "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    state = {"uri": f"http://127.0.0.1:{port}", "process": process, "log": root / "server.log", "up": False}
    yield state
    from validation.servers import stop_server

    stop_server(process)
    log.close()


@pytest.fixture
def server_uri(mlflow_server):
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while not mlflow_server["up"]:
        if mlflow_server["process"].poll() is not None:
            pytest.fail(f"mlflow server exited: {mlflow_server['log'].read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(mlflow_server["uri"] + "/health", timeout=2) as response:
                mlflow_server["up"] = response.status == 200
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not up within {SERVER_START_TIMEOUT_S} s: "
                            f"{mlflow_server['log'].read_text()[-2000:]}")
            time.sleep(1)
    return mlflow_server["uri"]


# ----------------------------------------------------------------------------- what is logged

def test_parent_and_child_runs_with_params_metrics_tags_description_and_artifacts(store, record, tmp_path):
    (entry,) = [a for a in record["arms"] if (a["arm"], a["seed"]) == ("gated", 1)]
    entry["run_key"] = "gated-seed1-0123abcd"   # as a session names a run it trained
    result = tracking.log_to_mlflow(record, store, artifacts=report_artifacts(record, tmp_path))
    assert result["status"] == "tracked", result
    client = _client(store)
    parent = client.get_run(result["parent_run_id"])
    assert parent.info.status == "FINISHED"
    tags = parent.data.tags
    for key in ("git.commit", "git.branch", "git.dirty", "env.torch", "env.triton", "env.bitsandbytes",
                "env.device_name", "stability.preset", "stability.case_label", "stability.case_key", "stability.purpose"):
        assert key in tags, key
    assert tags["stability.preset"] == "smoke" and tags["git.branch"] == "main"
    description = tags["mlflow.note.content"]
    assert "\n" not in description and "standard" in description and "G1" in description
    assert parent.data.params["run.model.d_model"] == "64"
    assert parent.data.params["run.optim.lr"] == "0.003"
    assert set(result["child_run_ids"]) == {f"{arm}-seed{s}" for arm in ("reference", "gated") for s in (0, 1, 2)}
    child_id = result["child_run_ids"]["gated-seed1"]
    child = client.get_run(child_id)
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert child.data.tags["stability.run_key"] == "gated-seed1-0123abcd"   # one identifier: record, files, MLflow
    assert child.data.tags["stability.replicate"] == "0"
    history = client.get_metric_history(child_id, "loss")
    assert [m.step for m in history] == list(range(30))
    assert client.get_metric_history(child_id, "probe.f_attn.layer1")
    assert "final.m_act_mean" in child.data.metrics and "quant.int8.damage_loss" in child.data.metrics
    artifacts = {f.path for d in ("record", "plots", "report") for f in client.list_artifacts(parent.info.run_id, d)}
    assert any(p.startswith("record/") and p.endswith(".json") for p in artifacts)
    assert {"report/report.html", "report/report.md"} <= artifacts
    plots = {p.rsplit("-", 1)[-1] for p in artifacts if p.startswith("plots/")}
    assert plots == {"curves.png", "layers.png", "quant.png"}


def test_one_experiment_per_preset_or_campaign(store, monkeypatch):
    first = tracking.log_to_mlflow(pair_record(seeds=(0,)), store)
    second = tracking.log_to_mlflow(pair_record(seeds=(0,), case_label="lr_ramp"), store)
    assert first["experiment_id"] == second["experiment_id"] and first["experiment"] == "stability-smoke"
    monkeypatch.setenv("STABILITY_EXPERIMENT", "campaign-42")
    third = tracking.log_to_mlflow(pair_record(seeds=(0,)), store)
    assert third["experiment"] == "campaign-42" and third["experiment_id"] != first["experiment_id"]


def test_killed_arms_and_pairs_are_marked_killed(store):
    killed = pair_record(seeds=(0,), status=Status.KILLED)
    result = tracking.log_to_mlflow(killed, store)
    client = _client(store)
    assert client.get_run(result["parent_run_id"]).info.status == "KILLED"
    assert client.get_run(result["child_run_ids"]["gated-seed0"]).info.status == "KILLED"
    assert client.get_run(result["child_run_ids"]["reference-seed0"]).info.status == "FINISHED"


def test_an_arm_stopped_after_its_last_step_then_finished_holds_each_final_figure_once_per_step(store):
    """Ctrl-C after an arm's last training step and before its end (its last probe, its evaluation): the
    figures so far are logged at its last step; the finished arm's, sent again for the same record once
    it was resumed, one step later, not as a second value at the same step."""
    stopped = pair_record(seeds=(0,), status=Status.KILLED)
    first = tracking.log_to_mlflow(stopped, store)
    finished = copy.deepcopy(stopped)
    arm = next(a for a in finished["arms"] if a["status"] == Status.KILLED)
    arm["status"] = Status.COMPLETED.value
    arm.pop("stop_reason", None)
    arm["final"]["f_attn_mean"] = arm["final"].get("f_attn_mean", 0.25) + 0.125
    finished["status"] = Status.COMPLETED.value
    second = tracking.log_to_mlflow(finished, store)
    child = first["child_run_ids"]["gated-seed0"]
    assert second["child_run_ids"]["gated-seed0"] == child
    client = _client(store)
    last = arm["series"]["step"][-1]
    history = client.get_metric_history(child, "final.f_attn_mean")
    assert sorted(point.step for point in history) == [last, last + 1]
    assert history and max(history, key=lambda p: p.step).value == arm["final"]["f_attn_mean"]
    assert client.get_run(child).info.status == "FINISHED"


# ----------------------------------------------------------------------------- failing stores

def test_unreachable_server_fails_fast_reports_once_and_upload_sends_later(tmp_path, store, record, capsys):
    port = _free_port()   # nothing listens there
    uri = f"http://127.0.0.1:{port}"
    path = write_record(record, tmp_path / "runs")
    before = path.read_text()
    started = time.monotonic()
    first = tracking.log_to_mlflow(record, uri)
    second = tracking.log_to_mlflow(record, uri)
    elapsed = time.monotonic() - started
    assert first["status"] == second["status"] == "not tracked"
    assert "unreachable" in first["error"] and "\n" not in first["error"]
    assert elapsed < 30, f"an unreachable store took {elapsed:.1f} s"   # fail fast, not MLflow's retry minutes
    assert tracking.report_failure(first, path) and not tracking.report_failure(second, path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NOT TRACKED" in err and "stability upload" in err and "Traceback" not in err
    assert path.read_text() == before   # nothing measured is lost
    assert main(["upload", str(path), "--tracking-uri", store]) == 0
    assert len(_runs(store)) == 1 + len(record["arms"])


def test_a_failing_sqlite_store_does_not_raise(tmp_path, record):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = tracking.log_to_mlflow(record, f"sqlite:///{blocker}/sub/m.db")
    assert result["status"] == "not tracked" and result["error"]


def test_upload_of_a_corrupt_record_exits_2_with_a_message(tmp_path, store, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 2, "arms": [')
    assert main(["upload", str(bad), "--tracking-uri", store]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_cli_run_reports_an_unreachable_store_in_one_line(tmp_path, monkeypatch, capsys):
    """The CLI path: write the record, fail to track, print one NOT TRACKED line naming `stability upload`."""
    result = {"status": "not tracked", "uri": "http://127.0.0.1:1", "error": "ConnectionError: refused"}
    assert tracking.report_failure(result, tmp_path / "r.json")
    assert not tracking.report_failure(result, tmp_path / "r.json")
    assert capsys.readouterr().err.count("NOT TRACKED") == 1


# ----------------------------------------------------------------------------- parallel writers

def _log_one(uri: str, seed: int, queue) -> None:
    result = tracking.log_to_mlflow(pair_record(name=f"par{seed}", seeds=(seed,)), uri, experiment="parallel")
    queue.put(result)


def test_parallel_writers_share_one_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"   # empty: the schema is created by the racing writers, under the lock
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=_log_one, args=(uri, seed, queue)) for seed in range(3)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=240) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    assert [r["status"] for r in results] == ["tracked"] * 3, results
    runs = _runs(uri, "parallel")
    parents = [r for r in runs if r.data.tags.get("stability.level") == "pair"]
    assert len(parents) == 3 and len(runs) == 3 * 3


CREATOR = """
import sys, time
from pathlib import Path
from mlflow.tracking import MlflowClient
from stability.track.store import open_client
uri, go, how = sys.argv[1:]
print("ready", flush=True)
while not Path(go).exists():
    time.sleep(0.005)
try:
    client = MlflowClient(tracking_uri=uri) if how == "mlflow" else open_client(uri)
    client.search_experiments(max_results=1)
    print("opened", flush=True)
except Exception as error:
    print(f"failed: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
"""


def test_a_new_store_another_process_creates_at_the_same_moment_is_waited_for(tmp_path):
    """MLflow's own schema creation (what `mlflow ui` does on a new file, without this package's lock) and
    ``open_client`` start on the same new file at the same instant: MLflow's creation is not safe against a
    second creator (one of two plain MLflow clients fails), the harness's side waits the race out."""
    uri = f"sqlite:///{tmp_path}/new.db"
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    processes = [subprocess.Popen([sys.executable, "-c", CREATOR, uri, str(go), how], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=env) for how in ("mlflow", "stability")]
    for process in processes:     # both have imported MLflow: they start creating at the same instant
        assert process.stdout.readline().strip() == "ready"
    go.touch()
    outputs = [process.communicate(timeout=600)[0].strip() for process in processes]
    assert outputs[1] == "opened", outputs
    client = _client(uri)
    experiment = client.create_experiment("after-the-race")
    assert client.create_run(experiment).info.status == "RUNNING"


def _half_made(path, *tables):
    """A SQLite file as a creator that died mid-migration leaves it: a version row no migration knows, a
    leftover ``_alembic_tmp_`` table, and ``tables`` (name -> rows)."""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        connection.execute("INSERT INTO alembic_version VALUES ('0000deadbeef')")
        connection.execute("CREATE TABLE _alembic_tmp_latest_metrics (key VARCHAR(250))")
        for table, rows in tables:
            connection.execute(f"CREATE TABLE {table} (id INTEGER)")
            connection.executemany(f"INSERT INTO {table} VALUES (?)", [(i,) for i in range(rows)])


def test_a_store_a_dead_creator_left_half_made_and_empty_is_made_again(tmp_path):
    """The race's worst outcome, made on purpose: the other creator failed mid-migration, nobody writes the
    file any more, and plain MLflow cannot open it. It holds nothing (no run, only the Default
    experiment), so the harness makes it again and opens it."""
    from stability.track.store import open_client

    db = tmp_path / "half.db"
    _half_made(db, ("runs", 0), ("experiments", 1))
    with pytest.raises(Exception, match="0000deadbeef"):
        _client(f"sqlite:///{db}").search_experiments()
    client = open_client(f"sqlite:///{db}")
    experiment = client.create_experiment("after-the-repair")
    assert client.create_run(experiment).info.status == "RUNNING"


@pytest.mark.parametrize("tables", [(("runs", 1), ("experiments", 1)), (("runs", 0), ("experiments", 2)),
                                    (("runs", 0), ("users", 0))], ids=["a-run", "an-experiment", "foreign-table"])
def test_a_broken_store_that_holds_anything_is_never_touched(tmp_path, tables):
    """A run, an experiment of the user's or a table MLflow does not make: the error is raised and every
    table keeps its rows (MLflow's own failed attempts may have added empty tables; nothing is dropped)."""
    from stability.track.store import open_client

    db = tmp_path / "held.db"
    _half_made(db, *tables)
    with pytest.raises(Exception, match="0000deadbeef"):
        open_client(f"sqlite:///{db}")
    with sqlite3.connect(db) as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [("0000deadbeef",)]
        assert connection.execute("SELECT COUNT(*) FROM _alembic_tmp_latest_metrics").fetchone() == (0,)
        for table, rows in tables:
            assert connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (rows,)


@pytest.mark.slow   # a long test (a server and a run started together): CI runs it in a step of its own
@pytest.mark.long
def test_a_run_and_mlflow_server_started_at_once_on_a_new_store(tmp_path):
    """The first thing a new user does: `mlflow server` (or `mlflow ui`) and a command on a store that does
    not exist yet, at the same moment. The command is tracked."""
    uri = f"sqlite:///{tmp_path}/new.db"
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115  (open for the server's life)
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host",
                               "127.0.0.1", "--port", str(_free_port()), "--workers", "1"], stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sets = [arg for key, value in TINY_RUN.items() for arg in ("--set", f"{key}={value}")]
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        run = subprocess.run([sys.executable, "-m", "stability.cli", "run", "--tracking-uri", uri, "--quiet", *sets],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    finally:
        from validation.servers import stop_server

        stop_server(server)
        log.close()
    assert run.returncode == 0, run.stderr[-2000:]
    assert "NOT TRACKED" not in run.stderr, run.stderr[-2000:]
    (path,) = tmp_path.glob("reports/runs/*/smoke-standard-*.json")
    record = json.loads(path.read_text())
    assert record["tracking"]["status"] == "tracked"
    assert len(_client(uri).get_metric_history(record["tracking"]["child_run_ids"]["gated-seed0"], "loss")) == 12


# ----------------------------------------------------------------------------- baseline from the store

def test_check_from_mlflow_takes_the_latest_parent_runs_of_a_branch(tmp_path, store, record, capsys):
    old = edited(record, "gated", "m_act_mean", factor=10.0)
    assert tracking.log_to_mlflow(old, store)["status"] == "tracked"
    time.sleep(0.01)
    for run in with_replicates(record, replicates=(1, 2)):    # the latest of each replicate wins: the reference
        assert tracking.log_to_mlflow(run, store)["status"] == "tracked"   # and two replicates
    current = tmp_path / "r.json"
    current.write_text(json.dumps(record, allow_nan=False))
    assert main(["check", "--from-mlflow", "main", "--tracking-uri", store, str(current)]) == 0
    worse = tmp_path / "w.json"
    worse.write_text(json.dumps(edited(record, "reference", "m_act_max", factor=3.0), allow_nan=False))
    assert main(["check", "--from-mlflow", "main", "--tracking-uri", store, str(worse)]) == 1
    assert main(["check", "--from-mlflow", "no-such-branch", "--tracking-uri", store, str(current)]) == 2
    assert "git.branch='no-such-branch'" in capsys.readouterr().out


def test_check_from_an_unreachable_store_exits_2(tmp_path, record, capsys):
    current = tmp_path / "r.json"
    current.write_text(json.dumps(record, allow_nan=False))
    uri = f"http://127.0.0.1:{_free_port()}"
    assert main(["check", "--from-mlflow", "main", "--tracking-uri", uri, str(current)]) == 2
    assert "unreachable" in capsys.readouterr().out


# ----------------------------------------------------------------------------- a tracking server (last: it starts slowly)

def test_same_code_logs_to_a_tracking_server(server_uri):
    record = pair_record(seeds=(0,))
    result = tracking.log_to_mlflow(record, server_uri)
    assert result["status"] == "tracked", result
    client = _client(server_uri)
    parent = client.get_run(result["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.params["run.model.d_model"] == "64"
    assert len(client.get_metric_history(result["child_run_ids"]["reference-seed0"], "loss")) == 30
    fetched = tracking.fetch_records("main", server_uri, preset="smoke")
    assert [r["id"] for r in fetched] == [record["id"]]


class _RacingClient:
    """An MLflow client of a server store on which another writer creates the same experiment at the same
    moment: our create finds none, their tag lands first, ours is a unique-key violation (PostgreSQL)."""

    def __init__(self, tagged_after: bool):
        self.tagged_after, self.lookups = tagged_after, 0

    def get_experiment_by_name(self, name):
        from types import SimpleNamespace

        self.lookups += 1
        if self.lookups == 1:
            return None
        tags = {tracking.EXPERIMENT_KIND_TAG: tracking.EXPERIMENT_KIND} if self.tagged_after else {}
        return SimpleNamespace(experiment_id="7", tags=tags)

    def create_experiment(self, name, artifact_location=None):
        return "7"

    def set_experiment_tag(self, *args):
        raise RuntimeError('duplicate key value violates unique constraint "experiment_tag_pk"')


def test_two_writers_creating_one_experiment_on_a_server():
    assert tracking.ensure_experiment(_RacingClient(tagged_after=True), "http://127.0.0.1:1", "e") == "7"
    with pytest.raises(RuntimeError, match="experiment_tag_pk"):   # the tag is still missing: a real failure
        tracking.ensure_experiment(_RacingClient(tagged_after=False), "http://127.0.0.1:1", "e")
