"""The GPU check in one command, for the day a GPU is lent: on one H100 or H200, each part under a time budget of its
own, the budgets together 530 s, within the 540 (9 minutes) a lent machine's 10-minute command leaves after the
install. On the lent machine (no network; its image has torch, triton, pytest, pytest-xdist, hypothesis,
transformers, but not mlflow, bitsandbytes, torchao or pytest-benchmark, none of which a part needs):

    pip install --no-index --no-deps --no-build-isolation -e . && python -m validation.gpu_check --out-dir "$OUT"

    python -m validation.gpu_check --parts bench,step --steps 20   # some parts
    python -m validation.gpu_check --budget bench=200 --budget step=60
    python -m validation.gpu_check --dry-run --out-dir /tmp/gpucheck-dry   # every part's setup, on the CPU

The parts and their budgets in seconds (``BUDGETS``; --budget PART=SECONDS changes one, the chosen parts' budgets
must sum to at most ``TOTAL_BUDGET``). What a part costs on an H100 is an ESTIMATE (no GPU has run this check yet):
a compile takes 0.7 to 4 s of one CPU core (``reports/kernel-compile.md``: 920 compiles in 500 s with 2 cores), the
autotuner times each config it tries (about 0.1-0.3 s), the rest follows from the shapes and the plan. Each budget
holds the part's estimate with compiles at 1.5 s and still about its worst case at 4 s.

    kernel-tests  160  suites/test_kernel.py on the GPU, the subset of ``validation/gpu_check_subset.py``: every
                       gpu-marked bf16 test, then the tests that cover every other test function, gate mode, dtype,
                       head dim, causal and GQA group (29 of the 143 tests; about 130 compiles, against 480 for the
                       whole file), in --kernel-workers pytest-xdist processes sharing the GPU (8: the compiles are
                       CPU work and the machine has 16 cores). About 25 compiles a worker (some done twice):
                       ~40 s at 1.5 s, ~100 s at 4 s, plus ~15 s for the collection and the workers' start.
                       ``--kernel-tests all`` runs the whole file (give it a budget of its own)
    fp8-tests      35  real fp8 matmuls (torch._scaled_mm) against their emulation (the gpu-marked fp8 tests of
                       tests/test_precision.py: 2 tests, no Triton; ~15 s, mostly pytest's start); compute
                       capability >= 8.9, else "skipped"
    bench         140  ``python -m benchmarks.bench_kernel`` in a subprocess (validation/ imports nothing of
                       benchmarks/): fused gated / fused ungated / SDPA + separate gate, fwd and fwd+bwd, B4 H16 D128,
                       S 1k-8k, causal, bf16, with --skip-check: its correctness check's five shapes would add about
                       70 compiles, and the kernel-tests part's bf16 gpu tests are that check (the same rule against
                       float64). Its start (~5 s), about 28 compiles (~40-110 s), the autotuner timing 26 configs at
                       each S (~16 s), the timed runs (~5 s): ~70 s, ~140 s at worst. ``--bench-check`` runs its check
                       too (give it about 250 s)
    determinism    75  the fused kernel (fwd + bwd, B4 H16 S2048 D128 bf16, elementwise gate) in three fresh
                       processes (``validation/gpu_check_workers.py``): the first autotunes and says which blocks it
                       chose (``tuned_configs()``); the other two run with every autotuned kernel pinned to those
                       blocks (its config list cut to that one config before the first launch), so only the
                       arithmetic can differ: the two pinned processes bit for bit the same, and the same as the
                       first. Three starts (~20 s) and 15 compiles, on disk already after the bench: ~30 s, ~80 s
                       without the bench at 4 s a compile
    step          120  the ``full`` preset's gated arm (Triton kernel, bf16) in a subprocess, one run of --warmup
                       steps (they compile and autotune) and --steps timed ones, printing each step's status as it
                       ends (loss, grad norm, ok / spikes / non-finite, whether the step was skipped, seconds) and
                       then the run's status and stop reason (``record["stop_reason"]``; with the traceback of an
                       error); then seconds per timed step and their peak memory against the plan's
                       (``stability.plan``) and the model FLOP utilisation this GPU reached. Start and build ~15 s,
                       about 21 compiles (~30-85 s), 35 steps at 0.06-0.2 s, the evaluation: ~55 s, ~110 s at worst

``--out-dir DIR``: the table is written to DIR (``gpu-check.md``, and ``gpu-check.json`` beside it) before the first
part and again after each, so a run killed midway keeps every part it finished (the JSON says which part was
running); each part's full output goes to ``DIR/<part>.log`` as it comes, the kernel tests run to
``DIR/kernel-tests.txt``, the bench's table to ``DIR/bench.md``. Without --out-dir these go to a temporary folder,
named at the end. Each part's output is also echoed as it comes.

It ends with the lines to commit: the benchmark table for docs/kernel.md, the measured utilisation and step for
docs/scale-out.md (and ``DEFAULT_MFU`` of ``stability/plan/rates.py`` when it is off by more than a tenth).

Exit status: 0 every part passed (or was skipped); 1 a part failed or ran past its budget ("timeout", a failure;
the part's process group is killed and the next part starts); 2 bad arguments (budgets over ``TOTAL_BUDGET``
included), or no CUDA GPU: then it stops before any part and writes nothing, naming what it needs (``NEEDS``).

``--dry-run`` needs no GPU and runs every part's setup on the CPU: the kernel subset collected, selected and its
node ids collected again by pytest with the options of the real run; the fp8 tests collected; the bench command run
(without CUDA it parses its arguments and exits); the determinism part's three processes on a small shape in the
Triton interpreter; the step worker building the full arm (model, bf16 policy, optimiser, corpus) and training the
smoke preset for 1 + 2 steps, with its step lines, stop reason and rows; the plan of a full step. It writes the
table to --out-dir as the real run does, and exits 0, or 1 when a setup failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from validation import gpu_check_subset, gpu_check_workers

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("kernel-tests", "fp8-tests", "bench", "determinism", "step")
BUDGETS = {"kernel-tests": 160, "fp8-tests": 35, "bench": 140, "determinism": 75, "step": 120}
TOTAL_BUDGET = 540            # 9 of a lent machine's 10 minutes a command: the install and this process get the rest
WARMUP_STEPS = 5
KERNEL_WORKERS = 8
NEEDS = ("a CUDA GPU (one H100 or H200; torch.cuda.is_available() is True) with the CUDA build of torch >= 2.11 "
         "and triton >= 3.6")
VERDICTS = ("pass", "fail", "skipped", "timeout", "info")
TABLE, TABLE_JSON = "gpu-check.md", "gpu-check.json"
FP8_TESTS = ["tests/test_precision.py", "-m", "gpu", "-k", "fp8"]


@dataclass
class Row:
    """One line of the table: the part, what was measured, its value, the verdict (``VERDICTS``)."""

    part: str
    item: str
    value: str
    verdict: str

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict={self.verdict!r} is invalid: expected one of {VERDICTS}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)} (default all)")
    p.add_argument("--steps", type=int, default=30, help="timed steps of the step part (default 30)")
    p.add_argument("--warmup", type=int, default=WARMUP_STEPS, help=f"warm-up steps first (default {WARMUP_STEPS})")
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="bench S values")
    p.add_argument("--budget", action="append", default=[], metavar="PART=SECONDS",
                   help=f"a part's time budget (default {', '.join(f'{k} {v}' for k, v in BUDGETS.items())}); the "
                        f"chosen parts' budgets must sum to at most {TOTAL_BUDGET} s")
    p.add_argument("--kernel-tests", choices=("subset", "all"), default="subset",
                   help="the kernel part's tests: the covering subset (default) or the whole file")
    p.add_argument("--kernel-workers", type=int, default=KERNEL_WORKERS,
                   help=f"pytest-xdist processes of the kernel part, sharing the GPU (default {KERNEL_WORKERS}; 0: one "
                        "process)")
    p.add_argument("--bench-check", action="store_true", help="run the bench's own correctness check too")
    p.add_argument("--out-dir", default=None, help="write the table (gpu-check.md, gpu-check.json) and each part's "
                                                   "log here, after each part")
    p.add_argument("--dry-run", action="store_true", help="every part's setup on the CPU, the table written; no GPU")
    args = p.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown or not args.parts:
        p.error(f"--parts {','.join(unknown) or '(empty)'} is invalid: expected some of {', '.join(PARTS)}")
    if not args.steps > 0 or not args.warmup > 0 or args.kernel_workers < 0:
        p.error(f"--steps {args.steps} / --warmup {args.warmup} / --kernel-workers {args.kernel_workers} is invalid: "
                "expected positive numbers (workers: 0 or more)")
    args.budgets = dict(BUDGETS)
    for entry in args.budget:
        part, _, seconds = entry.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = 0.0
        if part not in PARTS or not value > 0:
            p.error(f"--budget {entry!r} is invalid: expected PART=SECONDS with PART one of {', '.join(PARTS)} and "
                    "SECONDS positive")
        args.budgets[part] = value
    args.budgets = {part: args.budgets[part] for part in args.parts}
    if budget_sum(args.budgets) > TOTAL_BUDGET:
        p.error(f"the budgets of {', '.join(args.parts)} sum to {budget_sum(args.budgets):.0f} s: over the "
                f"{TOTAL_BUDGET} s a lent GPU's command has for them")
    return args


def budget_sum(budgets: dict) -> float:
    return sum(budgets.values())


def budget_lines(budgets: dict) -> str:
    """The budgets and their sum, as printed and written."""
    return ("budgets (s): " + ", ".join(f"{part} {seconds:.0f}" for part, seconds in budgets.items())
            + f"; sum {budget_sum(budgets):.0f} of {TOTAL_BUDGET}")


def pytest_verdict(returncode: int, summary: str) -> str:
    """pass / fail / skipped from a pytest exit status (5: nothing collected or all deselected)."""
    if returncode == 0:
        return "skipped" if " passed" not in summary else "pass"
    if returncode == 5:
        return "skipped"
    return "fail"


def table(rows: list[Row], header: str) -> str:
    """The one markdown table the check prints."""
    lines = [header, "", "| part | check | value | verdict |", "|---|---|---|---|"]
    lines += [f"| {r.part} | {r.item} | {r.value.replace('|', '/')} | {r.verdict} |" for r in rows]
    failed = [r for r in rows if r.verdict in ("fail", "timeout")]
    lines += ["", f"{len(failed)} failed" + (": " + "; ".join(f"{r.part} {r.item}" for r in failed) if failed else "")]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- running under a budget

@dataclass
class Outcome:
    """A subprocess run under a budget: its exit status (None: killed at the budget), output, seconds."""

    code: int | None
    output: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.code is None


_RUNNING: set[int] = set()    # the process groups of the parts' subprocesses running now


def _stop_running(signum, frame):
    """SIGTERM / SIGINT to the check: its subprocesses (each in a session of its own) go with it."""
    for pid in list(_RUNNING):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    raise SystemExit(128 + signum)


def run_budgeted(command: list[str], budget: float, log: Path | None = None, env: dict | None = None,
                 echo: str | None = "    ") -> Outcome:
    """Run ``command`` in the repository root, its output echoed line by line (and appended to ``log``); killed
    (its whole process group) when it runs past ``budget`` seconds."""
    started = time.perf_counter()
    lines: list[str] = []
    with open(log, "a") if log is not None else contextlib.nullcontext() as handle:
        if handle is not None:
            handle.write(f"$ {' '.join(command)}\n")
            handle.flush()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", start_new_session=True)
        _RUNNING.add(process.pid)

        def pump():
            for line in process.stdout:
                lines.append(line)
                if echo is not None:
                    print(echo + line.rstrip("\n"), flush=True)
                if handle is not None:
                    handle.write(line)
                    handle.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=max(1.0, budget))
        except subprocess.TimeoutExpired:
            code = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        _RUNNING.discard(process.pid)
        reader.join(timeout=10)
        seconds = time.perf_counter() - started
        if handle is not None:
            handle.write(f"[exit {code if code is not None else f'killed at the budget of {budget:.0f} s'}, "
                         f"{seconds:.1f} s]\n")
    return Outcome(code, "".join(lines), seconds)


def pytest_command(tests: list[str], workers: int) -> list[str]:
    """pytest over ``tests`` (node ids, or a path and options), without the repository's addopts (which need
    pytest-benchmark), verbose (a line per test as it ends, so a killed run still says what passed)."""
    parallel = ["-n", str(workers), "--dist", "load"] if workers > 0 else []
    return [sys.executable, "-m", "pytest", *gpu_check_subset.PYTEST, *parallel, "-v", "-rfE", "--durations=10",
            *tests]


def shown(command: list[str]) -> str:
    """A command as a shell line, ``python`` for this interpreter."""
    return " ".join(["python", *command[1:]] if command[0] == sys.executable else command)


def collect_command(tests: list[str]) -> list[str]:
    """pytest collecting ``tests`` as the run would (the same options), running none."""
    return [sys.executable, "-m", "pytest", *gpu_check_subset.PYTEST, "--collect-only", "-q", *tests]


def pytest_row(part: str, item: str, outcome: Outcome, budget: float) -> Row:
    """The row of a pytest run: its summary line, or the tests that ended before the budget ran out."""
    lines = outcome.output.strip().splitlines()
    if outcome.timed_out:
        counts = {word: sum(f" {word} " in f" {line} " for line in lines) for word in ("PASSED", "FAILED", "ERROR")}
        done = ", ".join(f"{n} {word.lower()}" for word, n in counts.items() if n) or "no test ended"
        return Row(part, item, f"over its budget of {budget:.0f} s ({done} by then)", "timeout")
    summary = summary_of(outcome.output) or f"exit {outcome.code}, no summary line"
    return Row(part, item, f"{summary} ({outcome.seconds:.0f} s)", pytest_verdict(outcome.code, summary))


SUMMARY = re.compile(r"^=*\s*((?:\d+ (?:passed|failed|skipped|errors?|deselected|xfailed|xpassed|warnings?)"
                     r"(?:, )?)+ in [\d.]+s.*?|no tests ran.*?)\s*=*$")


def summary_of(output: str) -> str | None:
    """pytest's last summary line ("3 passed, 1 skipped in 2.0s"), without its = signs; None without one."""
    for line in reversed(output.splitlines()):
        found = SUMMARY.match(line.strip())
        if found:
            return found.group(1)
    return None


