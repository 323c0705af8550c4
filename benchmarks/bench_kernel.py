"""Benchmark the fused gated-attention Triton kernel against SDPA + a separate sigmoid gate.

    python benchmarks/bench_kernel.py            # B=4, H=16, D=128, S = 1024 .. 8192, bf16, causal
    python benchmarks/bench_kernel.py --quick    # S = 1024, 2048 only, fewer iterations

Needs a CUDA GPU; without one it prints a message and exits with status 0. Before timing it
runs a bf16 correctness check (fwd + bwd against a float64 reference, flash-attention rule)
and stops with status 1 if that fails.

Timing: CUDA events around each call after warm-up (the first calls also autotune), median
over --iters. "fwd" is an inference forward (no_grad); "fwd+bwd" is a training forward plus
the backward for q, k, v (and the gate). FLOPs: forward 4 * B * H * S^2 * D / 2 (causal
halves the S^2 work), backward 2.5 x forward, so fwd+bwd = 3.5 x forward.

Goals on an H200 (printed as met / missed, never enforced unless --strict):
    fused gated >= 1.15 x faster than SDPA + separate gate, fwd+bwd, at S = 4096
    the gate costs <= 5 % over the fused kernel without gate (fwd+bwd)
"""

import argparse
import math
import statistics
import sys

import torch
import torch.nn.functional as F

GOAL_SPEEDUP, GOAL_GATE_OVERHEAD, GOAL_SEQ = 1.15, 0.05, 4096


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="S in 1024, 2048 and fewer iterations")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="default: same as --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlens", type=int, nargs="+", default=None, help="default 1024 2048 4096 8192")
    p.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    p.add_argument("--warmup", type=int, default=None, help="default 10 (3 with --quick)")
    p.add_argument("--iters", type=int, default=None, help="default 30 (10 with --quick)")
    p.add_argument("--skip-check", action="store_true", help="skip the correctness check")
    p.add_argument("--strict", action="store_true", help="exit 2 if a goal is missed")
    p.add_argument("--out", default=None, help="also write the markdown report to this file")
    args = p.parse_args(argv)
    args.seqlens = args.seqlens or ([1024, 2048] if args.quick else [1024, 2048, 4096, 8192])
    args.warmup = args.warmup if args.warmup is not None else (3 if args.quick else 10)
    args.iters = args.iters if args.iters is not None else (10 if args.quick else 30)
    args.kv_heads = args.kv_heads or args.heads
    args.torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    return args


# ----------------------------------------------------------------------------- the contenders


def sdpa_gate(q, k, v, gate, causal=True):
    """The model's plain PyTorch backend: SDPA, then a separate sigmoid gate."""
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return y * torch.sigmoid(gate) if gate is not None else y


def contenders():
    from stability.kernels import gated_attention

    return {
        "fused gated": lambda q, k, v, g: gated_attention(q, k, v, g),
        "fused ungated": lambda q, k, v, g: gated_attention(q, k, v, None),
        "SDPA + gate": lambda q, k, v, g: sdpa_gate(q, k, v, g),
        "SDPA ungated": lambda q, k, v, g: sdpa_gate(q, k, v, None),
    }


