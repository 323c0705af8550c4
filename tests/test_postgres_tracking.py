"""A team's MLflow server on PostgreSQL: a real PostgreSQL cluster and a real ``mlflow server`` on the
loopback interface (validation/servers.py), written to by several processes at once.

* two ``stability stress`` commands at the same time, each with its live tracker;
* the stress suites with 2 pytest-xdist workers;
* ``stability stress --ray local:2``.

After each, every record the processes wrote is in MLflow exactly once: its parent run, and one child
run per arm under it (the ``mlflow.parentRunId`` tag), and nothing else in the experiment; no run
failed to track (a lock error or a lost write shows as "not tracked" in the record).

The first runs by default (about 50 CPU-seconds, most of it the server's schema migration on
PostgreSQL); the other two are slow (``--run-slow``). Skipped, with the reason, only where PostgreSQL or the server cannot be started
(Debian: ``apt-get install postgresql``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 16,
        "data.batch_size": 4, "data.builtin_bytes": 20_000, "probes.every": 5, "probes.eval_batches": 1,
        "probes.probe_batch_size": 2, "steps": 8, "seeds": "0,1", "stress.shock.at_step": 3}
SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from validation.servers import Unavailable, mlflow_server, postgres_cluster

    pytest.importorskip("psycopg", reason="the postgres extra is not installed (pip install -e '.[postgres]')")
    folder = tmp_path_factory.mktemp("pg-mlflow")
    try:
        with postgres_cluster() as url, mlflow_server(url, folder / "artifacts") as uri:
            yield uri
    except Unavailable as error:
        pytest.skip(f"no PostgreSQL-backed MLflow server here: {error}")


def records_under(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.rglob("*.json"))
            if p.name != "manifest.json" and "steps" not in p.parts and '"arms"' in p.read_text()]


def assert_each_once(uri: str, experiment: str, records: list[dict]) -> None:
    """Every record's parent run once, one child per arm under it, nothing else in the experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"experiment {experiment!r} is not on the server"
    runs = client.search_runs([found.experiment_id], max_results=5000)
    by_id = {run.info.run_id: run for run in runs}
    assert len(by_id) == len(runs)
    expected = 0
    for record in records:
        tracking = record.get("tracking") or {}
        assert tracking.get("status") == "tracked", f"{record['case']}: {tracking}"
        parent = tracking["parent_run_id"]
        assert parent in by_id and by_id[parent].info.status == "FINISHED"
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent]
        assert len(children) == len(record["arms"]), (record["case"], len(children), len(record["arms"]))
        assert sorted((c.data.tags["arm"], c.data.tags["seed"]) for c in children) == sorted(
            (a["arm"], str(a["seed"])) for a in record["arms"])
        expected += 1 + len(children)
    assert len(runs) == expected, f"{len(runs)} runs in {experiment!r}, expected {expected}: doubled or stray runs"


def stress(uri: str, out: Path, experiment: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stability.cli", "stress", "shock", "lr_ramp", "--out", str(out),
                             "--tracking-uri", uri, "--experiment", experiment, "--quiet", "--no-plots", *SETS,
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


@pytest.mark.slow   # two stress commands training at once against one server: a long test
@pytest.mark.long
def test_two_stress_commands_at_once(server, tmp_path):
    procs = [stress(server, tmp_path / f"p{i}", "two-at-once") for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outputs)
    records = records_under(tmp_path)
    assert len(records) == 4
    assert_each_once(server, "two-at-once", records)


@pytest.mark.slow
def test_stress_suites_with_two_xdist_workers(server, tmp_path):
    env = {**os.environ, "STABILITY_RUN_DIR": str(tmp_path / "run"), "STABILITY_PLOTS": "0"}
    out = subprocess.run([sys.executable, "-m", "pytest", "suites/test_stress_cases.py", "--stability-cases",
                          "shock,lr_ramp", "-m", "stress", "-n", "2", "-q", "-p", "no:cacheprovider", "--tracking-uri", server],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    records = records_under(tmp_path / "run")
    assert {r["case"] for r in records} == {"shock", "lr_ramp"}
    assert_each_once(server, "stability-smoke", records)


@pytest.mark.slow
def test_a_ray_run_tracks_each_case_once(server, tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    proc = stress(server, tmp_path, "ray", "--ray", "local:2")
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output
    records = records_under(tmp_path)
    assert len(records) == 2 and all(r["ray"]["retries"] == 0 for r in records)
    assert_each_once(server, "ray", records)