# ----------------------------------------------------------------------------- the parts

class Context:
    """What the parts share: the arguments, the output folder, the budgets and what was measured."""

    def __init__(self, args, out_dir: Path):
        self.args, self.out_dir = args, out_dir
        self.measured: dict | None = None
        self.bench_report = out_dir / "bench.md"
        self.header = ""

    def log(self, part: str) -> Path:
        return self.out_dir / f"{part}.log"


def kernel_selection(ctx: Context, budget: float) -> tuple[list[str], str, list[Row]]:
    """(the kernel tests to run, how they were chosen, the rows that say so); the collection within ``budget``."""
    if ctx.args.kernel_tests == "all":
        return [gpu_check_subset.SUITE, "-m", gpu_check_subset.MARKER], f"all of {gpu_check_subset.SUITE}", []
    items = gpu_check_subset.collect(ROOT, timeout=budget)
    chosen = gpu_check_subset.select(items)
    covered = gpu_check_subset.coverage(items, chosen)
    missing = gpu_check_subset.missing(items, chosen)
    shown = "; ".join(f"{key} {', '.join(have)}" for key, (have, _) in covered.items() if key != "function")
    (ctx.out_dir / "kernel-tests.txt").write_text("\n".join(chosen) + "\n")
    row = Row("kernel-tests", f"subset of {gpu_check_subset.SUITE} -m {gpu_check_subset.MARKER}",
              f"{len(chosen)} of {len(items)} tests, {len(covered['function'][0])} test functions; {shown}"
              + (f"; NOT covered: {missing}" if missing else ""), "fail" if missing else "info")
    return chosen, f"{len(chosen)} of {len(items)} tests", [row]


