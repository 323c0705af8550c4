"""Whatever stops a tracked run, MLflow ends with each step once, one parent per case, no run left RUNNING,
and no process of the command left behind.

Each test does what a user does: `stability run` in a subprocess with a SQLite store (a new one, or a copy
of a migrated one: a warm store), stopped at a step its progress lines print, by Ctrl-C (twice), by
kill -9, then resumed (live or ``--no-live``); then it reads the store itself (tests/_stopping.py,
``assert_each_step_once``). Ctrl-C once and resumed twice, live: tests/test_signals.py.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from _stopping import (
    SETS,
    STEPS,
    assert_each_step_once,
    command_line,
    ctrl_c,
    descendants,
    finish,
    start,
    store_copier,
    the_record,
    wait_for,
    wait_gone,
)

from stability.record import Status
from stability.track.ids import ids_file, read_ids


@pytest.fixture(scope="module")
def template_store(request, tmp_path_factory):
    return store_copier(request.config, tmp_path_factory)


def resume(tmp_path, run_dir, uri, *more) -> dict:
    """Continue the run to its end; the record it leaves."""
    code, _, err = finish(start(["run", "--tracking-uri", uri, "--resume", str(run_dir), *more], tmp_path))
    assert code == 0, err[-3000:]
    return the_record(tmp_path)[1]


def kill_9(process) -> list[int]:
    """kill -9 of the command (its own processes get no signal); the processes it had started (their output
    pipes are the command's: read to their end only once they are gone)."""
    below = descendants(process.pid)
    assert any("multiprocessing" in command_line(pid) for pid in below), [command_line(p) for p in below]
    process.kill()
    process.wait(timeout=600)
    return below


def wait_until(holds, limit: float = 600.0) -> bool:
    """Poll ``holds()`` every 0.1 s until it is true (True) or ``limit`` seconds passed (False); a bound far above
    what the sending process needs on a loaded machine: the test waits on it, it does not time it."""
    deadline = time.monotonic() + limit
    while not holds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def gone(process, below: list[int]) -> None:
    """Wait until none of the processes the killed command had started is alive; then close its pipes."""
    wait_gone(below)
    process.communicate(timeout=600)


@pytest.mark.slow   # a long test (a killed and resumed run twice over): CI runs it in a step of its own
@pytest.mark.long
def test_a_double_ctrl_c_keeps_the_run_ids_and_the_resume_continues_the_same_runs(tmp_path, template_store):
    uri = template_store(tmp_path / "m.db")
    process = start(["run", "--tracking-uri", uri, *SETS], tmp_path)
    wait_for(process, f"reference-seed0: step 97/{STEPS}")
    ctrl_c(process)
    time.sleep(0.05)      # the user's second Ctrl-C, 50 ms after the first
    ctrl_c(process)
    code, _, err = finish(process)
    assert code == 130, err[-3000:]
    run_dir, record = the_record(tmp_path)
    assert record["status"] == Status.KILLED
    tracking = record.get("tracking") or {}
    assert tracking.get("parent_run_id") and "reference-seed0" in tracking.get("child_run_ids", {}), \
        record.get("tracking")
    assert_each_step_once(uri, resume(tmp_path, run_dir, uri), STEPS)


def test_kill_9_on_a_new_store_leaves_no_process_and_the_resume_makes_no_second_run(tmp_path):
    """A new store: MLflow creates its tables while the reference arm trains; kill -9 in that arm."""
    uri = f"sqlite:///{tmp_path}/new.db"
    process = start(["run", "--tracking-uri", uri, *SETS], tmp_path)
    wait_for(process, f"reference-seed0: step 97/{STEPS}")
    gone(process, kill_9(process))
    run_dir, record = the_record(tmp_path)
    assert record["status"] == Status.RUNNING
    assert_each_step_once(uri, resume(tmp_path, run_dir, uri), STEPS)


@pytest.mark.slow   # a long test (a killed and resumed run): CI runs it in a step of its own
@pytest.mark.long
def test_runs_whose_ids_never_reached_the_disk_are_adopted_by_their_tags(tmp_path, template_store):
    """A warm store, the reference arm finished, kill -9 in the gated arm; then the run ids are taken out of
    the record and its ids file: what a kill in the moment between a run's creation and its id reaching
    the disk leaves. The resume finds the runs by the record id they are tagged with."""
    uri = template_store(tmp_path / "m.db")
    process = start(["run", "--tracking-uri", uri, *SETS], tmp_path)
    wait_for(process, f"gated-seed0: step 97/{STEPS}")
    os.kill(process.pid, signal.SIGSTOP)     # training pauses; the sending process goes on
    run_dir, _ = the_record(tmp_path)
    (path,) = run_dir.glob("smoke-standard-*.json")
    held = wait_until(lambda: (read_ids(ids_file(path)).get("child_run_ids") or {}).keys() >= {"gated-seed0"})
    gone(process, kill_9(process))
    run_dir, record = the_record(tmp_path)
    assert held and read_ids(ids_file(path))["child_run_ids"].keys() == {"reference-seed0", "gated-seed0"}
    ids_file(path).unlink()
    record.pop("tracking")
    path.write_text(json.dumps(record))
    assert_each_step_once(uri, resume(tmp_path, run_dir, uri), STEPS)


def paused_once_live_runs_hold_steps(process, tmp_path, uri) -> None:
    """Wait for the reference arm's step 97, pause training there (SIGSTOP; the sending process goes on) until
    the store's live run of that arm holds steps: a stop that lands mid-arm however loaded the machine is."""
    from mlflow.tracking import MlflowClient

    wait_for(process, f"reference-seed0: step 97/{STEPS}")
    os.kill(process.pid, signal.SIGSTOP)
    run_dir, _ = the_record(tmp_path)
    (path,) = run_dir.glob("smoke-standard-*.json")

    def holds_steps() -> bool:
        run_id = (read_ids(ids_file(path)).get("child_run_ids") or {}).get("reference-seed0")
        return bool(run_id) and bool(MlflowClient(tracking_uri=uri).get_metric_history(run_id, "loss"))
    assert wait_until(holds_steps), "the live run of reference-seed0 never held a step"


@pytest.mark.slow   # a long test (a killed and resumed run): CI runs it in a step of its own
@pytest.mark.long
def test_resume_no_live_continues_the_live_runs(tmp_path, template_store):
    """Ctrl-C once the live runs hold steps, then ``--resume --no-live``: the record sent at the end completes
    the live runs with the steps they lack."""
    uri = template_store(tmp_path / "m.db")
    process = start(["run", "--tracking-uri", uri, *SETS], tmp_path)
    paused_once_live_runs_hold_steps(process, tmp_path, uri)
    ctrl_c(process)                              # pending while paused: taken at the next instruction
    os.kill(process.pid, signal.SIGCONT)
    assert finish(process)[0] == 130
    run_dir, _ = the_record(tmp_path)
    assert_each_step_once(uri, resume(tmp_path, run_dir, uri, "--no-live"), STEPS)


def test_kill_9_leaves_no_live_tracking_process(tmp_path, template_store):
    uri = template_store(tmp_path / "m.db")
    process = start(["run", "--tracking-uri", uri, *SETS], tmp_path)
    paused_once_live_runs_hold_steps(process, tmp_path, uri)
    gone(process, kill_9(process))   # the sending process and multiprocessing's resource tracker


def test_a_clean_run_logs_every_point_once(tmp_path, template_store):
    """Nothing stopped: the live path and the upload at the end do not both send the final figures."""
    uri = template_store(tmp_path / "m.db")
    code, _, err = finish(start(["run", "--tracking-uri", uri, *SETS], tmp_path))
    assert code == 0, err[-3000:]
    assert_each_step_once(uri, the_record(tmp_path)[1], STEPS)
