"""The GPU check in one go, for the day a GPU is lent: on one H100 or H200, about 10 minutes (each test or
benchmark part at most --limit 150 s, the step part about a minute), one table at the end and what to commit.

    python -m validation.gpu_check                    # every part
    python -m validation.gpu_check --parts bench,step --steps 20
    python -m validation.gpu_check --out gpu_check.md # also write the table to a file
    python -m validation.gpu_check --dry-run          # what it would run, and the plan of one full step; no GPU

Installs nothing beyond the project (``pip install -e ".[test]"``). The parts, each reusing what the project
already has:

    kernel-tests  the compiled kernel suite: suites/test_kernel.py on the GPU (every test there runs the
                  compiled kernels, the flash-attention error rule against float64, forward and backward, the
                  bf16 and compiled cases of the gpu marker included)
    fp8-tests     real fp8 matmuls (torch._scaled_mm) against their emulation (the gpu-marked fp8 tests
                  of tests/test_precision.py); compute capability >= 8.9 only, "skipped" below
    bench         benchmarks/bench_kernel.py's table: fused gated / fused ungated / SDPA + separate gate,
                  fwd and fwd+bwd, B4 H16 D128 S1k-8k causal bf16 (its own correctness check first)
    determinism   the fused kernel (fwd + bwd) on the same inputs in two fresh processes: bit for bit
                  the same, and the blocks the autotuner chose in each
    step          the ``full`` preset's gated arm (Triton kernel, bf16) trained for --steps steps after a short
                  warm-up (which autotunes the kernels): seconds per step and peak memory against the plan's
                  (``stability.plan``), and the model FLOP utilisation this GPU reached

It ends with the lines to commit: the benchmark table for docs/kernel.md, the measured utilisation and step for
docs/scale-out.md (and ``DEFAULT_MFU`` of ``stability/plan/rates.py`` when it is off by more than a tenth).

Without a CUDA GPU it stops before any part (exit 2), naming what it needs; ``--dry-run`` prints the parts, their
limits and the planned full step instead (exit 0, no GPU needed). Exit 1 when a part failed. A part that runs
past its time limit is "timeout" (a failure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import bench_kernel

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("kernel-tests", "fp8-tests", "bench", "determinism", "step")
WARMUP_STEPS = 5
NEEDS = ("a CUDA GPU (one H100 or H200; torch.cuda.is_available() is True) with the CUDA build of torch >= 2.11 "
         "and triton >= 3.6")
VERDICTS = ("pass", "fail", "skipped", "timeout", "info")


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
    p.add_argument("--steps", type=int, default=30, help="timed steps of the full step part (default 30)")
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="bench S values")
    p.add_argument("--limit", type=float, default=150.0, help="seconds a test or bench part may take (default 150)")
    p.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    p.add_argument("--dry-run", action="store_true", help="print the parts, their limits and the planned full step; "
                                                          "run nothing (no GPU needed)")
    args = p.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown or not args.parts:
        p.error(f"--parts {','.join(unknown) or '(empty)'} is invalid: expected some of {', '.join(PARTS)}")
    if not args.steps > 0 or not args.limit > 0:
        p.error(f"--steps {args.steps} / --limit {args.limit} is invalid: expected positive numbers")
    return args


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
    lines += [f"| {r.part} | {r.item} | {r.value} | {r.verdict} |" for r in rows]
    failed = [r for r in rows if r.verdict in ("fail", "timeout")]
    lines += ["", f"{len(failed)} failed" + (": " + "; ".join(f"{r.part} {r.item}" for r in failed) if failed else "")]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the parts

def run_pytest(part: str, args: list[str], limit: float) -> Row:
    command = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", *args]
    started = time.perf_counter()
    try:
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return Row(part, " ".join(args), f"over {limit:.0f} s", "timeout")
    summary = (out.stdout.strip().splitlines() or [""])[-1]
    verdict = pytest_verdict(out.returncode, summary)
    if verdict == "fail":
        print(out.stdout[-4000:], out.stderr[-2000:], sep="\n", file=sys.stderr)
    return Row(part, " ".join(args), f"{summary} ({time.perf_counter() - started:.0f} s)", verdict)


def kernel_tests(args) -> list[Row]:
    return [run_pytest("kernel-tests", ["suites/test_kernel.py", "-m", "kernel"], args.limit)]


def fp8_tests(args) -> list[Row]:
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        return [Row("fp8-tests", "real fp8 matmul", f"compute capability {torch.cuda.get_device_capability()}",
                    "skipped")]
    return [run_pytest("fp8-tests", ["tests/test_precision.py", "-m", "gpu", "-k", "fp8"], args.limit)]


def bench(args) -> list[Row]:
    report = ROOT / "reports" / "gpu_check_bench.md"
    report.parent.mkdir(exist_ok=True)
    command = [sys.executable, str(ROOT / "benchmarks" / "bench_kernel.py"), "--out", str(report),
               "--seqlens", *map(str, args.seqlens)]
    try:
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.limit, check=False)
    except subprocess.TimeoutExpired:
        return [Row("bench", "bench_kernel.py", f"over {args.limit:.0f} s", "timeout")]
    if out.returncode != 0 or not report.is_file():
        print(out.stdout[-4000:], out.stderr[-2000:], sep="\n", file=sys.stderr)
        return [Row("bench", "bench_kernel.py (its correctness check included)", f"exit {out.returncode}", "fail")]
    rows = [Row("bench", "bf16 correctness (fwd + bwd vs float64)", "flash rule", "pass")]
    for line in report.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[0].isdigit():      # | S | implementation | fwd ms | TFLOP/s | fwd+bwd ms | TFLOP/s |
            rows.append(Row("bench", f"S={cells[0]} {cells[1]}", f"fwd {cells[2]} ms, fwd+bwd {cells[4]} ms "
                            f"({cells[5]} TFLOP/s)", "info"))
        elif len(cells) == 5 and cells[0].isdigit():    # | S | speedup fwd+bwd | speedup fwd | overhead ... |
            rows.append(Row("bench", f"S={cells[0]} fused gated vs SDPA + gate", f"fwd+bwd {cells[1]}, fwd {cells[2]}; "
                            f"gate overhead {cells[3]}", "info"))
    goal = next((line for line in report.read_text().splitlines() if line.startswith("Goals")), None)
    if goal:
        rows.append(Row("bench", f"goals ({bench_kernel.GOAL_SPEEDUP}x at S={bench_kernel.GOAL_SEQ}, gate <= "
                        f"{100 * bench_kernel.GOAL_GATE_OVERHEAD:.0f}%)", goal.split(":", 1)[1].strip(), "info"))
    return rows


DETERMINISM = r"""
import hashlib, json, torch
from benchmarks import bench_kernel
from stability.kernels import gated_attention
from stability.kernels.gated_attention import tuned_configs
leaves, dy = bench_kernel.make_inputs(4, 16, 16, 2048, 128, torch.bfloat16)
y = gated_attention(*leaves)
grads = torch.autograd.grad(y, leaves, dy)
digest = hashlib.sha256(b"".join(t.detach().float().cpu().numpy().tobytes() for t in (y, *grads))).hexdigest()
print(json.dumps({"digest": digest[:16], "configs": tuned_configs()}))
"""


def determinism(args) -> list[Row]:
    results = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", DETERMINISM], cwd=ROOT, capture_output=True, text=True,
                             timeout=args.limit, check=False)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return [Row("determinism", "two processes, B4 H16 S2048 D128 bf16", f"exit {out.returncode}", "fail")]
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    same = results[0]["digest"] == results[1]["digest"]
    same_blocks = results[0]["configs"] == results[1]["configs"]
    blocks = "; ".join(f"{k}: {v}" for k, v in results[0]["configs"].items())
    return [Row("determinism", "fwd+bwd bit for bit in two processes", f"{results[0]['digest']} vs "
                f"{results[1]['digest']}", "pass" if same else "fail"),
            Row("determinism", "autotuned blocks the same in both", blocks.replace("|", "/"),
                "pass" if same_blocks else "fail")]


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


def step(args) -> list[Row]:
    import dataclasses

    import torch

    from stability.config import resolve
    from stability.config.schedules import Standard
    from stability.train.trainer import train

    run = resolve("full").arm_config("gated", 0)
    run = dataclasses.replace(run, probes=dataclasses.replace(run.probes, every=10**6))
    train(dataclasses.replace(run, steps=WARMUP_STEPS), Standard(), arm="gated")    # compiles, autotunes
    torch.cuda.reset_peak_memory_stats()
    record = train(dataclasses.replace(run, steps=args.steps), Standard(), arm="gated")
    seconds = record["timing"]["train_seconds"] / max(1, len(record["series"]["step"]))
    memory = torch.cuda.max_memory_allocated()
    name = gpu_name_of(torch.cuda.get_device_name())
    plan = planned_step(name)
    mfu = plan["flops"] / seconds / plan["gpu"].bf16 if name else None
    args.measured = {"seconds": seconds, "memory": memory, "mfu": mfu, "plan": plan, "gpu": name,
                     "status": record["status"]}
    ok = record["status"] == "completed"
    return [Row("step", f"full gated arm, triton bf16, {args.steps} steps after {WARMUP_STEPS}",
                f"{seconds:.3f} s/step (planned {plan['seconds']:.3f} at MFU {plan['mfu']:.2f}), "
                f"{plan['flops'] / seconds / 1e12:.0f} TFLOP/s, status {record['status']}", "pass" if ok else "fail"),
            Row("step", "model FLOP utilisation", f"{mfu:.3f}" if mfu is not None else "unknown GPU: no peak", "info"),
            Row("step", "peak memory of the step", f"{memory / 1e9:.1f} GB (planned {plan['memory_bytes'] / 1e9:.1f} GB)",
                "info")]


def to_commit(args) -> str:
    """The lines to commit from this run (what the docs say is not measured yet)."""
    lines = ["What to commit from this run:"]
    bench_file = ROOT / "reports" / "gpu_check_bench.md"
    if bench_file.is_file():
        lines.append(f"  docs/kernel.md, Speed: the table of {bench_file.relative_to(ROOT)} (with the date, GPU and "
                     "versions of the header above)")
    measured = getattr(args, "measured", None)
    if measured:
        lines.append(f"  docs/scale-out.md, the GPU check: a full step {measured['seconds']:.3f} s, peak memory "
                     f"{measured['memory'] / 1e9:.1f} GB (planned {measured['plan']['seconds']:.3f} s at "
                     f"{measured['plan']['mfu']:.2f}, {measured['plan']['memory_bytes'] / 1e9:.1f} GB), measured "
                     f"MFU {measured['mfu']:.3f}" if measured["mfu"] is not None else "  (unknown GPU: no MFU)")
        if measured["mfu"] is not None and abs(measured["mfu"] / measured["plan"]["mfu"] - 1) > 0.1:
            lines.append(f"  stability/plan/rates.py: DEFAULT_MFU = {measured['mfu']:.2f} (the plan's numbers in "
                         "docs/scale-out.md and docs/merge-gate.md follow: `stability plan --preset gpu-pr` and "
                         "`--preset full --gpus 4`)")
    return "\n".join(lines) if len(lines) > 1 else ""


def dry_run(args) -> str:
    """What the check would run, with its limits, and the plan of one full step."""
    plan = planned_step()
    lines = ["gpu_check --dry-run: nothing is run. It needs " + NEEDS + "; then it runs:"]
    for part in args.parts:
        limit = f"at most {args.limit:.0f} s" if part in ("kernel-tests", "fp8-tests", "bench", "determinism") else \
            f"{WARMUP_STEPS} + {args.steps} steps"
        lines.append(f"  {part:13s} {limit}")
    lines.append(f"planned full step (gated arm, bf16, {plan['gpu'].name} at MFU {plan['mfu']:.2f}): "
                 f"{plan['flops']:.3g} FLOPs, {plan['seconds']:.3f} s, peak memory {plan['memory_bytes'] / 1e9:.1f} GB")
    return "\n".join(lines)


RUNNERS = {"kernel-tests": kernel_tests, "fp8-tests": fp8_tests, "bench": bench, "determinism": determinism,
           "step": step}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print(dry_run(args))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"error: gpu_check needs {NEEDS}; here torch {torch.__version__} sees no CUDA device. Nothing was run "
              "(--dry-run shows what it would run)", file=sys.stderr)
        return 2
    import triton

    os.environ.setdefault("STABILITY_DEVICE", "cuda")
    started = time.perf_counter()
    rows = []
    for part in args.parts:
        print(f"gpu_check: {part} ...", flush=True)
        t0 = time.perf_counter()
        try:
            rows += RUNNERS[part](args)
        except Exception as error:  # noqa: BLE001 (one broken part must not hide the others)
            rows.append(Row(part, "raised", f"{type(error).__name__}: {error}"[:200], "fail"))
        print(f"gpu_check: {part} done in {time.perf_counter() - t0:.0f} s", flush=True)
    props = torch.cuda.get_device_properties(0)
    header = (f"### GPU check, {time.strftime('%Y-%m-%d')}: {props.name} (sm{props.major}{props.minor}, "
              f"{props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, triton {triton.__version__}, "
              f"CUDA {torch.version.cuda}; {time.perf_counter() - started:.0f} s in all")
    report = table(rows, header)
    print("\n" + report)
    commit = to_commit(args)
    if commit:
        print("\n" + commit)
    if args.out:
        Path(args.out).write_text(report + "\n" + (f"\n{commit}\n" if commit else ""))
    return 1 if any(r.verdict in ("fail", "timeout") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