def kernel_tests(ctx: Context, budget: float) -> list[Row]:
    deadline = time.perf_counter() + budget
    tests, label, rows = kernel_selection(ctx, budget)
    if any(r.verdict == "fail" for r in rows):
        return rows
    env = {**os.environ, "STABILITY_GPU_SHARING": "1"}        # the xdist workers share the one GPU
    outcome = run_budgeted(pytest_command(tests, ctx.args.kernel_workers), deadline - time.perf_counter(),
                           ctx.log("kernel-tests"), env)
    workers = f"{ctx.args.kernel_workers} workers" if ctx.args.kernel_workers else "one process"
    return rows + [pytest_row("kernel-tests", f"{label} on the GPU ({workers})", outcome, budget)]


def fp8_tests(ctx: Context, budget: float) -> list[Row]:
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        return [Row("fp8-tests", "real fp8 matmul", f"compute capability {torch.cuda.get_device_capability()}",
                    "skipped")]
    outcome = run_budgeted(pytest_command(FP8_TESTS, 0), budget, ctx.log("fp8-tests"))
    return [pytest_row("fp8-tests", " ".join(FP8_TESTS), outcome, budget)]


def bench_command(ctx: Context) -> list[str]:
    return [sys.executable, "-m", "benchmarks.bench_kernel", "--out", str(ctx.bench_report), "--seqlens",
            *map(str, ctx.args.seqlens), *([] if ctx.args.bench_check else ["--skip-check"])]


