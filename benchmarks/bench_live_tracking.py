"""What live tracking costs a training step: the same arm trained with and without it, side by side.

    python benchmarks/bench_live_tracking.py [--repeats 3] [--smoke-steps 200] [--large-steps 40]

Two settings: the ``smoke`` preset's model (a CPU step of a few ms: the worst case, where a fixed
per-step cost weighs most), and a larger model whose CPU step takes about as long as a step of the
``full`` preset on a GPU (some 100 ms: a ~124M-parameter model, 32 x 1024 tokens per step, bf16 on an
H100/H200 class GPU at 30-40% of its peak). For each, the gated arm is trained in three ways, in ABCCBA
order, ``--repeats`` times, in one process on one thread:

* ``plain``:       ``train()`` with no session (no files, no tracking)
* ``files``:       a session: per-step file, checkpoints, record after the run (no MLflow)
* ``live mlflow``: the same session plus live tracking into a SQLite store (a fresh copy per run)

As in a real command, one tracker serves all runs of a setting: its sending process is started
(and has created its first run) before the first timed step, so the one-time start (a Python
process importing MLflow, some seconds of CPU) is left out; over a long run it is nothing.

A step's time is measured between two consecutive steps (everything the loop does, callbacks
included), without the heavy-probe steps, twice: wall time, and the CPU time of the training
process (all its threads; what a step costs the process even when a loaded machine takes the CPU
away from it now and then). The table shows means and medians over all repeats and the overheads
relative to ``plain``; also the session's per-step callback alone (per-step file line and
``tracker.step``: what the training process pays per step) and the CPU time of the sending process
per step (spent on another core). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

# a CPU stand-in for one step of the GPU preset: some 100-200 ms on one thread of a 2020s server core
LARGE = {"model.d_model": 256, "model.n_layers": 2, "model.n_heads": 4, "model.n_kv_heads": 2,
         "model.context": 128, "data.batch_size": 8, "data.builtin_bytes": 1_000_000}


def migrated_store(folder: Path) -> Path:
    from mlflow.tracking import MlflowClient

    path = folder / "template.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


def step_times(run, mode: str, workdir: Path, tracker) -> tuple[list[float], list[float]]:
    """Train ``run`` once in ``mode``; (seconds between consecutive non-probe steps, callback seconds)."""
    from stability.cases.runs import Unit
    from stability.config import ExperimentConfig
    from stability.config.schedules import Standard
    from stability.record import new_case_record
    from stability.session.session import Session
    from stability.train.trainer import ArmHooks, train

    stamps: list[tuple[int, float, float]] = []
    inside: list[float] = []

    def clock(step, row):
        stamps.append((step, time.perf_counter(), time.process_time()))

    hooks, session = ArmHooks(), None
    if mode != "plain":
        folder = Path(tempfile.mkdtemp(dir=workdir))
        session = Session(folder / "run", tracker=tracker if mode == "live mlflow" else None)
        case = new_case_record(ExperimentConfig(run=run, preset="bench", name="bench"), "standard")
        hooks = session.arm_hooks(case, Unit("standard", "gated", run.seed, run, Standard()))
        if mode == "live mlflow":
            measured = hooks.on_step

            def timed(step, row):
                t0 = time.perf_counter()
                measured(step, row)
                inside.append(time.perf_counter() - t0)   # includes the per-step file line
            hooks.on_step = timed
    session_step = hooks.on_step

    def on_step(step, row):   # the clock first, then the session's own work
        clock(step, row)
        if session_step is not None:
            session_step(step, row)
    hooks.on_step = on_step
    record = train(run, arm="gated", hooks=hooks)
    if session is not None:
        session.arm_done(case, record)
        if session.tracker is not None:
            session.tracker.flush()    # between runs, not timed
    every = run.probes.every
    gaps = [(t1 - t0, c1 - c0) for (s0, t0, c0), (s1, t1, c1) in itertools.pairwise(stamps)
            if s1 % every != 0 and s0 % every != 0]
    return gaps, inside


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(name: str, run, repeats: int, workdir: Path, template: Path) -> list[tuple]:
    from stability.track.live import LiveTracker

    modes = ("plain", "files", "live mlflow")
    gaps = {m: [] for m in modes}
    inside: list[float] = []
    folder = Path(tempfile.mkdtemp(dir=workdir))
    shutil.copy(template, folder / "m.db")
    tracker = LiveTracker(f"sqlite:///{folder / 'm.db'}")
    step_times(replace(run, steps=min(run.steps, 10)), "live mlflow", workdir, tracker)  # start it; warm up
    sender_cpu, live_steps = 0.0, 0
    for _ in range(repeats):
        for mode in (*modes, *reversed(modes)):
            before = cpu_seconds(tracker._process.pid)
            got, spent = step_times(run, mode, workdir, tracker)
            if mode == "live mlflow":
                sender_cpu += cpu_seconds(tracker._process.pid) - before
                live_steps += run.steps
            gaps[mode] += got
            inside += spent
    failed = tracker.failed
    tracker.close()
    if failed:
        raise SystemExit(f"live tracking failed during the benchmark: {failed}")
    def stats(mode):
        wall = [w for w, _ in gaps[mode]]
        cpu = [c for _, c in gaps[mode]]
        return statistics.fmean(wall), statistics.median(wall), statistics.fmean(cpu)

    plain = stats("plain")
    rows = []
    for mode in modes:
        mean, median, cpu = stats(mode)
        rows.append((name, mode, f"{len(gaps[mode])}", f"{mean * 1e3:.2f}", f"{median * 1e3:.2f}", f"{cpu * 1e3:.2f}",
                     "-" if mode == "plain" else f"{100 * (median - plain[1]) / plain[1]:+.1f}%",
                     "-" if mode == "plain" else f"{100 * (cpu - plain[2]) / plain[2]:+.1f}%"))
    rows.append((name, "  its per-step callback", f"{len(inside)}", f"{statistics.fmean(inside) * 1e3:.3f}",
                 f"{statistics.median(inside) * 1e3:.3f}", "", f"{100 * statistics.median(inside) / plain[1]:.2f}%", ""))
    rows.append((name, "  sending process (other core)", f"{live_steps}", "", "", f"{sender_cpu / live_steps * 1e3:.3f}",
                 "", f"{100 * sender_cpu / live_steps / plain[2]:.2f}%"))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="ABCCBA cycles per setting")
    parser.add_argument("--smoke-steps", type=int, default=200)
    parser.add_argument("--large-steps", type=int, default=40)
    parser.add_argument("--settings", default="smoke,large", help="which settings to measure (comma list)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    import mlflow

    from stability.config import resolve

    smoke = resolve("smoke", {"steps": args.smoke_steps, "probes.every": 50}).arm_config("gated", 0)
    large = resolve("smoke", {**LARGE, "steps": args.large_steps, "probes.every": 20}).arm_config("gated", 0)
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        workdir = Path(tmp)
        template = migrated_store(workdir)
        rows = []
        if "smoke" in args.settings:
            rows += measure("smoke", smoke, args.repeats, workdir, template)
        if "large" in args.settings:
            rows += measure("large (GPU-like step)", large, args.repeats, workdir, template)
    print(f"torch {torch.__version__}, mlflow {mlflow.__version__}, 1 thread, {args.repeats} ABCCBA repeats; "
          f"step = wall time between consecutive non-probe steps")
    header = ("setting", "mode", "steps", "wall ms/step (mean)", "wall ms/step (median)", "CPU ms/step (mean)",
              "median wall vs plain", "CPU vs plain")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
