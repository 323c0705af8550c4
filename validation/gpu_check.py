"""The GPU check in one go: on a machine with one CUDA GPU, about 8 minutes, one table at the end.

    python -m validation.gpu_check                    # every part
    python -m validation.gpu_check --parts bench,pair --pair-seconds 60
    python -m validation.gpu_check --out gpu_check.md # also write the table to a file

Installs nothing beyond the project (``pip install -e ".[test]"``). The parts, each reusing what the
project already has:

    kernel-tests  the bf16 kernel correctness tests (suites/test_kernel.py -m gpu -k bfloat16: the
                  flash-attention error rule against float64, forward and backward)
    fp8-tests     real fp8 matmuls (torch._scaled_mm) against their emulation (the gpu-marked fp8 tests
                  of tests/test_precision.py); compute capability >= 8.9 only, "skipped" below
    bench         benchmarks/bench_kernel.py's table: fused gated / fused ungated / SDPA + separate gate,
                  fwd and fwd+bwd, B4 H16 D128 S1k-8k causal bf16 (its own correctness check first)
    determinism   the fused kernel (fwd + bwd) on the same inputs in two fresh processes: bit for bit
                  the same, and the blocks the autotuner chose in each
    pair          a ``full``-preset pair (one seed) with the Triton backend in bf16 for about
                  --pair-seconds: tokens per second and the training share of the wall time

Without a CUDA GPU it says so, prints the table with every GPU part "skipped" and exits 0. Exit 1 when
a part failed. A part that runs past its time limit is "timeout" (a failure).
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
PARTS = ("kernel-tests", "fp8-tests", "bench", "determinism", "pair")
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
    p.add_argument("--pair-seconds", type=float, default=120.0, help="wall time of the full pair (default 120)")
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096, 8192], help="bench S values")
    p.add_argument("--limit", type=float, default=240.0, help="seconds a test or bench part may take (default 240)")
    p.add_argument("--out", default=None, help="also write the table (markdown) to this file")
    args = p.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown or not args.parts:
        p.error(f"--parts {','.join(unknown) or '(empty)'} is invalid: expected some of {', '.join(PARTS)}")
    if not args.pair_seconds > 0 or not args.limit > 0:
        p.error("--pair-seconds and --limit must be positive")
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
    command = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-m", "gpu", *args]
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
    return [run_pytest("kernel-tests", ["suites/test_kernel.py", "-k", "bfloat16 or bf16"], args.limit)]


def fp8_tests(args) -> list[Row]:
    import torch

    if torch.cuda.get_device_capability() < (8, 9):
        return [Row("fp8-tests", "real fp8 matmul", f"compute capability {torch.cuda.get_device_capability()}",
                    "skipped")]
    return [run_pytest("fp8-tests", ["tests/test_precision.py", "-k", "fp8"], args.limit)]


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


def pair(args) -> list[Row]:
    from stability.cases.experiment import run_pair
    from stability.config import resolve

    overrides = {"model.backend": "triton", "precision.dtype": "bf16", "device": "cuda", "seeds": "0"}
    calibration = run_pair(resolve("full", {**overrides, "steps": 10}))   # compiles; seconds per step
    per_step = sum(a["timing"]["wall_seconds"] for a in calibration["arms"]) / (10 * len(calibration["arms"]))
    full_steps = resolve("full").run.steps
    steps = max(20, min(full_steps, int(args.pair_seconds / (2 * per_step))))
    record = run_pair(resolve("full", {**overrides, "steps": steps}))
    rows = []
    for arm in record["arms"]:
        timing = arm["timing"]
        rows.append(Row("pair", f"full pair, {arm['arm']}, triton bf16, {steps} steps",
                        f"{timing['tokens_per_second']:.0f} tokens/s, training {timing['train_seconds']:.1f} s of "
                        f"{timing['wall_seconds']:.1f} s wall ({100 * timing['train_seconds'] / timing['wall_seconds']:.0f}%)"
                        f", status {arm['status']}", "pass" if arm["status"] in ("completed", "diverged") else "fail"))
    return rows


RUNNERS = {"kernel-tests": kernel_tests, "fp8-tests": fp8_tests, "bench": bench, "determinism": determinism,
           "pair": pair}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU available; every part needs one. Nothing was run.")
        rows = [Row(part, "needs a CUDA GPU", "-", "skipped") for part in args.parts]
        header = f"### GPU check: no CUDA GPU (torch {torch.__version__})"
    else:
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
    if args.out:
        Path(args.out).write_text(report + "\n")
    return 1 if any(r.verdict in ("fail", "timeout") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
