"""`stability run` end to end: JSON record first, then one MLflow parent run with a child per arm."""

from __future__ import annotations

import json
import socket

import pytest

from stability.cases.stress import cpu_threads
from stability.cli import main
from stability.record import Status

FAST = ["--set", "steps=8", "--set", "probes.every=4", "--set", "probes.eval_batches=1", "--set", "seeds=0", "--quiet"]


def _records(workdir):
    """The records of the (one) run directory the command made."""
    sessions = list((workdir / "reports" / "runs").iterdir())
    assert len(sessions) == 1 and (sessions[0] / "manifest.json").is_file(), sessions
    return [p for p in sessions[0].glob("*.json") if p.name != "manifest.json"]


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def test_run_writes_the_record_and_one_parent_with_two_child_runs(workdir, capsys):
    uri = f"sqlite:///{workdir}/mlflow.db"
    assert main(["run", "--preset", "smoke", "--tracking-uri", uri, "--experiment", "cli-test", *FAST]) == 0
    out = capsys.readouterr().out
    assert "heldout_loss" in out and "arm-reference" in out
    records = _records(workdir)
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["tracking"]["status"] == "tracked"
    assert [a["status"] for a in record["arms"]] == [Status.COMPLETED, Status.COMPLETED]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("cli-test")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].data.tags["stability.preset"] == "smoke"
    for child in children:
        history = client.get_metric_history(child.info.run_id, "loss")
        assert [m.step for m in history] == list(range(8))
        assert len(client.get_metric_history(child.info.run_id, "grad_norm")) == 8
        assert "final.heldout_loss" in child.data.metrics and "final.f_attn_mean" in child.data.metrics
        assert child.info.status == "FINISHED"
    assert parents[0].data.params["run.model.d_model"] == "64"


def test_five_arms_make_one_record_and_one_parent_with_a_child_per_arm_and_seed(workdir, capsys):
    """The paper's controls (baseline, G1, G1 headwise, floored G1, G2) with the extrapolation probe."""
    uri = f"sqlite:///{workdir}/mlflow.db"
    args = ["run", "--preset", "smoke", "--tracking-uri", uri, "--experiment", "arms", *FAST, "--set", "seeds=0,1",
            "--set", "arms=controls", "--set", "extrapolation.factors=2", "--set", "extrapolation.eval_batches=1"]
    with cpu_threads(1):
        assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 seed(s) x 5 arms" in out and "gated_floored (G1-elementwise-floor0.5)" in out
    records = _records(workdir)
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    arms = ["reference", "gated", "gated_headwise", "gated_floored", "gated_value"]
    assert [a["arm"] for a in record["arms"]] == arms * 2 and list(record["paired"]) == arms[1:]
    assert all("extrap_gap_ntk_x2" in a["final"] for a in record["arms"])

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("arms").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id}
    assert len(parents) == 1 and sorted(children) == sorted(f"{a}-seed{s}" for a in arms for s in (0, 1))
    floored = children["gated_floored-seed1"]
    assert floored.data.params["arm.gate.floor"] == "0.5" and floored.data.params["variant"] == \
        "G1-elementwise-floor0.5"
    lengths = [m.step for m in client.get_metric_history(floored.info.run_id, "extrap.heldout_loss.plain")]
    assert lengths == [64, 128]
    assert "paired.gated_value.heldout_loss.difference" in parents[0].data.metrics


def test_an_unreachable_tracking_store_loses_nothing(workdir, capsys):
    with socket.socket() as sock:  # a loopback port with nobody listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = main(["run", "--preset", "smoke", "--tracking-uri", f"http://127.0.0.1:{port}", *FAST])
    assert code == 0
    err = capsys.readouterr().err
    assert "NOT TRACKED" in err and "stability upload" in err
    record = json.loads(_records(workdir)[0].read_text())
    assert record["tracking"]["status"] == "not tracked"
    assert len(record["arms"]) == 2 and record["arms"][0]["series"]["loss"]


