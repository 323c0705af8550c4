"""The processes the GPU check starts for its determinism and step parts (``validation/gpu_check.py``), each run
under the part's time budget and killed when it runs past it.

    python -m validation.gpu_check_workers determinism                  # autotuned: digest and chosen blocks
    python -m validation.gpu_check_workers determinism --pin '{"fwd/fast/sm_90": [128, 64, 8, 3], ...}'
    python -m validation.gpu_check_workers step --steps 30 --warmup 5   # the full preset's gated arm
    python -m validation.gpu_check_workers determinism --dry-run        # on the CPU: a small shape, interpreter
    python -m validation.gpu_check_workers step --dry-run               # on the CPU: the full arm built, no step;
                                                                        # the smoke preset trained 1 + 2 steps

Each prints what it does as it goes and, last, one line ``RESULT {json}`` that the check reads.

determinism: the fused kernel's forward and backward on fixed inputs (B4 H16 S2048 D128 bf16, elementwise gate,
causal), a digest of the output and the four gradients, and the blocks the autotuner chose
(``tuned_configs()``). ``--pin`` restricts each autotuned kernel to one config (``GPU_CONFIGS`` of that kernel,
tier and target set to the one config before the first launch, so the autotuner has nothing to choose): two
processes pinned to the same blocks can differ only in their arithmetic.

step: trains the ``full`` preset's gated arm (Triton kernel, bf16) in one run of --warmup steps (which compile and
autotune) and --steps timed steps, printing each step's status as it ends (loss, grad norm, ok / spikes /
non-finite and whether the optimiser skipped it, seconds) and then the run's end: its status and stop reason
(``record["status"]``, ``record["stop_reason"]``: why a run that did not complete stopped: divergence, Ctrl-C, an
exception, whose traceback follows).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import re
import sys
import time

RESULT = "RESULT "
SHAPE = {"batch": 4, "heads": 16, "seq_len": 2048, "head_dim": 128}          # on the GPU, bf16
DRY_SHAPE = {"batch": 1, "heads": 2, "seq_len": 64, "head_dim": 32}          # on the CPU (interpreter), fp32
_FIELDS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def emit(result: dict) -> None:
    print(RESULT + json.dumps(result), flush=True)


def read_result(output: str) -> dict | None:
    """The ``RESULT`` line of a worker's output (the last one), None without one."""
    lines = [line for line in output.splitlines() if line.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT):]) if lines else None


# ----------------------------------------------------------------------------- pinning the autotuner

def blocks_of(config: str) -> list[int]:
    """[BLOCK_M, BLOCK_N, num_warps, num_stages] of a triton.Config as ``str()`` writes it
    ("BLOCK_M: 128, BLOCK_N: 64, num_warps: 8, num_ctas: 1, num_stages: 3, ...")."""
    values = dict(re.findall(r"(\w+): (\w+)", config))
    missing = [field for field in _FIELDS if field not in values]
    if missing:
        raise ValueError(f"config {config!r} has no {', '.join(missing)}")
    return [int(values[field]) for field in _FIELDS]


def pin_from(tuned: dict[str, dict[str, str]]) -> dict[str, list[int]]:
    """One config per kernel from ``tuned_configs()`` ({"fwd/fast/sm_90": {autotune key: config}}). ValueError
    when a kernel chose different blocks for different keys (one shape should give one key per kernel)."""
    pin = {}
    for kernel, chosen in tuned.items():
        blocks = {tuple(blocks_of(config)) for config in chosen.values()}
        if len(blocks) > 1:
            raise ValueError(f"{kernel} chose {len(blocks)} different configs ({sorted(blocks)}): cannot pin one")
        if blocks:
            pin[kernel] = list(blocks.pop())
    return pin


