"""The runs a small `stability run` wrote, as a user sees them in the real MLflow UI (headless Chromium).

`mlflow ui` is started on the loopback interface against the SQLite store the run wrote; Chromium opens
the link the command printed and must land on the runs table (not the GenAI overview), where the pair's
parent run expands to both arms and their metrics columns show the record's values. A screenshot is
saved in the test's tmp directory (its path is printed). Skipped when Chromium is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from _chromium import Chromium, executable

from stability.cli import main
from validation.servers import stop_server

TINY = {"seeds": "0", "steps": 12, "probes.every": 6, "probes.eval_batches": 1, "model.d_model": 32,
        "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 4,
        "data.builtin_bytes": 100_000}
START_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def written(request, tmp_path_factory, tmp_path, monkeypatch, capsys):
    """(store URI, the runs-table link the command printed, the record) of one tracked `stability run`."""
    from _mlflow_store import migrated_template

    shutil.copy(migrated_template(request.config, tmp_path_factory), tmp_path / "m.db")
    uri = f"sqlite:///{tmp_path}/m.db"
    monkeypatch.chdir(tmp_path)
    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    assert main(["run", *sets, "--tracking-uri", uri, "--quiet"]) == 0
    out = capsys.readouterr().out
    link = re.search(r"in `mlflow ui`: (\S+)", out).group(1)
    (path,) = tmp_path.glob("reports/runs/*/smoke-standard-*.json")
    return uri, link, json.loads(path.read_text())


@pytest.fixture()
def named(request, tmp_path_factory, tmp_path, monkeypatch, capsys):
    """(store URI, the links the command printed, the record) of a `stability run --experiment team-runs` into
    an experiment that existed before, made elsewhere without the harness's experiment-kind tag."""
    from _mlflow_store import migrated_template
    from mlflow.tracking import MlflowClient

    shutil.copy(migrated_template(request.config, tmp_path_factory), tmp_path / "m.db")
    uri = f"sqlite:///{tmp_path}/m.db"
    MlflowClient(tracking_uri=uri).create_experiment("team-runs")
    monkeypatch.chdir(tmp_path)
    sets = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]
    assert main(["run", *sets, "--tracking-uri", uri, "--experiment", "team-runs"]) == 0
    out = capsys.readouterr().out
    links = [re.search(r"runs table: (\S+)", out).group(1), re.search(r"in `mlflow ui`: (\S+)", out).group(1)]
    (path,) = tmp_path.glob("reports/runs/*/smoke-standard-*.json")
    return uri, links, json.loads(path.read_text())


@pytest.fixture()
def mlflow_ui(tmp_path):
    """``start(uri)``: `mlflow ui` on the store ``uri``, on loopback and a free port; its address. Stopped after
    the test."""
    started = []

    def start(uri: str) -> str:
        port = _free_port()
        log = open(tmp_path / "ui.log", "w")  # noqa: SIM115  (open for the server's life)
        process = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host",
                                    "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        started.append((process, log))
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"mlflow ui exited: {(tmp_path / 'ui.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as response:
                    if response.status == 200:
                        return base
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"mlflow ui not up in {START_TIMEOUT_S} s: {(tmp_path / 'ui.log').read_text()[-2000:]}")
                time.sleep(1)
    yield start
    for process, log in started:
        stop_server(process)
        log.close()


ROWS = "[...document.querySelectorAll('.ag-row')].map(r => r.getAttribute('row-index') + '\\t' + r.innerText)"


def test_the_runs_table_shows_both_arms_with_their_metrics(written, mlflow_ui, tmp_path):
    if executable() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); the UI check needs it")
    uri, link, record = written
    url = link.replace("http://127.0.0.1:5000", mlflow_ui(uri))
    shot = tmp_path / "mlflow-runs-table.png"
    with Chromium(tmp_path / "profile", width=2600, height=900) as page:
        page.goto(url)
        page.wait("[...document.querySelectorAll('.ag-row')].some(r => r.innerText.includes('standard'))")
        assert "/runs" in page.evaluate("location.href")
        text = page.evaluate("document.body.innerText")
        assert "Runs" in text and "Token Usage" not in text and "Tool calls" not in text   # not the GenAI overview
        page.click(".ag-row button")                                    # expand the pair's parent run
        page.wait("document.body.innerText.includes('gated-seed0') && document.body.innerText.includes('reference-seed0')")
        for metric in ("final.heldout_loss", "loss"):
            page.click("[data-testid=column-selection-dropdown]")
            page.click(f"[role=dialog] span[title='{metric}']")
            for kind in ("keyDown", "keyUp"):
                page.call("Input.dispatchKeyEvent", type=kind, key="Escape", code="Escape", windowsVirtualKeyCode=27)
            page.wait(f"[...document.querySelectorAll('[role=columnheader]')].some(h => h.innerText.trim() == '{metric}')")
        page.wait(f"{ROWS}.join('\\n').includes('{record['arms'][0]['final']['heldout_loss']:.6}'.slice(0, 6))")
        rows = page.evaluate(ROWS)
        page.screenshot(shot)
    print(f"screenshot of the runs table: {shot}")
    cells: dict[str, list[str]] = {}
    for row in rows:                   # ag-grid renders the pinned name column and the rest as separate rows
        index, _, content = row.partition("\t")
        cells.setdefault(index, []).extend(line.strip() for line in content.splitlines() if line.strip())
    by_name = {next(c for c in row if c.endswith("seed0")): row for row in cells.values()
               if any(c.endswith("seed0") for c in row)}
    assert set(by_name) == {"reference-seed0", "gated-seed0"}
    for arm in record["arms"]:
        numbers = [float(c) for c in by_name[f"{arm['arm']}-seed0"] if re.fullmatch(r"-?\d+\.\d+(e-?\d+)?", c)]
        assert arm["final"]["heldout_loss"] == pytest.approx(numbers[0], rel=1e-6)
        assert arm["series"]["loss"][-1] == pytest.approx(numbers[1], rel=1e-6)
    assert shot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow   # a long test (a second MLflow UI session): CI runs it in a step of its own
@pytest.mark.long
def test_a_named_experiment_that_existed_untagged_opens_on_the_runs_table(named, mlflow_ui, tmp_path):
    """Both links the command printed (while training and at the end) open the runs table of the experiment
    named with --experiment, which the harness tagged as a model-training experiment."""
    if executable() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); the UI check needs it")
    from mlflow.tracking import MlflowClient

    uri, links, record = named
    experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name("team-runs")
    assert record["tracking"]["experiment_id"] == experiment.experiment_id
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert links[0] == links[1] and f"/experiments/{experiment.experiment_id}/runs" in links[0]
    base = mlflow_ui(uri)
    with Chromium(tmp_path / "profile", width=1800, height=900) as page:
        page.goto(links[0].replace("http://127.0.0.1:5000", base))
        page.wait("[...document.querySelectorAll('.ag-row')].some(r => r.innerText.includes('standard'))")
        text = page.evaluate("document.body.innerText")
    assert "team-runs" in text and "Token Usage" not in text and "Tool calls" not in text   # not the GenAI overview