def bench_rows(report: str, checked: bool) -> list[Row]:
    """The rows of bench_kernel's markdown report."""
    rows = [Row("bench", "bf16 correctness (fwd + bwd vs float64)", "flash rule", "pass") if checked else
            Row("bench", "bf16 correctness", "not run here (--skip-check): the kernel-tests part's bf16 gpu tests "
                "check it, same rule", "info")]
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].isdigit():      # | S | implementation | fwd ms | TFLOP/s | fwd+bwd ms | TFLOP/s |
            rows.append(Row("bench", f"S={cells[0]} {cells[1]}", f"fwd {cells[2]} ms, fwd+bwd {cells[4]} ms "
                            f"({cells[5]} TFLOP/s)", "info"))
        elif len(cells) == 5 and cells[0].isdigit():    # | S | speedup fwd+bwd | speedup fwd | overhead ... |
            rows.append(Row("bench", f"S={cells[0]} fused gated vs SDPA + gate", f"fwd+bwd {cells[1]}, fwd {cells[2]}; "
                            f"gate overhead {cells[3]}", "info"))
        elif line.startswith("Goals"):
            what, _, verdict = line.partition(":")
            rows.append(Row("bench", what.strip(), verdict.strip(), "info"))
    return rows


def bench(ctx: Context, budget: float) -> list[Row]:
    outcome = run_budgeted(bench_command(ctx), budget, ctx.log("bench"))
    item = "python -m benchmarks.bench_kernel" + ("" if ctx.args.bench_check else " --skip-check")
    if outcome.timed_out:
        return [Row("bench", item, f"over its budget of {budget:.0f} s", "timeout")]
    if outcome.code != 0 or not ctx.bench_report.is_file():
        return [Row("bench", item, f"exit {outcome.code}" + (" (correctness check failed)" if "FAILED" in
                                                             outcome.output else ""), "fail")]
    return bench_rows(ctx.bench_report.read_text(), ctx.args.bench_check)


