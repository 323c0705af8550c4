"""Long runs: per-step files, checkpoints and bit-exact resume, replay bundles, the update-norm probe.

The runs here are tiny (d_model 32, 24 steps) and trained in-process; the subprocess tests with real
signals (Ctrl-C, kill -9) are in test_signals.py.
"""

from __future__ import annotations

import json
import math
import shutil
import signal
import sys

import pytest
import torch
from _stability_records import as_schema_3
from _watch import watching

from stability.cases.experiment import Interrupted
from stability.cases.standard import run_pair
from stability.cli import main
from stability.config import resolve
from stability.record import Status
from stability.session.session import Resume, Session, find_interrupted
from stability.session.steplog import read_steplog
from stability.train import probes
from stability.train.checkpoint import Bundles

TINY = {"seeds": "0", "steps": 24, "probes.every": 6, "probes.eval_batches": 1, "model.d_model": 32,
        "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 4,
        "data.builtin_bytes": 100_000, "checkpoint.every": 5}
TINY_SETS = [arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]


def tiny(**overrides):
    return resolve("smoke", {**TINY, **overrides})


@pytest.fixture(scope="module")
def reference():
    """The uninterrupted pair, no session."""
    torch.set_num_threads(1)
    return run_pair(tiny())


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A pair stopped by Ctrl-C (a real SIGINT) after step 13 of the gated arm: its run directory."""
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("interrupted") / "run"

    def ctrl_c(arm, seed, step, figures):
        if arm == "gated" and step == 13:
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(Interrupted) as stop:
        run_pair(tiny(), session=watching(Session(run_dir, label="run"), ctrl_c))
    return run_dir, stop.value.record


def test_ctrl_c_stops_the_case_after_the_step_in_flight_with_everything_on_disk(interrupted):
    run_dir, record = interrupted
    assert record["status"] == Status.KILLED
    assert [(a["arm"], a["status"], len(a["series"]["loss"])) for a in record["arms"]] == [
        ("reference", Status.COMPLETED, 24), ("gated", Status.KILLED, 14)]
    on_disk = json.loads(next(run_dir.glob("smoke-standard-*.json")).read_text())
    assert on_disk["status"] == Status.KILLED and [r["status"] for r in on_disk["runs"]] == [Status.COMPLETED, Status.KILLED]
    steps = {path.name.split("-")[0]: read_steplog(path) for path in (run_dir / "steps" / record["id"]).iterdir()}
    assert [row["step"] for row in steps["gated"]["steps"]] == list(range(14)) and steps["gated"]["end"] is None
    assert steps["reference"]["end"]["status"] == Status.COMPLETED and len(steps["reference"]["steps"]) == 24
    checkpoints = list((run_dir / "checkpoints" / record["id"]).glob("*.pt"))
    assert [p.name.split("-")[0] for p in checkpoints] == ["gated"]   # the finished arm's was deleted


def test_a_resumed_run_continues_bit_for_bit(interrupted, reference, tmp_path):
    source, _ = interrupted
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    resume = Resume.load(run_dir)
    assert resume.check_checkpoints() == 1
    record = run_pair(tiny(), session=Session(run_dir, resume=resume))
    assert record["status"] == Status.COMPLETED and record["id"] == resume.records[0]["id"]
    for expected, got in zip(reference["arms"], record["arms"]):
        assert got["series"]["loss"] == expected["series"]["loss"]          # bit for bit, every step
        assert got["series"]["update_norm"] == expected["series"]["update_norm"]
        assert got["final"] == expected["final"]
        assert got["applied"] == expected["applied"]   # the proof of the steps before the interruption kept
    assert record["arms"][1]["timing"]["resumed_at_step"] == 14
    gated = next((run_dir / "steps" / record["id"]).glob("gated-*.jsonl"))
    assert [row["loss"] for row in read_steplog(gated)["steps"]] == reference["arms"][1]["series"]["loss"]
    assert not list(run_dir.glob("checkpoints/**/*.pt"))


def test_compressed_per_step_files_keep_everything_and_a_resume_reads_them(reference, tmp_path):
    """``finished_steps="gzip"`` (the stress suites' sessions): a run's per-step file is gzipped once the run
    ends, its record names the gzipped file, a killed run's stays plain; resuming takes the finished run from the
    gzipped file and continues the other bit for bit. ``"drop"`` (rounding replicates): no file left, none named."""
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"

    def ctrl_c(arm, seed, step, figures):
        if arm == "gated" and step == 13:
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(Interrupted) as stop:
        run_pair(tiny(), session=watching(Session(run_dir, label="run", finished_steps="gzip"), ctrl_c))
    steps = run_dir / "steps" / stop.value.record["id"]
    (finished,) = steps.glob("reference-*.jsonl.gz")
    (killed,) = steps.glob("gated-*.jsonl")
    kept = read_steplog(finished)
    assert kept["end"]["status"] == Status.COMPLETED and len(kept["steps"]) == 24
    assert [row["loss"] for row in kept["steps"]] == reference["arms"][0]["series"]["loss"]
    assert not list(steps.glob("baseline-*.jsonl")) and read_steplog(killed)["end"] is None
    on_disk = json.loads(next(run_dir.glob("smoke-standard-*.json")).read_text())
    assert on_disk["runs"][0]["steps_file"] == str(finished.relative_to(run_dir))
    record = run_pair(tiny(), session=Session(run_dir, resume=Resume.load(run_dir), finished_steps="gzip"))
    assert [a["series"]["loss"] for a in record["arms"]] == [a["series"]["loss"] for a in reference["arms"]]
    assert sorted(p.name.split("-")[0] for p in steps.glob("*.jsonl.gz")) == ["gated", "reference"]
    assert not list(steps.glob("*.jsonl"))
    dropped = run_pair(tiny(), session=Session(tmp_path / "dropped", finished_steps="drop"))
    assert not list((tmp_path / "dropped").glob("steps/**/*.jsonl*"))
    assert [run["steps_file"] for run in dropped["runs"]] == ["", ""]
    assert [a["series"]["loss"] for a in dropped["arms"]] == [a["series"]["loss"] for a in reference["arms"]]


def test_a_run_interrupted_by_older_code_is_continued(interrupted, reference, tmp_path):
    """A record written before the plain pair was called "standard" says "pair", and its config holds the stress
    schedules' settings under their flat names (stress.ramp_end_lr ...): resuming finds it all the same (the same
    config, record, per-step files and checkpoint) and the record goes on as "standard"."""
    from test_config import flat_stress

    source, _ = interrupted
    run_dir = tmp_path / "run"
    shutil.copytree(source, run_dir)
    path = next(run_dir.glob("smoke-standard-*.json"))
    older = json.loads(path.read_text())
    path.write_text(json.dumps(as_schema_3(older, stress="pair", config=flat_stress(older["config"]))))
    resume = Resume.load(run_dir)
    assert resume.config == tiny()
    assert find_interrupted(tmp_path, "run", tiny()) == run_dir
    record = run_pair(tiny(), session=Session(run_dir, resume=resume))
    assert record["id"] == older["id"] and record["case"] == "standard"
    assert record["arms"][1]["timing"]["resumed_at_step"] == 14
    assert [a["series"]["loss"] for a in record["arms"]] == [a["series"]["loss"] for a in reference["arms"]]


@pytest.mark.parametrize("precision", [
    {"precision.dtype": "fp16", "precision.init_loss_scale": 2.0 ** 16, "precision.growth_interval": 4},
    {"precision.dtype": "fp8", "precision.fp8_recipe": "own", "precision.fp8_scaling": "delayed"},
], ids=["fp16-gradscaler", "fp8-own-delayed"])
def test_a_resumed_low_precision_run_continues_bit_for_bit(precision, tmp_path):
    """What the precision carries from step to step (GradScaler's scale and growth tracker, the own
    fp8's amax histories) is in the checkpoint: the resumed run's losses and loss scales are the
    uninterrupted run's."""
    torch.set_num_threads(1)
    config = tiny(**precision)
    expected = run_pair(config)
    run_dir = tmp_path / "run"

    def ctrl_c(arm, seed, step, figures):
        if arm == "gated" and step == 9:
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(Interrupted):
        run_pair(config, session=watching(Session(run_dir, label="run"), ctrl_c))
    record = run_pair(config, session=Session(run_dir, resume=Resume.load(run_dir)))
    got = record["arms"][1]
    assert got["timing"]["resumed_at_step"] == 10
    assert got["series"]["loss"] == expected["arms"][1]["series"]["loss"]
    assert got["series"]["loss_scale"] == expected["arms"][1]["series"]["loss_scale"]


# ----------------------------------------------------------------------------- bad resume input

@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _snapshot(directory):
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_resume_of_a_missing_target_is_bad_input(workdir, capsys):
    assert main(["run", "--resume", str(workdir / "nope"), "--no-track"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (workdir / "reports").exists()


def test_resume_of_a_corrupt_record_is_bad_input_and_overwrites_nothing(interrupted, workdir, capsys):
    run_dir = workdir / "run"
    shutil.copytree(interrupted[0], run_dir)
    record = next(run_dir.glob("smoke-standard-*.json"))
    record.write_text(record.read_text()[:200])
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "--no-track"]) == 2
    assert "not valid JSON" in capsys.readouterr().err and _snapshot(run_dir) == before


def test_resume_under_another_config_is_bad_input(interrupted, workdir, capsys):
    run_dir = workdir / "run"
    shutil.copytree(interrupted[0], run_dir)
    before = _snapshot(run_dir)
    args = ["run", "--resume", str(run_dir), "--no-track", *TINY_SETS, "--set", "optim.lr=0.01"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "belongs to another config" in err and "run.optim.lr" in err and _snapshot(run_dir) == before


def test_resume_with_a_corrupt_checkpoint_is_bad_input(interrupted, workdir, capsys):
    run_dir = workdir / "run"
    shutil.copytree(interrupted[0], run_dir)
    checkpoint = next(run_dir.glob("checkpoints/*/*.pt"))
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    before = _snapshot(run_dir)
    assert main(["run", "--resume", str(run_dir), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and checkpoint.name in err and _snapshot(run_dir) == before


def test_an_unwritable_checkpoint_directory_is_bad_input_before_training(workdir, capsys):
    blocker = workdir / "a-file"
    blocker.write_text("not a directory")
    assert main(["run", "--no-track", "--quiet", *TINY_SETS, "--checkpoint-dir", str(blocker / "ck")]) == 2
    err = capsys.readouterr().err
    assert "is not writable" in err and "a-file" in err
    assert not (workdir / "reports").exists()


def test_the_same_command_again_continues_the_interrupted_run(interrupted, reference, workdir, capsys):
    root = workdir / "reports" / "runs"
    shutil.copytree(interrupted[0], root / "20200101T000000-run-abcdef")
    assert main(["run", "--no-track", *TINY_SETS]) == 0
    out = capsys.readouterr().out
    assert "continuing an interrupted run" in out and "resuming after step 13" in out
    assert len(list(root.iterdir())) == 1
    record = json.loads(next(root.glob("*/smoke-standard-*.json")).read_text())
    assert record["status"] == Status.COMPLETED
    assert record["arms"][1]["series"]["loss"] == reference["arms"][1]["series"]["loss"]


# ----------------------------------------------------------------------------- replay bundles

@pytest.fixture(scope="module")
def lr_spike(tmp_path_factory):
    """A pair whose LR is multiplied by 1000 at step 14 (the config's fault injection): the update of step 14
    is huge, the loss of step 15 spikes."""
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("spike") / "run"
    config = tiny(**{"fault.kind": "lr_spike", "fault.step": 14, "fault.lr_factor": 1000.0, "steps": 18})
    session = Session(run_dir)
    record = run_pair(config, session=session)
    return record


def test_an_injected_lr_spike_is_flagged_by_the_update_norm_then_the_loss(lr_spike):
    for arm in lr_spike["arms"]:
        series = arm["series"]
        assert series["update_spike"][14] and not any(series["update_spike"][:14])   # the update itself
        assert series["loss_spike"][15] and not any(series["loss_spike"][:15])       # the loss one step later
        assert arm["final"]["update_spikes"] >= 1 and arm["final"]["max_update_norm"] == max(series["update_norm"])


def test_a_replay_reproduces_the_flagged_step_exactly(lr_spike, capsys):
    bundles = {(b["run_key"].split("-")[0], b["step"]): b for b in lr_spike["replay_bundles"]}
    bundle = bundles[("gated", 15)]
    assert main(["replay", bundle["path"]]) == 0
    out = capsys.readouterr().out
    gated = lr_spike["arms"][1]
    assert repr(gated["series"]["loss"][15]) in out
    assert out.count("reproduced exactly") == 2 and "NOT" not in out
    assert "blocks.0.attn " in out and "first module that went non-finite: none" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("blocks.0.attn ")}
    assert float(rows["blocks.0.attn"][2]) > 0   # the attention logit max of layer 0


def test_a_bundle_of_another_code_version_still_replays_and_says_so(lr_spike, tmp_path, capsys):
    path = next(b["path"] for b in lr_spike["replay_bundles"] if b["step"] == 15)
    bundle = torch.load(path, weights_only=True)
    bundle["code"] = "0123456789ab"
    torch.save(bundle, tmp_path / "old.pt")
    assert main(["replay", str(tmp_path / "old.pt")]) == 0
    assert "written by code version 0123456789ab" in capsys.readouterr().out
    bundle["model"]["embed.weight"] = bundle["model"]["embed.weight"][:, :16]   # another model
    torch.save(bundle, tmp_path / "other.pt")
    assert main(["replay", str(tmp_path / "other.pt")]) == 2
    assert "does not fit" in capsys.readouterr().err
    (tmp_path / "junk.pt").write_bytes(b"not a bundle")
    assert main(["replay", str(tmp_path / "junk.pt")]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_the_bundle_budget_keeps_the_first_and_the_worst(tmp_path):
    keeper = Bundles(tmp_path, first=1, worst=2)

    def bundle(step, severity):
        return {"run_key": "r", "step": step, "measured": {"severity": severity, "reasons": ["loss spike"]}}

    for step, severity in [(1, 7.0), (2, 6.5), (3, 9.0), (4, 8.0), (5, 6.1), (6, math.inf)]:
        keeper.save(bundle(step, severity))
    assert [(b["step"], b["kept_as"]) for b in keeper.index()] == [(1, "first"), (3, "worst"), (6, "worst")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-step1.pt", "r-step3.pt", "r-step6.pt"]


# ----------------------------------------------------------------------------- the update-norm probe

def test_the_update_norm_is_the_norm_of_what_the_step_changed():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    groups = {"w": [layer.weight], "b": [layer.bias]}
    norms = probes.UpdateNorms(groups)
    layer(torch.randn(5, 4)).pow(2).sum().backward()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    expected = [0.1 * layer.weight.grad.norm().item(), 0.1 * layer.bias.grad.norm().item()]
    norms.before()
    optimizer.step()
    total, w, b = norms.after().tolist()
    assert w == pytest.approx(expected[0], rel=1e-5) and b == pytest.approx(expected[1], rel=1e-5)
    assert total == pytest.approx(math.hypot(*expected), rel=1e-5)


# ----------------------------------------------------------------------------- files are data, never code

@pytest.fixture()
def marked_factory(tmp_path, monkeypatch):
    """A factory module whose import writes a file (the mark): (its model.factory path, the mark)."""
    mark = tmp_path / "imported.txt"
    (tmp_path / "marked_factory.py").write_text(
        f"from pathlib import Path\nPath({str(mark)!r}).write_text('imported')\nfrom _factories import tiny_lm as build\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def forget():
        """As in a new process: the module not imported yet, no mark."""
        sys.modules.pop("marked_factory", None)
        mark.unlink(missing_ok=True)
    yield "marked_factory:build", mark, forget
    sys.modules.pop("marked_factory", None)


def test_a_bundle_naming_a_factory_imports_nothing_without_trust_factory(marked_factory, tmp_path, capsys):
    factory, mark, forget = marked_factory
    torch.set_num_threads(1)
    config = tiny(**{"model.factory": factory, "fault.kind": "lr_spike", "fault.step": 14,
                     "fault.lr_factor": 1000.0, "steps": 18})
    record = run_pair(config, session=Session(tmp_path / "run"))
    bundle = next(b["path"] for b in record["replay_bundles"] if b["run_key"].startswith("gated"))
    forget()
    assert main(["replay", bundle]) == 2
    err = capsys.readouterr().err
    assert not mark.exists()                                    # the module's code never ran
    assert err.count("\n") == 1 and f"model.factory={factory!r}" in err and "--trust-factory" in err
    assert main(["replay", "--trust-factory", bundle]) == 0
    assert mark.exists() and "reproduced exactly" in capsys.readouterr().out


def test_resuming_a_run_whose_record_names_a_factory_needs_trust_factory(marked_factory, workdir, capsys):
    factory, mark, forget = marked_factory
    torch.set_num_threads(1)
    run_dir = workdir / "run"

    def ctrl_c(arm, seed, step, figures):
        if arm == "gated" and step == 9:
            signal.raise_signal(signal.SIGINT)

    with pytest.raises(Interrupted):
        run_pair(tiny(**{"model.factory": factory}), session=watching(Session(run_dir, label="run"), ctrl_c))
    forget()
    assert main(["run", "--resume", str(run_dir), "--no-track", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert not mark.exists() and err.count("\n") == 1 and "--trust-factory" in err
    own = ["--set", f"model.factory={factory}", *TINY_SETS]          # the command's own config names it: trusted
    assert main(["run", "--resume", str(run_dir), "--no-track", "--quiet", *own, "--set", "optim.lr=0.01"]) == 2
    assert "belongs to another config" in capsys.readouterr().err and not mark.exists()
    assert main(["run", "--resume", str(run_dir), "--no-track", "--quiet", "--trust-factory"]) == 0
    assert mark.exists()


def test_a_crafted_pickle_is_refused_with_its_cause_in_one_line(tmp_path, capsys):
    class Crafted:
        def __reduce__(self):
            return (print, ("this ran",))

    path = tmp_path / "crafted.pt"
    torch.save({"kind": "bundle", "payload": Crafted()}, path)
    assert main(["replay", str(path)]) == 2
    captured = capsys.readouterr()
    assert "this ran" not in captured.out and captured.err.count("\n") == 1
    assert "refused" in captured.err and "GLOBAL print" in captured.err and "weights_only" not in captured.err
