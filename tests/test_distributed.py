"""One arm across two processes (torchrun, gloo, CPU): FSDP2 and DDP reproduce the single-process run,
probes see the full parameters, a NaN on one rank is found there and stops both, a lost rank stops the
job with the steps so far on disk, and rank 0 alone keeps the record and the MLflow runs.

Tolerance of the comparisons with one process: relative 1e-5 on the per-step loss, gradient norm
and update norm over 12 steps. Two processes add the same numbers in another order (the loss is the
mean of two half-batch means, each gradient the average of two half-batch gradients, the squared
norms sums over shards), so each figure may differ from the one-process figure by a few fp32 units
in the last place (2^-23 ~ 1.2e-7 relative) per step, and the differences carry into later steps
through the weights. 1e-5 leaves room for that drift over 12 steps; what a wrong global figure
does is orders larger (a gradient norm left per rank is ~sqrt(2) = 41% off, a gradient summed
instead of averaged 100%).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from stability.config import ConfigError, DistributedConfig, FaultConfig, PrecisionConfig, resolve
from stability.record import Status
from stability.session.steplog import read_steplog
from stability.train import distributed
from stability.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = 1e-5
STEPS = 8   # of the command-line runs


def torchrun(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node 2 ARGS`` (a free port per launch), one thread per process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def close(a: list[float], b: list[float], what: str) -> None:
    assert len(a) == len(b), f"{what}: {len(a)} steps against {len(b)}"
    for step, (x, y) in enumerate(zip(a, b)):
        assert x == pytest.approx(y, rel=TOLERANCE), f"{what} at step {step}: {x} (2 processes) vs {y} (1 process)"


# ----------------------------------------------------------------------------- without processes



def test_each_rank_reads_its_own_rows_and_together_the_global_batch():
    batch = torch.arange(8 * 3).reshape(8, 3)
    parts = [distributed.local_rows(batch, distributed.World(rank, 4, rank, "gloo")) for rank in range(4)]
    assert [p.shape[0] for p in parts] == [2, 2, 2, 2]
    assert torch.equal(torch.cat(parts), batch)
    with pytest.raises(ConfigError, match="batch size 8 .* 3 processes"):
        distributed.local_rows(batch, distributed.World(0, 3, 0, "gloo"))


def test_what_cannot_train_across_processes_is_a_config_error_before_training():
    world = distributed.World(0, 2, 0, "gloo")
    run = resolve("smoke").run
    distributed.check(run, world)   # the smoke run can
    for bad, match in ((replace(run, data=replace(run.data, batch_size=5)), "data.batch_size=5"),
                       (replace(run, precision=PrecisionConfig(dtype="fp16")), "precision.dtype='fp16'"),
                       (replace(run, fault=FaultConfig(kind="nan", rank=2)), "fault.rank=2")):
        with pytest.raises(ConfigError, match=match):
            distributed.check(bad, world)
    with pytest.raises(ConfigError, match="distributed.strategy='zero'"):
        DistributedConfig(strategy="zero")
    with pytest.raises(ConfigError, match="fault.rank=-1"):
        FaultConfig(kind="kill")
    assert resolve("smoke", {"distributed.strategy": "ddp"}).run.distributed.strategy == "ddp"


# ----------------------------------------------------------------------------- two processes

@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """What each of two processes measured in the runs of tests/_distributed_worker.py."""
    out = tmp_path_factory.mktemp("ranks")
    result = torchrun(str(ROOT / "tests" / "_distributed_worker.py"), str(out))
    written = sorted(p.name for p in out.glob("rank*.json"))
    assert result.returncode == 0, f"written: {written}\n" + result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def one_process():
    from _distributed_worker import TINY

    torch.set_num_threads(1)
    return train(TINY, arm="gated")


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_two_processes_reproduce_the_single_process_steps(two_ranks, one_process, strategy):
    rank0, rank1 = (found[strategy] for found in two_ranks)
    assert rank0["distributed"] == {**rank0["distributed"], "world_size": 2, "strategy": strategy, "backend": "gloo"}
    assert rank0["status"] == one_process["status"] == Status.COMPLETED
    for key in ("loss", "grad_norm", "update_norm"):
        close(rank0["series"][key], one_process["series"][key], key)
    assert rank0["series"] == rank1["series"]   # global figures, spike and skip flags: the same on every rank
    assert rank0["final"]["heldout_loss"] == pytest.approx(one_process["final"]["heldout_loss"], rel=TOLERANCE)


def test_bf16_trains_sharded_under_fsdp2_mixed_precision_within_bf16_rounding(two_ranks):
    from _distributed_worker import BF16

    sharded = two_ranks[0]["bf16"]
    assert sharded["distributed"]["param_dtype"] == "bf16" and sharded["distributed"]["reduce_dtype"] == "fp32"
    single = train(BF16, arm="gated")   # autocast in one process: the same casts up to where they happen
    assert sharded["status"] == single["status"] == Status.COMPLETED
    for step, (x, y) in enumerate(zip(sharded["series"]["loss"], single["series"]["loss"])):
        assert x == pytest.approx(y, rel=2 ** -8), f"bf16 loss at step {step}: {x} vs {y}"   # bf16: 8 bits


def test_sharded_heavy_probes_equal_those_of_the_unsharded_weights(two_ranks, one_process):
    sharded = dict(two_ranks[0]["fsdp"]["probes"][-1])
    assert sharded.pop("step") == 11
    unsharded = two_ranks[0]["unsharded_probes"]   # the same trained weights, gathered into one plain model
    assert sharded == unsharded
    assert sharded["gate_score_mean"] is not None and sharded["f_attn_mean"] is not None
    assert two_ranks[1]["fsdp"]["probes"][-1] == two_ranks[0]["fsdp"]["probes"][-1]
    single = one_process["probes"][-1]
    for key in ("m_act_max", "f_attn_mean", "sink_rate_mean", "max_attn_logit", "gate_score_mean", "logit_max"):
        assert sharded[key] == pytest.approx(single[key], rel=TOLERANCE, abs=1e-6), key


def test_a_nan_on_rank_1_is_reported_at_its_step_rank_and_module_and_stops_both(two_ranks):
    from _distributed_worker import NAN_FAULT

    for found in two_ranks:
        run = found["nan"]
        assert run["status"] == Status.DIVERGED and run["diverged_at_step"] == NAN_FAULT.step
        assert len(run["series"]["loss"]) == NAN_FAULT.step + 1
        event = run["events"][0]
        assert (event["step"], event["rank"], event["module"], event["layer"]) == (NAN_FAULT.step, 1, "blocks.1", 1)
        assert event["rank_modules"] == [None, "blocks.1"]   # rank 0's rows stayed finite


def test_a_ctrl_c_reaching_one_rank_stops_every_rank_after_the_same_step(two_ranks):
    # the stop request travels in the next step's all-reduce: both ranks end after step 4
    assert [found["ctrl_c"]["status"] for found in two_ranks] == [Status.KILLED, Status.KILLED]
    assert [found["ctrl_c"]["series"]["step"] for found in two_ranks] == [list(range(5))] * 2


def test_torchrun_run_keeps_one_record_and_one_mlflow_parent_from_rank_0(request, tmp_path, tmp_path_factory):
    from _mlflow_store import migrated_template
    from mlflow.tracking import MlflowClient

    shutil.copy(migrated_template(request.config, tmp_path_factory), tmp_path / "m.db")
    store = f"sqlite:///{tmp_path}/m.db"
    result = torchrun("-m", "stability.cli", "run", "--preset", "smoke", "--set", "seeds=0", "--set", f"steps={STEPS}",
                      "--out", str(tmp_path / "runs"), "--tracking-uri", store, "--quiet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("record: ") == 1 and "torchrun: 2 processes" in result.stdout
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1
    records = [p for p in run_dirs[0].glob("*.json") if p.name != "manifest.json"]
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["status"] == Status.COMPLETED and [a["arm"] for a in record["arms"]] == ["reference", "gated"]
    assert all(a["distributed"]["world_size"] == 2 and len(a["series"]["loss"]) == STEPS for a in record["arms"])
    client = MlflowClient(tracking_uri=store)
    runs = client.search_runs([client.get_experiment_by_name("stability-smoke").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [p.info.run_id for p in parents] == [record["tracking"]["parent_run_id"]]
    assert sorted(c.info.run_name for c in children) == ["gated-seed0", "reference-seed0"]


def test_a_killed_rank_stops_the_job_and_the_record_keeps_the_steps_so_far(tmp_path):
    kill_at = 5
    result = torchrun("-m", "stability.cli", "run", "--preset", "smoke", "--set", "seeds=0", "--set", f"steps={STEPS}",
                      "--set", "fault.kind=kill", "--set", "fault.rank=1", "--set", f"fault.step={kill_at}",
                      "--out", str(tmp_path / "runs"), "--no-track", "--quiet", timeout=600)
    assert result.returncode != 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    (path,) = [p for p in run_dir.glob("*.json") if p.name != "manifest.json"]
    record = json.loads(path.read_text())
    (arm,) = record["arms"]     # the job stopped in the first arm: the gated arm never started
    assert record["status"] == Status.KILLED and arm["arm"] == "reference" and arm["status"] in (Status.ERROR, Status.KILLED)
    assert arm["series"]["step"] == list(range(kill_at))
    (steps,) = (run_dir / "steps").rglob("*.jsonl")
    assert [row["step"] for row in read_steplog(steps)["steps"]] == list(range(kill_at))