def worker_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "validation.gpu_check_workers", *arguments]


def blocks_shown(pin: dict) -> str:
    return "; ".join(f"{kernel} ({', '.join(map(str, blocks))})" for kernel, blocks in sorted(pin.items())) or "none"


def determinism(ctx: Context, budget: float, dry: bool = False) -> list[Row]:
    """Process 1 autotunes; processes 2 and 3 run pinned to its blocks. ``dry``: the same three processes on the
    CPU (interpreter, a small shape, nothing autotuned so nothing pinned)."""
    deadline = time.perf_counter() + budget
    part = "determinism"
    flags = ("--dry-run",) if dry else ()
    first = run_budgeted(worker_command("determinism", *flags), budget, ctx.log(part))
    result = gpu_check_workers.read_result(first.output)
    if first.timed_out or result is None:
        return [Row(part, "process 1 (autotuned)", f"over its budget of {budget:.0f} s" if first.timed_out else
                    f"exit {first.code}, no result", "timeout" if first.timed_out else "fail")]
    try:
        pin = gpu_check_workers.pin_from(result["configs"])
    except ValueError as error:
        return [Row(part, "the blocks process 1 chose", str(error), "fail")]
    rows = [Row(part, f"process 1 (autotuned), {result['shape']}: the blocks it chose", blocks_shown(pin), "info")]
    pinned = []
    for number in (2, 3):
        outcome = run_budgeted(worker_command("determinism", "--pin", json.dumps(pin), *flags),
                               deadline - time.perf_counter(), ctx.log(part))
        got = gpu_check_workers.read_result(outcome.output)
        if outcome.timed_out or got is None:
            return rows + [Row(part, f"process {number} (pinned)", f"over its budget of {budget:.0f} s"
                               if outcome.timed_out else f"exit {outcome.code}, no result",
                               "timeout" if outcome.timed_out else "fail")]
        pinned.append(got)
    one_each = all(got["used"].get(kernel) == [blocks] for got in pinned for kernel, blocks in pin.items())
    used = "; ".join(f"{k}: {v}" for k, v in sorted(pinned[0]["used"].items())) or "no autotuned kernel (interpreter)"
    rows.append(Row(part, "processes 2 and 3 pinned to those blocks (one config per kernel)", used,
                    "pass" if one_each else "fail"))
    same = pinned[0]["digest"] == pinned[1]["digest"]
    rows.append(Row(part, "fwd+bwd bit for bit, pinned processes 2 and 3", f"{pinned[0]['digest']} vs "
                    f"{pinned[1]['digest']}", "pass" if same else "fail"))
    rows.append(Row(part, "fwd+bwd bit for bit, autotuned process 1 and pinned 2 (same blocks)",
                    f"{result['digest']} vs {pinned[0]['digest']}",
                    "pass" if result["digest"] == pinned[0]["digest"] else "fail"))
    return rows


def planned_step(gpu_name: str | None = None) -> dict:
    """The plan of one ``full`` step of the gated arm: FLOPs, seconds at the plan's utilisation on ``gpu_name``
    (default h200) and peak memory (bytes)."""
    from stability.config import resolve
    from stability.plan import DEFAULT_MFU, GPUS, gpu_rate, model_cost

    run = resolve("full").arm_config("gated", 0)
    cost = model_cost(run.model, run.optim.optimizer, run.precision.dtype, run.data.batch_size)
    flops = cost.train_flops_per_token * run.data.batch_size * run.model.context
    gpu = GPUS[gpu_name or "h200"]
    return {"flops": flops, "seconds": flops / gpu_rate(gpu, run.precision.dtype, DEFAULT_MFU),
            "memory_bytes": cost.memory_bytes, "mfu": DEFAULT_MFU, "gpu": gpu}


