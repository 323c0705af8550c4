"""Runs of a case as Ray tasks (stability.cases.ray_runner): the same records as a run in one process, a
killed worker's unit retried and kept once, stable unit ids, clear errors for bad --ray values.

The tests that train share one local Ray instance with 2 CPUs (started once for the module: a few
seconds; every task trains a 6-step model of 32 channels)."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import replace

import pytest

from stability import config as cfg
from stability.cases.ray_runner import task_id, task_name
from stability.cases.runs import Unit, check_unique, hash_run, lr_rung, precision_rung
from stability.cases.stress import run_case
from stability.cli import main
from stability.config import resolve
from stability.config.schedules import Standard
from stability.record import Status

TINY = {"model.d_model": 32, "model.n_layers": 1, "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 16,
        "data.batch_size": 4, "data.builtin_bytes": 20_000, "probes.every": 5, "probes.eval_batches": 1,
        "probes.probe_batch_size": 2, "steps": 6, "seeds": "0", "stress.sweep_lrs": "0.001,0.1",
        "stress.shock.at_step": 3}


def tiny(**overrides):
    return resolve("smoke", {**TINY, **overrides})


def untimed(value):
    """``value`` without the wall-clock durations it holds (keys ending in "seconds": the quantization's)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith("seconds")}
    return [untimed(v) for v in value] if isinstance(value, list) else value


def figures(record: dict) -> str:
    """Everything a case measured, timings and run bookkeeping aside, as comparable text."""
    timing_free = ("timing", "unit", "run_name", "run_key")
    arms = [untimed({k: v for k, v in arm.items() if k not in timing_free}) for arm in record["arms"]]
    case = {k: v for k, v in (record.get(record["case"]) or {}).items() if k != "runs"}
    runs = [{k: v for k, v in run.items() if k != "timing"} for run in (record.get(record["case"]) or {})
            .get("runs", [])]
    return json.dumps({"arms": arms, "case": case, "runs": runs, "paired": record["paired"],
                       "status": record["status"]}, sort_keys=True, default=str)


# ----------------------------------------------------------------------------- without Ray

def test_unit_ids_are_stable_and_tell_runs_apart():
    config = tiny()
    run = config.arm_config("gated", 0)

    def sweep_unit(arm, seed, run):   # as the sweep makes them: the registry entry's rung, the LR
        return Unit("lr_sweep", arm, seed, run, Standard(), lr_rung(run))

    unit = sweep_unit("gated", 0, run)
    again = sweep_unit("gated", 0, config.arm_config("gated", 0))
    assert task_id(unit) == task_id(again) and len(task_id(unit)) == 16 and unit.key == again.key   # computed twice
    other_lr = sweep_unit("gated", 0, replace(run, optim=replace(run.optim, lr=0.5)))
    others = [other_lr, sweep_unit("reference", 0, config.arm_config("reference", 0)),
              sweep_unit("gated", 1, config.arm_config("gated", 1)),
              Unit("lr_ramp", "gated", 0, run, Standard())]
    assert len({task_id(unit), *(task_id(u) for u in others)}) == 5
    assert other_lr.rung.name == "lr=0.5" and task_name(other_lr) == "lr_sweep/gated/seed0/lr=0.5"
    digits = hash_run(other_lr.run, "standard")[:8]
    assert other_lr.run_name == "gated-seed0-lr0.5" and other_lr.key == f"gated-seed0-lr0.5-{digits}"
    with pytest.raises(ValueError, match=unit.key):
        check_unique([unit, again])


def test_the_registry_entry_names_the_runs_of_a_multi_run_case():
    from stability.cases.stress import CASES

    run = tiny().arm_config("gated", 0)
    assert CASES["lr_sweep"].rung(run) == lr_rung(run) and CASES["precision_ladder"].rung(run) == precision_rung(run)
    assert Unit("precision_ladder", "gated", 0, run, Standard(), precision_rung(run)).run_name == "gated-seed0-fp32"
    assert CASES["shock"].rung is None and Unit("shock", "gated", 0, run, Standard()).run_name == "gated-seed0"


@pytest.mark.parametrize("spec, expected", [("auto", {"address": "auto"}), ("local:3", {"num_cpus": 3}),
                                            ("10.0.0.5:6379", {"address": "10.0.0.5:6379"}),
                                            ("ray://head:10001", {"address": "ray://head:10001"})])
def test_ray_addresses(spec, expected):
    from stability.cases.ray_runner import parse_address

    assert parse_address(spec) == expected


@pytest.mark.parametrize("spec", ["local:0", "local:two", "somewhere", "host:port"])
def test_a_bad_ray_value_is_exit_2_before_anything_is_written(spec, tmp_path, capsys):
    assert main(["stress", "standard", "--ray", spec, "--out", str(tmp_path), "--no-track"]) == 2
    assert repr(spec) in capsys.readouterr().err and not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- on a local Ray instance

@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
    from stability.cases.ray_runner import RayRunner

    runner = RayRunner("local:2", max_retries=2)
    runner.connect()
    yield runner
    runner.close()
    assert not ray.is_initialized()


def test_a_ray_run_equals_a_local_run_figure_for_figure(ray_local):
    config = tiny()
    local = run_case("lr_sweep", config)
    remote = run_case("lr_sweep", config, runner=ray_local)
    assert figures(remote) == figures(local)
    assert [(a["arm"], a["seed"]) for a in remote["arms"]] == [(a["arm"], a["seed"]) for a in local["arms"]]
    units = remote["ray"]["units"]
    assert [u["name"] for u in units] == [f"lr_sweep/{arm}/seed0/lr={lr}" for arm in ("reference", "gated")
                                          for lr in ("0.001", "0.1")]
    assert remote["ray"]["retries"] == 0 and remote["ray"]["task_resources"] == {"num_cpus": 1}
    assert "ray" not in local


@pytest.mark.slow   # two pairs trained through Ray: CI runs it in its step of long tests
@pytest.mark.long
def test_a_killed_worker_is_retried_and_its_unit_counted_once(ray_local):
    from stability.cases.ray_runner import RayRunner

    config = tiny()
    victim = task_id(Unit("standard", "gated", 0, config.arm_config("gated", 0), Standard()))

    def kill_first_attempt(unit_id, attempt):   # the worker process dies in the middle of its task
        if unit_id == victim and attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    runner = RayRunner(ray_local.address, max_retries=2, before_unit=kill_first_attempt)  # joins ray_local's Ray
    record = run_case("standard", config, runner=runner)
    attempts = {u["id"]: u["attempts"] for u in record["ray"]["units"]}
    assert attempts[victim] == 2 and record["ray"]["retries"] == 1
    assert sorted(attempts.values()) == [1, 2]
    assert [(a["arm"], a["unit"]["id"]) for a in record["arms"]].count(("gated", victim)) == 1
    assert len(record["arms"]) == 2 and record["status"] == Status.COMPLETED
    killed = next(a for a in record["arms"] if a["unit"]["id"] == victim)
    assert killed["unit"]["attempt"] == 2
    assert figures(record) == figures(run_case("standard", config))   # the retried run measured the same


@pytest.mark.slow   # a pair trained through Ray: CI runs it in its step of long tests
@pytest.mark.long
def test_a_worker_killed_before_its_task_begins_is_counted_as_an_attempt(ray_local, tmp_path):
    """The worker dies while the task's arguments load, before its first instruction (the first seconds of a
    task: imports, unpickling): Ray retries it, and the record counts the two attempts Ray made."""
    from stability.cases.ray_runner import RayRunner

    class DiesOnArrival:
        """A ``before_unit`` whose loading in the worker kills it, once (the mark says it happened)."""

        def __init__(self, mark):
            self.mark = mark

        def __setstate__(self, state):
            self.__dict__.update(state)
            if not os.path.exists(self.mark):
                open(self.mark, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)

        def __call__(self, unit_id, attempt):
            pass

    config = tiny()
    runner = RayRunner(ray_local.address, max_retries=2, before_unit=DiesOnArrival(str(tmp_path / "died")))
    record = run_case("standard", config, runner=runner)
    assert (tmp_path / "died").exists()
    assert sorted(u["attempts"] for u in record["ray"]["units"]) == [1, 2] and record["ray"]["retries"] == 1
    retried = next(u["id"] for u in record["ray"]["units"] if u["attempts"] == 2)
    assert next(a for a in record["arms"] if a["unit"]["id"] == retried)["unit"]["attempt"] == 2
    assert len(record["arms"]) == 2 and record["status"] == "completed"


def test_stress_cli_with_ray(ray_local, tmp_path, capsys):
    """``stability stress --ray`` joins the Ray instance of this process and writes the usual records."""
    assert main(["stress", "shock", "--ray", "local:2", "--out", str(tmp_path), "--no-track", "--quiet",
                 *[arg for key, value in TINY.items() for arg in ("--set", f"{key}={value}")]]) == 0
    out = capsys.readouterr().out
    (path,) = tmp_path.glob("*/*shock*.json")
    record = json.loads(path.read_text())
    assert record["ray"]["address"] == "local:2" and len(record["arms"]) == 2 and str(path) in out
    assert record["results"]["shock"]["per_arm"][0]["shock_step"] == 3 and record["status"] == Status.COMPLETED


def test_negative_retries_are_a_config_error():
    from stability.cases.ray_runner import RayRunner

    with pytest.raises(cfg.ConfigError, match="max_retries=-1"):
        RayRunner("local:1", max_retries=-1)
