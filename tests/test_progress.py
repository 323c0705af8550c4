"""Progress while a command trains (stability/session/progress.py): bars with rate and ETA on a terminal
(the command runs on a pseudo-terminal here), plain lines with the same figures in a log (a pipe),
nothing with --quiet."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios

import pytest

from stability.session.progress import Progress, clock

STEPS = 100   # long enough for the bars to redraw several times on a fast machine
SETS = [arg for key, value in {"seeds": "0", "steps": STEPS, "probes.every": 50, "probes.eval_batches": 1,
                               "model.d_model": 32, "model.n_heads": 2, "model.n_kv_heads": 1,
                               "model.context": 32, "data.batch_size": 4, "data.builtin_bytes": 100_000}.items()
        for arg in ("--set", f"{key}={value}")]
TIMEOUT_S = 600


def command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "stability.cli", "run", "--no-track", *SETS, *extra]


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MLFLOW_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TERM": "xterm"}


def on_a_terminal(args: list[str], cwd) -> tuple[int, str]:
    """Run ``args`` with its output on a pseudo-terminal of 120 x 40; (exit code, what it showed)."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(args, cwd=cwd, env=environment(), stdin=subprocess.DEVNULL, stdout=side,
                               stderr=side, close_fds=True)
    os.close(side)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], TIMEOUT_S)
        if not ready:
            process.kill()
            pytest.fail(f"no output for {TIMEOUT_S} s: {b''.join(chunks)[-3000:]!r}")
        try:
            chunk = os.read(main, 65536)
        except OSError:        # the command ended and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return process.wait(timeout=TIMEOUT_S), b"".join(chunks).decode(errors="replace")


def test_on_a_terminal_bars_per_case_and_per_run_show_rate_eta_and_loss(tmp_path):
    code, shown = on_a_terminal(command(), tmp_path)
    assert code == 0, shown[-3000:]
    frames = re.split(r"[\r\n]", shown)
    run_bars = [f for f in frames if re.search(rf"\[standard\] gated-seed0: +\d+%\|.*\| *\d+/{STEPS} \[\d+:\d+<\d+:\d+, +"
                                               r"[\d.?]+ ?step/s, loss \d+\.\d{4}\]", f)]
    case_bars = [f for f in frames if re.search(rf"\[standard\]: +\d+%\|.*\| *\d+/{2 * STEPS} \[\d+:\d+<\d+:\d+, +[\d.?]+ ?step/s",
                                                f)]
    assert run_bars and case_bars, shown[-3000:]
    assert any(f"{2 * STEPS}/{2 * STEPS}" in f for f in case_bars)   # the case bar ends full
    assert not re.search(rf"step \d+/{STEPS} +loss", shown)         # no plain progress lines on a terminal
    assert f"gated-seed0: completed after {STEPS} steps" in shown


def test_in_a_log_plain_lines_carry_step_loss_rate_and_eta(tmp_path):
    run = subprocess.run(command(), cwd=tmp_path, env=environment(), capture_output=True, text=True,
                         timeout=TIMEOUT_S, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if "gated-seed0: step" in line]
    assert "\r" not in run.stdout and "%|" not in run.stdout + run.stderr
    pattern = (rf"^  \[standard\] gated-seed0: step (\d+)/{STEPS}  loss \d+\.\d{{4}}  lr \S+  grad-norm \S+  update-norm \S+"
               r"  [\d.]+ steps/s  ETA \d+:\d\d \(case \d+:\d\d\)$")
    assert all(re.match(pattern, line) for line in lines), lines
    steps = [int(re.match(pattern, line).group(1)) for line in lines]
    assert {1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 100} <= set(steps)   # every tenth, the last (and every 30 s)


def test_quiet_shows_neither_bars_nor_lines(tmp_path):
    code, shown = on_a_terminal(command("--quiet"), tmp_path)
    assert code == 0, shown[-3000:]
    assert "%|" not in shown and "step/s" not in shown and "steps/s" not in shown
    assert "record:" in shown


def test_the_eta_of_a_line_comes_from_the_steps_trained_here():
    class Log:
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    log = Log()
    progress = Progress(log)
    progress.case_started("[standard]", steps=200)
    progress.run_started("  [standard] gated-seed0", steps=100, first=50)   # resumed after step 49
    row = {"loss": 3.0, "lr": 1e-3, "grad_norm": 1.0, "update_norm": 0.1}
    for step in range(50, 60):
        progress.step(step, row)
    progress.run_clock = progress.case_clock = 0.0                          # as if it started at time 0
    line = progress.line(59, row, now=5.0)
    # 10 steps trained here in 5 s: 2 steps/s; 40 steps left in the run (20 s), 140 in the case (70 s)
    assert line.endswith("step 60/100  loss 3.0000  lr 1.00e-03  grad-norm 1  update-norm 0.1  2.0 steps/s  "
                         "ETA 0:20 (case 1:10)"), line
    assert "step 51/100" in log.text                                        # the first step trained here
    assert not progress.bars and clock(3725) == "1:02:05" and clock(None) == "?"


def test_one_line_per_run_names_its_replicate_and_a_run_stopped_early_still_gets_its_line():
    """What the stress suites show in a log (``lines_per_run=1``, no notes): one line when a run ends, prefixed
    with the rounding replicate; a run that diverged before its last step gets its line when it ends."""
    log = io.StringIO()
    progress = Progress(log, bars=False, lines_per_run=1, notes=False, prefix="replicate 1/2 ")
    progress.case_started("[precision_ladder]", steps=40)
    row = {"loss": 3.0, "lr": 1e-3, "grad_norm": None, "update_norm": 0.0}
    for label, last in (("  [precision_ladder] reference-seed0-fp16", 19), ("  [precision_ladder] gated-seed0-fp16", 6)):
        progress.run_started(label, steps=20)
        progress.note(f"{label}: 20 steps")
        for step in range(last + 1):
            progress.step(step, row)
        progress.run_ended(last + 1)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("replicate 1/2 [precision_ladder] reference-seed0-fp16: step 20/20  loss 3.0000  "
                               "lr 1.00e-03  grad-norm nan  update-norm 0  "), lines
    assert re.search(r"steps/s  ETA 0:00 \(case [0-9:?]+\)$", lines[0]), lines
    assert lines[1].startswith("replicate 1/2 [precision_ladder] gated-seed0-fp16: step 7/20") and \
        lines[1].endswith("(stopped)"), lines
    assert progress.case_total == 27     # the 13 steps the stopped run never trained left the case