def gpu_name_of(device_name: str) -> str | None:
    """The plan's name of a CUDA device (a100, h100, h200), None for one it does not know."""
    from stability.plan import GPUS

    return next((name for name in GPUS if name in device_name.lower()), None)


def step_rows(result: dict, plan: dict, name: str | None) -> tuple[list[Row], dict | None]:
    """The step part's rows from the step worker's result, and what to commit from it (None: nothing timed)."""
    seconds, memory = result["seconds"], result["memory"]
    ok = result["status"] == "completed"
    reason = result["stop_reason"] or "none (every step trained)"
    if result["diverged_at_step"] is not None:
        reason += f", at step {result['diverged_at_step']}"
    rows = [Row("step", "status and stop reason", f"{result['status']}; stop reason: {reason}; {result['trained']} of "
                f"{result['steps']} steps trained", "pass" if ok else "fail")]
    if not seconds:
        return rows + [Row("step", "timed steps", "none trained", "fail")], None
    mfu = plan["flops"] / seconds / plan["gpu"].bf16 if name else None
    rows += [Row("step", f"full gated arm, triton bf16, {result['timed']} timed steps after {result['warmup']}",
                 f"{seconds:.3f} s/step (median {result['seconds_median']:.3f}; planned {plan['seconds']:.3f} at MFU "
                 f"{plan['mfu']:.2f}), {plan['flops'] / seconds / 1e12:.0f} TFLOP/s", "pass" if ok else "fail"),
             Row("step", "model FLOP utilisation", f"{mfu:.3f}" if mfu is not None else "unknown GPU: no peak", "info"),
             Row("step", "peak memory of the timed steps", f"{memory / 1e9:.1f} GB (planned "
                 f"{plan['memory_bytes'] / 1e9:.1f} GB)" if memory is not None else "not measured", "info")]
    return rows, {"seconds": seconds, "memory": memory, "mfu": mfu, "plan": plan, "gpu": name,
                  "status": result["status"], "stop_reason": result["stop_reason"]}


def step(ctx: Context, budget: float) -> list[Row]:
    outcome = run_budgeted(worker_command("step", "--steps", str(ctx.args.steps), "--warmup", str(ctx.args.warmup)),
                           budget, ctx.log("step"))
    result = gpu_check_workers.read_result(outcome.output)
    if outcome.timed_out or result is None:
        lines = outcome.output.splitlines()
        last_step = next((line for line in reversed(lines) if line.startswith("step ")), "none")
        stop = next((line for line in reversed(lines) if line.startswith("stop:")), "none printed")
        where = f"over its budget of {budget:.0f} s" if outcome.timed_out else f"exit {outcome.code}, no result"
        return [Row("step", "full gated arm, triton bf16", f"{where}; last step printed: {last_step}; run end: {stop}",
                    "timeout" if outcome.timed_out else "fail")]
    name = gpu_name_of(result["device"])
    rows, ctx.measured = step_rows(result, planned_step(name), name)
    return rows


RUNNERS = {"kernel-tests": kernel_tests, "fp8-tests": fp8_tests, "bench": bench, "determinism": determinism,
           "step": step}


# ----------------------------------------------------------------------------- the dry run: every part's setup

def dry_kernel_tests(ctx: Context, budget: float) -> list[Row]:
    tests, _, rows = kernel_selection(ctx, budget)
    if ctx.args.kernel_tests == "subset" and not any(r.verdict == "fail" for r in rows):
        # the node ids resolve: pytest collects exactly them
        outcome = run_budgeted(collect_command(tests), budget, ctx.log("kernel-tests"), echo=None)
        collected = next((line for line in reversed(outcome.output.splitlines()) if "collected" in line), "")
        ok = outcome.code == 0 and collected.startswith(f"{len(tests)} test")
        rows.append(Row("kernel-tests", "the subset's node ids, collected by pytest", collected or
                        f"exit {outcome.code}", "pass" if ok else "fail"))
    rows.append(Row("kernel-tests", "command", shown(pytest_command(["<node ids>"], ctx.args.kernel_workers)), "info"))
    return rows


def dry_fp8_tests(ctx: Context, budget: float) -> list[Row]:
    outcome = run_budgeted(collect_command(FP8_TESTS), budget, ctx.log("fp8-tests"), echo=None)
    collected = next((line for line in reversed(outcome.output.splitlines()) if "collected" in line), "")
    return [Row("fp8-tests", " ".join(FP8_TESTS) + ", collected", collected or f"exit {outcome.code}",
                "pass" if outcome.code == 0 and " 0 selected" not in collected else "fail")]