def make_inputs(batch, heads, kv_heads, seq_len, head_dim, dtype, gate_width=None, seed=0):
    """q (B, H, S, D) as the model makes it (a transposed view), k, v, gate logits, dy."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.float32).to(dtype)

    q = randn(batch, seq_len, heads, head_dim).transpose(1, 2)
    k = randn(batch, seq_len, kv_heads, head_dim).transpose(1, 2)
    v = randn(batch, seq_len, kv_heads, head_dim).transpose(1, 2)
    gate = randn(batch, seq_len, heads, gate_width or head_dim).transpose(1, 2)
    dy = randn(batch, heads, seq_len, head_dim)
    return [t.requires_grad_() for t in (q, k, v, gate)], dy


# ----------------------------------------------------------------------------- correctness


def flash_rule(kernel, torch_out, ref, factor, dtype):
    """(ok, kernel error, bound): max|kernel - ref| <= factor * max|torch_out - ref| + u * max|ref| + 1e-3,
    u = eps(dtype) / 2 (the flash-attention test suite's rule; factor 2 for the output, 3 for grads)."""
    err_k = (kernel.double() - ref).abs().max().item()
    err_t = (torch_out.double() - ref).abs().max().item()
    bound = factor * err_t + torch.finfo(dtype).eps / 2 * ref.abs().max().item() + 1e-3
    return err_k <= bound, err_k, bound


def correctness_check(dtype):
    """bf16 fwd + bwd vs a float64 reference: kernel error <= 2x (fwd) / 3x (grads) the SDPA
    path's error + u * max|ref| + 1e-3. Returns a list of failure messages."""
    from stability.kernels import gated_attention, reference_gated_attention

    failures = []
    cases = [(2, 8, 2, 333, 128, 128, True), (2, 4, 4, 1024, 128, 1, True), (1, 4, 2, 257, 64, 64, False),
             (1, 4, 4, 129, 96, 96, True), (1, 2, 1, 200, 256, 256, True)]
    for batch, heads, kv_heads, seq_len, head_dim, gate_width, causal in cases:
        leaves, dy = make_inputs(batch, heads, kv_heads, seq_len, head_dim, dtype, gate_width, seed=seq_len)
        leaves64 = [t.detach().double().requires_grad_() for t in leaves]
        results = []
        for fn, ins, grad_out in ((gated_attention, leaves, dy), (sdpa_gate, leaves, dy),
                                  (reference_gated_attention, leaves64, dy.double())):
            y = fn(*ins, causal=causal)
            results.append([y, *torch.autograd.grad(y, ins, grad_out)])
        for name, kern, torch_path, ref in zip(("y", "dq", "dk", "dv", "dgate"), *results):
            ok, err_k, bound = flash_rule(kern, torch_path, ref, 2 if name == "y" else 3, dtype)
            if not ok:
                failures.append(f"B={batch} H={heads} Hkv={kv_heads} S={seq_len} D={head_dim} gate={gate_width} "
                                f"causal={causal} {name}: kernel error {err_k:.3e} > bound {bound:.3e}")
    return failures


# ----------------------------------------------------------------------------- timing


def time_ms(fn, warmup, iters):
    """Median milliseconds of fn() over iters CUDA-event-timed calls, after warmup calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_one(fn, leaves, dy, warmup, iters):
    """(fwd ms, fwd+bwd ms) of one contender."""

    def fwd():
        with torch.no_grad():
            fn(*leaves)

    def fwd_bwd():
        y = fn(*leaves)
        torch.autograd.grad(y, leaves, dy, allow_unused=True)

    return time_ms(fwd, warmup, iters), time_ms(fwd_bwd, warmup, iters)


def causal_fwd_flops(batch, heads, seq_len, head_dim):
    return 4 * batch * heads * seq_len * seq_len * head_dim / 2


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernel: no CUDA GPU available; this benchmark needs one. Nothing was run.")
        return 0

    impls = contenders()  # imports stability.kernels (and triton)
    import triton

    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    if not args.skip_check:
        failures = correctness_check(args.torch_dtype)
        if failures:
            print("correctness check FAILED:\n  " + "\n  ".join(failures))
            return 1
        print(f"correctness check ({args.dtype}, fwd + bwd vs float64): passed")

    rows, results = [], {}
    for seq_len in args.seqlens:
        leaves, dy = make_inputs(args.batch, args.heads, args.kv_heads, seq_len, args.head_dim, args.torch_dtype)
        flops = causal_fwd_flops(args.batch, args.heads, seq_len, args.head_dim)
        for name, fn in impls.items():
            try:
                fwd_ms, fb_ms = bench_one(fn, leaves, dy, args.warmup, args.iters)
            except torch.cuda.OutOfMemoryError:
                fwd_ms = fb_ms = math.nan
            torch.cuda.empty_cache()
            results[seq_len, name] = (fwd_ms, fb_ms)
            rows.append((seq_len, name, fwd_ms, flops / fwd_ms / 1e9, fb_ms, 3.5 * flops / fb_ms / 1e9))
            print(f"  S={seq_len:5d} {name:14s} fwd {fwd_ms:8.3f} ms  fwd+bwd {fb_ms:8.3f} ms", flush=True)
        del leaves, dy

    title = (f"### Gated attention, B={args.batch} H={args.heads} Hkv={args.kv_heads} D={args.head_dim} "
             f"{args.dtype} causal ({torch.cuda.get_device_name()})")
    lines = [title, "",
             "| S | implementation | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |",
             "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {s} | {n} | {f:.3f} | {ft:.1f} | {b:.3f} | {bt:.1f} |" for s, n, f, ft, b, bt in rows]
    header = ("| S | fused gated vs SDPA + gate, fwd+bwd (speedup) | fused gated vs SDPA + gate, fwd "
              "| gate overhead vs fused ungated, fwd+bwd | gate overhead, fwd |")
    lines += ["", header, "|---:|---:|---:|---:|---:|"]
    missed = []
    for seq_len in args.seqlens:
        g_f, g_b = results[seq_len, "fused gated"]
        u_f, u_b = results[seq_len, "fused ungated"]
        s_f, s_b = results[seq_len, "SDPA + gate"]
        speedup, overhead = s_b / g_b, g_b / u_b - 1
        lines.append(f"| {seq_len} | {speedup:.3f}x | {s_f / g_f:.3f}x | {100 * overhead:+.1f}% "
                     f"| {100 * (g_f / u_f - 1):+.1f}% |")
        if seq_len == GOAL_SEQ and not speedup >= GOAL_SPEEDUP:
            missed.append(f"speedup at S={seq_len} is {speedup:.3f}x < {GOAL_SPEEDUP}x")
        if seq_len == GOAL_SEQ and not overhead <= GOAL_GATE_OVERHEAD:
            missed.append(f"gate overhead at S={seq_len} is {100 * overhead:.1f}% > {100 * GOAL_GATE_OVERHEAD:.0f}%")
    if GOAL_SEQ in args.seqlens:
        lines += ["", f"Goals (S={GOAL_SEQ}, fwd+bwd): " + ("met" if not missed else "MISSED: " + "; ".join(missed))]
    report = "\n".join(lines)
    print("\n" + report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report + "\n")
    return 2 if (missed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