@pytest.mark.parametrize("args, message", [
    (["--set", "model.n_heads=5"], "model.n_heads=5"),
    (["--set", "model.n_kv_heads=3"], "model.n_kv_heads=3"),
    (["--set", "gated_gate.position=G9"], "gate.position='G9'"),
    (["--set", "gated_gate.activation=tanh"], "gate.activation='tanh'"),
    (["--set", "optim.lr=-1"], "optim.lr=-1.0"),
    (["--set", "optim.lr=0"], "optim.lr=0.0"),
    (["--set", "data.batch_size=0"], "data.batch_size=0"),
    (["--set", "model.context=0"], "model.context=0"),
    (["--set", "data.corpus=/no/such/corpus.txt"], "/no/such/corpus.txt"),
    (["--set", "model.d_modl=3"], "'run.model.d_modl' is not a config field"),
    (["--preset", "huge"], "preset='huge'"),
    (["--set", "steps"], "FIELD=VALUE"),
    (["--set", "optim.lr=abc"], "run.optim.lr='abc' is invalid: expected a number"),
    (["--set", "steps=1.5"], "run.steps='1.5' is invalid: expected an integer"),
    (["--set", "model.gate.position=G1"], "'run.model.gate.position' is not settable"),
    (["--set", "arms=gated,gated_floored,gated"], "'gated' used twice"),
    (["--set", "arms=gated,floored"], "'floored' is not a named arm"),
    (["--set", "arms.gated.gate.flor=0.5"], "'arms.gated.gate.flor' is not a config field"),
    (["--set", "arms=z_loss", "--set", "arms.z_loss.z_loss=0x"], "arms.z_loss.z_loss='0x' is invalid"),
    (["--set", "arms.z_loss.z_loss=-1e-4"], "arms.z_loss.z_loss=-0.0001 is invalid: expected a positive finite"),
    (["--set", "arms.softcap.attn_softcap=inf"], "arms.softcap.attn_softcap=inf is invalid"),
    (["--set", "extrapolation.factors=0.5"], "extrapolation.factors=(0.5,) is invalid: expected factors >= 1"),
    (["--set", "device=cuda"], "device='cuda' is invalid here"),
])
def test_bad_input_is_a_clear_error_before_training(workdir, capsys, args, message):
    assert main(["run", *args, "--no-track", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert not (workdir / "reports").exists()


def test_empty_corpus_and_oversized_token_ids_are_rejected(workdir, capsys):
    (workdir / "empty.txt").write_bytes(b"")
    assert main(["run", "--set", f"data.corpus={workdir / 'empty.txt'}", "--no-track", "--quiet"]) == 2
    assert "empty" in capsys.readouterr().err
    import numpy as np

    np.array([1, 2, 999], dtype=np.uint16).tofile(workdir / "tokens.bin")
    assert main(["run", "--set", f"data.corpus={workdir / 'tokens.bin'}", "--no-track", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "999" in err and "257" in err


def test_an_extrapolation_longer_than_the_corpus_is_a_clear_error_before_training(workdir, capsys):
    (workdir / "small.txt").write_bytes(bytes(range(32, 127)) * 20)   # 190 bytes held out; context 64
    assert main(["run", "--set", f"data.corpus={workdir / 'small.txt'}", "--set", "extrapolation.factors=2,4",
                 "--no-track", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: extrapolation.factors=(2.0, 4.0)") and "256 tokens" in err
    assert not list(workdir.glob("reports/runs/*/*.json"))   # nothing trained, nothing recorded


def test_run_and_stress_standard_are_one_case(workdir, capsys):
    """`stability run` trains the stress case "standard" by the path `stability stress standard` takes: the same
    record (every figure, the case's name), in a run directory labelled by the command."""
    small = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "steps=4", "--set", "probes.every=2",
             "--set", "probes.eval_batches=1", "--set", "seeds=0", "--set", "quant_schemes=int8", "--no-track",
             "--quiet"]   # run quantizes with every scheme unless told: one scheme for both, named
    assert main(["run", *small, "--out", str(workdir / "run")]) == 0
    assert main(["stress", "standard", *small, "--out", str(workdir / "stress")]) == 0
    kept = {}
    for command in ("run", "stress"):
        (session,) = (workdir / command).iterdir()
        assert json.loads((session / "manifest.json").read_text())["label"] == command
        (path,) = [p for p in session.glob("*.json") if p.name != "manifest.json"]
        kept[command] = json.loads(path.read_text())
    assert kept["run"]["case"] == kept["stress"]["case"] == "standard"
    assert [(a["run_name"], a["series"]["loss"], a["final"]) for a in kept["run"]["arms"]] == [
        (a["run_name"], a["series"]["loss"], a["final"]) for a in kept["stress"]["arms"]]
    assert kept["run"]["paired"] == kept["stress"]["paired"]


def test_overrides_from_a_toml_file(workdir, capsys):
    (workdir / "over.toml").write_text("steps = 4\n[model]\nd_model = 32\nn_heads = 2\n[probes]\nevery = 2\n")
    assert main(["run", "--config", str(workdir / "over.toml"), "--no-track", "--quiet",
                 "--set", "probes.eval_batches=1"]) == 0
    record = json.loads(_records(workdir)[0].read_text())
    assert record["config"]["run"]["model"]["d_model"] == 32 and len(record["arms"][0]["series"]["loss"]) == 4


def test_a_malformed_toml_file_is_a_clear_error(workdir, capsys):
    (workdir / "bad.toml").write_text("steps = = 4\n")
    assert main(["run", "--config", str(workdir / "bad.toml"), "--no-track", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "bad.toml" in err and "not valid TOML" in err


def test_upload_of_a_record_without_arms_is_bad_input(workdir, capsys):
    (workdir / "r.json").write_text(json.dumps({"schema_version": 2, "name": "x", "preset": "smoke",
                                                "schedule": "standard", "config": {}}))
    assert main(["upload", str(workdir / "r.json"), "--tracking-uri", f"sqlite:///{workdir}/m.db"]) == 2
    assert "no 'arms' field" in capsys.readouterr().err


# ----------------------------------------------------------------------------- unusable input: one line, exit 2

def _files(root) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture()
def judged(workdir, capsys):
    """A baseline of three seeds with replicates (reports/baselines/b.json) and records of another preset."""
    from _stability_records import pair_record, with_replicates

    paths = []
    for index, record in enumerate(with_replicates(pair_record())):
        paths.append(workdir / f"r{index}.json")
        paths[-1].write_text(json.dumps(record, allow_nan=False))
    assert main(["baseline", "update", *map(str, paths), "--out", str(workdir / "b.json")]) == 0
    (workdir / "ci.json").write_text(json.dumps(pair_record(preset="ci"), allow_nan=False))
    capsys.readouterr()
    return workdir


def test_check_of_unusable_input_says_why_in_one_line_on_stderr(judged, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    before = _files(judged)
    assert main(["check", "--baseline", "b.json", "ci.json"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "preset differs" in err, err
    assert "UNUSABLE INPUT" in out            # the report on stdout stays
    assert _files(judged) == before


def test_report_against_a_baseline_that_cannot_judge_the_records_exits_2_and_writes_nothing(judged, capsys):
    before = _files(judged)
    assert main(["report", "ci.json", "--baseline", "b.json", "--out", "out/report.html"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "preset differs" in err and "b.json" in err, err
    assert out == "" and _files(judged) == before
    assert main(["report", "r0.json", "--baseline", "b.json", "--out", "out/report.html"]) == 0   # usable: written
    assert (judged / "out" / "report.html").is_file()


@pytest.mark.parametrize("args, message", [
    (["--preset", "nosuch"], "preset = 'nosuch' is invalid: expected one of ('smoke', 'ci', 'gpu-pr', 'full', 'sink')"),
    (["--device", "gpu"], "device = 'gpu' is invalid: expected 'cpu', 'cuda' or 'cuda:N'"),
    (["--replicates", "1"], "replicates = 1 is invalid: expected an integer >= 2"),
    (["--stability-config", "bad.toml"], "bad.toml: seeds = [] is invalid"),
    (["--stability-config", "badset.toml"], "badset.toml: optim.lr=-1.0 is invalid"),
])
def test_baseline_make_refuses_bad_arguments_before_pytest_starts_or_a_run_directory_is_written(
        workdir, capsys, monkeypatch, args, message):
    import subprocess

    (workdir / "bad.toml").write_text("seeds = []\n")
    (workdir / "badset.toml").write_text('[set]\n"optim.lr" = -1.0\n')
    started = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: started.append(a))
    before = _files(workdir)
    assert main(["baseline", "make", *args]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert out == "" and started == [] and _files(workdir) == before


def test_check_help_names_every_exit_code_of_the_verdict(capsys):
    from stability.check.verdict import VERDICT_OF_EXIT

    with pytest.raises(SystemExit):
        main(["check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code, verdict in VERDICT_OF_EXIT.items():
        assert f"{code} {verdict.lower()}" in text, (code, verdict)