def dry_bench(ctx: Context, budget: float) -> list[Row]:
    # without CUDA the benchmark parses its arguments, says it needs a GPU and exits 0
    command = bench_command(ctx)
    outcome = run_budgeted(command, budget, ctx.log("bench"), echo=None)
    said = (outcome.output.strip().splitlines() or [""])[-1]
    return [Row("bench", "command", shown(command), "info"),
            Row("bench", "its arguments parsed, without CUDA", said[:160] or f"exit {outcome.code}",
                "pass" if outcome.code == 0 and "no CUDA" in said else "fail")]


def dry_determinism(ctx: Context, budget: float) -> list[Row]:
    sample = {"fwd/fast/sm_90": {"(256, 128, True, 'tf32', 1, True, 'torch.bfloat16')":
                                 "BLOCK_M: 128, BLOCK_N: 64, num_warps: 8, num_ctas: 1, num_stages: 3, maxnreg: None"}}
    pin = gpu_check_workers.pin_from(sample)
    return [*determinism(ctx, budget, dry=True),
            Row("determinism", "a pin read from tuned_configs()", blocks_shown(pin),
                "pass" if pin == {"fwd/fast/sm_90": [128, 64, 8, 3]} else "fail")]


def dry_step(ctx: Context, budget: float) -> list[Row]:
    outcome = run_budgeted(worker_command("step", "--dry-run"), budget, ctx.log("step"))
    result = gpu_check_workers.read_result(outcome.output)
    statuses = [line for line in outcome.output.splitlines() if line.startswith("step ")]
    stops = [line for line in outcome.output.splitlines() if line.startswith("stop:")]
    plan = planned_step()
    built = next((line for line in outcome.output.splitlines() if line.startswith("full arm built")), None)
    ok = result is not None and len(stops) == 1 and len(statuses) == result["steps"]
    built_rows = step_rows(result, plan, None)[0] if result else []
    return [Row("step", "the full arm's setup on the CPU (no step)", built or f"exit {outcome.code}",
                "pass" if built else "fail"),
            Row("step", "worker on the smoke preset, CPU", f"{len(statuses)} step lines; {stops[-1] if stops else ''}"
                if result else f"exit {outcome.code}", "pass" if ok else "fail"),
            Row("step", "the part's rows from that result", f"{len(built_rows)} rows; {built_rows[0].value}"
                if built_rows else "none", "pass" if len(built_rows) == 4 else "fail"),
            Row("step", f"planned full step (gated arm, bf16, {plan['gpu'].name} at MFU {plan['mfu']:.2f})",
                f"{plan['flops']:.3g} FLOPs, {plan['seconds']:.3f} s, peak memory {plan['memory_bytes'] / 1e9:.1f} GB",
                "info")]


DRY_RUNNERS = {"kernel-tests": dry_kernel_tests, "fp8-tests": dry_fp8_tests, "bench": dry_bench,
               "determinism": dry_determinism, "step": dry_step}


def dry_run(args) -> str:
    """What the check runs, with its budgets, and the plan of one full step (no subprocess: ``main --dry-run``
    runs the setups)."""
    plan = planned_step()
    lines = ["gpu_check --dry-run: every part's setup on the CPU. The check itself needs " + NEEDS + "; it runs:"]
    for part in args.parts:
        lines.append(f"  {part:13s} budget {args.budgets[part]:.0f} s")
    lines.append(budget_lines(args.budgets))
    lines.append(f"planned full step (gated arm, bf16, {plan['gpu'].name} at MFU {plan['mfu']:.2f}): "
                 f"{plan['flops']:.3g} FLOPs, {plan['seconds']:.3f} s, peak memory {plan['memory_bytes'] / 1e9:.1f} GB")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the table on disk

def to_commit(ctx: Context) -> str:
    """The lines to commit from this run (what the docs say is not measured yet)."""
    lines = ["What to commit from this run:"]
    if ctx.bench_report.is_file() and not ctx.args.dry_run:
        lines.append(f"  docs/kernel.md, Speed: the table of {ctx.bench_report.name} in the output folder (with the "
                     "date, GPU and versions of the header above)")
    measured = ctx.measured
    if measured:
        memory = f"{measured['memory'] / 1e9:.1f} GB" if measured["memory"] is not None else "not measured"
        mfu = f"{measured['mfu']:.3f}" if measured["mfu"] is not None else "unknown (a GPU the plan does not know)"
        lines.append(f"  docs/scale-out.md, the GPU check: a full step {measured['seconds']:.3f} s, peak memory "
                     f"{memory} (planned {measured['plan']['seconds']:.3f} s at {measured['plan']['mfu']:.2f}, "
                     f"{measured['plan']['memory_bytes'] / 1e9:.1f} GB), measured MFU {mfu}")
        if measured["mfu"] is not None and abs(measured["mfu"] / measured["plan"]["mfu"] - 1) > 0.1:
            lines.append(f"  stability/plan/rates.py: DEFAULT_MFU = {measured['mfu']:.2f} (the plan's numbers in "
                         "docs/scale-out.md and docs/merge-gate.md follow: `stability plan --preset gpu-pr` and "
                         "`--preset full --gpus 4`)")
    return "\n".join(lines) if len(lines) > 1 else ""