def apply_pin(module, pin: dict[str, list[int]]) -> None:
    """Restrict each pinned kernel's list (``module.GPU_CONFIGS[target][(name, tier)]``) to its one config; before
    the first launch (an autotuner built already keeps its own list)."""
    built = getattr(module, "_TUNED", {})
    for kernel, blocks in pin.items():
        name, tier, target = kernel.split("/")
        number = int(target.removeprefix("sm_"))
        if number not in module.GPU_CONFIGS or (name, tier) not in module.GPU_CONFIGS[number]:
            raise ValueError(f"pin {kernel!r} names no list of GPU_CONFIGS")
        if (name, tier, number) in built:
            raise ValueError(f"pin {kernel!r} comes too late: its autotuner is built")
        module.GPU_CONFIGS[number][(name, tier)] = [tuple(int(b) for b in blocks)]


def used_configs(module) -> dict[str, list[list[int]]]:
    """The configs each autotuned kernel built in this process may choose from (one each when pinned)."""
    return {f"{name}/{tier}/sm_{target}": [blocks_of(str(config)) for config in getattr(tuned, "configs", [])]
            for (name, tier, target), tuned in getattr(module, "_TUNED", {}).items()}


# ----------------------------------------------------------------------------- determinism

def determinism(pin: dict | None, dry_run: bool) -> dict:
    import torch

    module = importlib.import_module("stability.kernels.gated_attention")
    if pin:
        apply_pin(module, pin)
    shape, dtype, device = (DRY_SHAPE, torch.float32, "cpu") if dry_run else (SHAPE, torch.bfloat16, "cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    batch, heads, seq_len, head_dim = shape["batch"], shape["heads"], shape["seq_len"], shape["head_dim"]

    def randn(*size):
        return torch.randn(*size, device=device, generator=gen, dtype=torch.float32).to(dtype)

    # (B, H, S, D) views of (B, S, H, D) memory, as the model passes them
    leaves = [randn(batch, seq_len, heads, head_dim).transpose(1, 2).requires_grad_() for _ in range(4)]
    dy = randn(batch, heads, seq_len, head_dim)
    started = time.perf_counter()
    y = module.gated_attention(*leaves)
    grads = torch.autograd.grad(y, leaves, dy)
    if device == "cuda":
        torch.cuda.synchronize()
    digest = hashlib.sha256()
    for tensor in (y, *grads):
        digest.update(tensor.detach().contiguous().view(torch.int16 if dtype == torch.bfloat16 else dtype)
                      .cpu().numpy().tobytes())
    shown = f"B{batch} H{heads} S{seq_len} D{head_dim} {str(dtype).removeprefix('torch.')}, elementwise gate, causal"
    return {"digest": digest.hexdigest()[:16], "shape": shown, "configs": module.tuned_configs(),
            "used": used_configs(module), "pinned": pin or {}, "seconds": time.perf_counter() - started}


# ----------------------------------------------------------------------------- step

def step_status(row: dict) -> str:
    """One step's status from its series row: ok, the spikes flagged, a non-finite value and whether the optimiser
    skipped the step."""
    flags = [name.replace("_", " ") for name in ("loss_spike", "grad_spike", "update_spike") if row.get(name)]
    if row.get("nonfinite"):
        flags.append(f"non-finite {row['nonfinite']}")
    if row.get("skipped"):
        flags.append("optimiser step skipped")
    return ", ".join(flags) or "ok"


def _number(value, digits=4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def stop_line(record: dict, planned: int) -> str:
    """A run's end: status, stop reason and steps trained (``record["stop_reason"]`` is None for a completed run)."""
    trained = len(record["series"]["step"])
    reason = record.get("stop_reason") or ("none: every planned step trained" if record["status"] == "completed"
                                           else "none given")
    line = f"stop: status {record['status']}, stop reason: {reason}; {trained} of {planned} steps trained"
    if record.get("diverged_at_step") is not None:
        line += f", diverged at step {record['diverged_at_step']}"
    return line


def build_full_on_cpu() -> None:
    """The dry run's check of the full arm's setup: its model (Triton backend), bf16 precision policy, optimiser,
    corpus and batches built as the step part builds them, on the CPU; no step."""
    import dataclasses

    from stability.config import resolve
    from stability.config.schedules import Standard
    from stability.train.reducer import reducer_for
    from stability.train.trainer import build

    run = dataclasses.replace(resolve("full").arm_config("gated", 0), device="cpu")
    started = time.perf_counter()
    parts = build(run, Standard(), None, reducer_for(run))
    print(f"full arm built on the CPU: {type(parts.model).__name__}, {parts.model.num_parameters() / 1e6:.1f} M "
          f"parameters, backend {run.model.backend}, {run.precision.dtype} ({parts.policy.describe()['recipe']}), "
          f"optimiser {type(parts.optimizer).__name__} ({time.perf_counter() - started:.1f} s)", flush=True)


def step(steps: int, warmup: int, dry_run: bool) -> dict:
    """One run of warmup + steps steps (the warm-up compiles and autotunes the kernels); the timed steps are the
    last ``steps``: their seconds each (between the ends of consecutive steps: the step, its loss read back, nothing
    else) and the peak memory from the end of the warm-up on."""
    import dataclasses
    import statistics

    import torch

    from stability.config import resolve
    from stability.config.schedules import Standard
    from stability.train.trainer import ArmHooks, train

    if dry_run:
        build_full_on_cpu()
    run = resolve("smoke" if dry_run else "full").arm_config("gated", 0)
    run = dataclasses.replace(run, steps=warmup + steps, probes=dataclasses.replace(run.probes, every=10**6))
    cuda = run.device.startswith("cuda")
    print(f"step: preset {'smoke (dry run, CPU)' if dry_run else 'full'}, gated arm, backend {run.model.backend}, "
          f"{run.precision.dtype}, device {run.device}: {warmup} warm-up steps, then {steps} timed", flush=True)
    clock = {"last": None}
    timed: list[float] = []

    def on_start(record):
        clock["last"] = time.perf_counter()

    def on_step(step, row):
        now = time.perf_counter()
        seconds, clock["last"] = now - (clock["last"] or now), now
        phase = "warm-up" if step < warmup else "timed"
        if phase == "timed":
            timed.append(seconds)
        print(f"step {step} ({phase}): loss {_number(row.get('loss'))}, grad norm {_number(row.get('grad_norm'), 3)}, "
              f"{step_status(row)} ({seconds:.3f} s)", flush=True)
        if step == warmup - 1 and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    record = train(run, Standard(), arm="gated", hooks=ArmHooks(on_start=on_start, on_step=on_step))
    print(stop_line(record, run.steps), flush=True)
    if record.get("traceback"):
        print(record["traceback"][-3000:], flush=True)
    return {"status": record["status"], "stop_reason": record.get("stop_reason"),
            "diverged_at_step": record.get("diverged_at_step"), "steps": run.steps, "warmup": warmup,
            "trained": len(record["series"]["step"]), "timed": len(timed),
            "seconds": statistics.mean(timed) if timed else None,
            "seconds_median": statistics.median(timed) if timed else None,
            "memory": torch.cuda.max_memory_allocated() if cuda and timed else None,
            "device": torch.cuda.get_device_name() if cuda else "cpu"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="worker", required=True)
    det = sub.add_parser("determinism")
    det.add_argument("--pin", default=None, help="JSON: {kernel: [BLOCK_M, BLOCK_N, num_warps, num_stages]}")
    det.add_argument("--dry-run", action="store_true")
    stp = sub.add_parser("step")
    stp.add_argument("--steps", type=int, default=30)
    stp.add_argument("--warmup", type=int, default=5)
    stp.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.worker == "determinism":
        emit(determinism(json.loads(args.pin) if args.pin else None, args.dry_run))
    else:
        emit(step(2 if args.dry_run else args.steps, 1 if args.dry_run else args.warmup, args.dry_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
