"""The real command in a subprocess, stopped as a user stops it, and what the MLflow store holds after.

    process = start(["run", ...], cwd)        # in its own process group, as a terminal's foreground job
    wait_for(process, "reference-seed0: step 97/160")
    ctrl_c(process)                           # SIGINT to the group: what Ctrl-C in a terminal sends
    process.kill()                            # kill -9 of the command: its children get no signal
    wait_gone(pids)                           # until none of them is alive (a generous outer limit)
    assert_each_step_once(uri, record, 160)   # read back from the store itself
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

TIMEOUT_S = 600
STEPS = 160   # a two-arm run of a tiny model: a progress line every 16 steps, a checkpoint every 40
CONFIG = {"seeds": "0", "steps": STEPS, "probes.every": 80, "probes.eval_batches": 1, "model.d_model": 32,
          "model.n_heads": 2, "model.n_kv_heads": 1, "model.context": 32, "data.batch_size": 4,
          "data.builtin_bytes": 100_000, "checkpoint.every": 40, "stress.threads": 1}
SETS = [arg for key, value in CONFIG.items() for arg in ("--set", f"{key}={value}")]   # as `stability run` takes it


def store_copier(pytest_config, tmp_path_factory):
    """``copy(path)``: a copy of an empty, migrated MLflow SQLite store at ``path`` (a warm store: migrating one
    takes seconds), as its URI."""
    from _mlflow_store import migrated_template

    template = migrated_template(pytest_config, tmp_path_factory)

    def copy(path: Path) -> str:
        shutil.copy(template, path)
        return f"sqlite:///{path}"
    return copy


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen([sys.executable, "-m", "stability.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def ctrl_c(process: subprocess.Popen) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to every process of the command's group."""
    os.killpg(process.pid, signal.SIGINT)


def wait_for(process: subprocess.Popen, text: str) -> list[str]:
    """Read the command's output until a line holds ``text``; the lines read so far."""
    lines, deadline = [], time.monotonic() + TIMEOUT_S
    for line in process.stdout:
        lines.append(line)
        if text in line:
            return lines
        if time.monotonic() > deadline:
            break
    process.kill()
    pytest.fail(f"no line with {text!r} from the command: {''.join(lines)[-3000:]}{process.stderr.read()[-3000:]}")


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=TIMEOUT_S)
    return process.returncode, out, err


def the_record(root: Path) -> tuple[Path, dict]:
    (run_dir,) = [p for p in (root / "reports" / "runs").iterdir() if p.is_dir()]
    (path,) = run_dir.glob("smoke-standard-*.json")
    return run_dir, json.loads(path.read_text())


# ----------------------------------------------------------------------------- processes

def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that runs (a zombie, dead and not yet reaped, is not)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def wait_gone(pids: list[int], limit: float = 120.0) -> float:
    """Wait until none of ``pids`` is alive; the seconds that took. Fails after ``limit`` seconds, a bound far
    above the time the processes need: the test waits on their end, it does not time it."""
    started = time.monotonic()
    while any(alive(pid) for pid in pids):
        if time.monotonic() - started > limit:
            pytest.fail(f"still alive {limit:.0f} s after the kill: "
                        f"{[(pid, command_line(pid)[:200]) for pid in pids if alive(pid)]}")
        time.sleep(0.1)
    return time.monotonic() - started


# ----------------------------------------------------------------------------- the store

def assert_each_step_once(uri: str, record: dict, steps: int, arms=("reference-seed0", "gated-seed0")) -> None:
    """From the store itself, after a run that ended (completed): the store holds the runs of this one record
    only, one parent for the case and one child per run, named once; none is left RUNNING; every metric
    series of every child holds each step once at most, and the per-step series every step from 0 to
    ``steps`` - 1; the record names these runs."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    assert {r.data.tags.get("stability.record_id") for r in runs} == {record["id"]}, "runs of another record"
    parents = [r for r in runs if r.data.tags.get("stability.level") == "pair"]
    children = [r for r in runs if r.data.tags.get("stability.level") == "arm"]
    assert len(parents) == 1, [(r.info.run_name, r.info.status) for r in parents]
    assert len(runs) == 1 + len(children)
    assert Counter(r.info.run_name for r in children) == Counter(arms), [r.info.run_name for r in children]
    assert {r.info.run_name: r.info.status for r in runs} == dict.fromkeys(
        [parents[0].info.run_name, *arms], "FINISHED")
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        for key in sorted(child.data.metrics):
            counts = Counter(point.step for point in client.get_metric_history(child.info.run_id, key))
            twice = {step: n for step, n in counts.items() if n > 1}
            assert not twice, f"{child.info.run_name} {key}: steps held more than once {twice}"
            if key in ("loss", "lr", "grad_norm", "update_norm"):
                assert sorted(counts) == list(range(steps)), (child.info.run_name, key, len(counts))
    tracking = record["tracking"]
    assert tracking["status"] == "tracked" and tracking["parent_run_id"] == parents[0].info.run_id
    assert tracking["child_run_ids"] == {r.info.run_name: r.info.run_id for r in children}