def write_outputs(ctx: Context, header: str, rows: list[Row], states: dict, seconds: dict, exit_code=None) -> None:
    """gpu-check.md and gpu-check.json in the output folder, each replaced whole (a reader never sees half)."""
    commit = to_commit(ctx)
    state_line = "parts: " + ", ".join(f"{part} {states[part]}" + (f" ({seconds[part]:.0f} s)" if part in seconds
                                                                     else "") for part in states)
    text = "\n".join([table(rows, header), "", budget_lines(ctx.args.budgets), state_line]) + "\n"
    if commit:
        text += "\n" + commit + "\n"
    data = {"header": header, "dry_run": ctx.args.dry_run, "budgets": ctx.args.budgets,
            "budget_sum": budget_sum(ctx.args.budgets), "budget_limit": TOTAL_BUDGET,
            "parts": {part: {"state": states[part], "budget": ctx.args.budgets[part], "seconds": seconds.get(part)}
                      for part in states},
            "rows": [asdict(r) for r in rows], "failed": sum(r.verdict in ("fail", "timeout") for r in rows),
            "measured": {k: v for k, v in (ctx.measured or {}).items() if k != "plan"} or None,
            "to_commit": commit or None, "exit": exit_code}
    for name, content in ((TABLE, text), (TABLE_JSON, json.dumps(data, indent=1, default=str) + "\n")):
        temporary = ctx.out_dir / (name + ".tmp")
        temporary.write_text(content)
        os.replace(temporary, ctx.out_dir / name)


def header_of(dry: bool) -> str:
    import torch

    if dry:
        return (f"### GPU check, dry run, {time.strftime('%Y-%m-%d')}: no GPU (torch {torch.__version__}), every "
                "part's setup only")
    import triton

    props = torch.cuda.get_device_properties(0)
    return (f"### GPU check, {time.strftime('%Y-%m-%d')}: {props.name} (sm{props.major}{props.minor}, "
            f"{props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, triton {triton.__version__}, "
            f"CUDA {torch.version.cuda}")


def run_parts(ctx: Context, runners: dict) -> list[Row]:
    """Every chosen part in turn, the table on disk before the first and after each; the rows."""
    args = ctx.args
    ctx.header = header_of(args.dry_run)
    started = time.perf_counter()
    rows: list[Row] = []
    states = {part: "pending" for part in args.parts}
    seconds: dict[str, float] = {}
    for part in args.parts:
        states[part] = "running"
        write_outputs(ctx, ctx.header, rows, states, seconds)
        print(f"gpu_check: {part} (budget {args.budgets[part]:.0f} s) ...", flush=True)
        t0 = time.perf_counter()
        try:
            rows += runners[part](ctx, args.budgets[part])
        except Exception as error:  # noqa: BLE001 (one broken part must not hide the others)
            traceback.print_exc()
            rows.append(Row(part, "raised", f"{type(error).__name__}: {error}"[:300], "fail"))
        seconds[part] = time.perf_counter() - t0
        states[part] = "done"
        print(f"gpu_check: {part} done in {seconds[part]:.0f} s (budget {args.budgets[part]:.0f} s)", flush=True)
    ctx.header += f"; {time.perf_counter() - started:.0f} s in all"
    write_outputs(ctx, ctx.header, rows, states, seconds, 1 if any(r.verdict in ("fail", "timeout") for r in rows)
                  else 0)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(f"error: gpu_check needs {NEEDS}; here torch {torch.__version__} sees no CUDA device. Nothing was run "
              "(--dry-run runs every part's setup on the CPU)", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = Context(args, out_dir)
    print(dry_run(args) if args.dry_run else budget_lines(args.budgets), flush=True)
    if not args.dry_run:
        os.environ.setdefault("STABILITY_DEVICE", "cuda")
    previous = {signum: signal.signal(signum, _stop_running) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        rows = run_parts(ctx, DRY_RUNNERS if args.dry_run else RUNNERS)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    code = 1 if any(r.verdict in ("fail", "timeout") for r in rows) else 0
    print("\n" + table(rows, ctx.header) + "\n\n" + budget_lines(args.budgets))
    commit = to_commit(ctx)
    if commit:
        print("\n" + commit)
    print(f"\nwritten: {out_dir / TABLE}, {out_dir / TABLE_JSON} and each part's log in {out_dir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
