"""pytest-benchmark timings of the fused gated-attention kernel vs SDPA + a separate gate.

    pytest suites/test_kernel_bench.py --benchmark-enable --benchmark-columns=median,iqr

GPU only (skipped without CUDA). Speed is reported, never asserted; the full table with
TFLOP/s and the goals is benchmarks/bench_kernel.py. Shape: B=4, H=16, D=128, bf16, causal.
"""

import pytest
import torch
import torch.nn.functional as F

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.bench,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BATCH, HEADS, HEAD_DIM = 4, 16, 128


def _impl(name):
    from stability.kernels import gated_attention

    def sdpa(q, k, v, g):
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y * torch.sigmoid(g) if g is not None else y

    return {
        "fused_gated": lambda q, k, v, g: gated_attention(q, k, v, g),
        "fused_ungated": lambda q, k, v, g: gated_attention(q, k, v, None),
        "sdpa_gate": sdpa,
    }[name]


def _inputs(seq_len):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen).to(torch.bfloat16)

    leaves = [randn(BATCH, seq_len, HEADS, HEAD_DIM).transpose(1, 2).requires_grad_() for _ in range(4)]
    return leaves, randn(BATCH, HEADS, seq_len, HEAD_DIM)


@pytest.mark.parametrize("seq_len", [1024, 4096])
@pytest.mark.parametrize("impl", ["fused_gated", "fused_ungated", "sdpa_gate"])
@pytest.mark.parametrize("mode", ["fwd", "fwd_bwd"])
def test_bench_gated_attention(benchmark, impl, seq_len, mode):
    fn = _impl(impl)
    leaves, dy = _inputs(seq_len)

    def step():
        if mode == "fwd":
            with torch.no_grad():
                fn(*leaves)
        else:
            torch.autograd.grad(fn(*leaves), leaves, dy, allow_unused=True)
        torch.cuda.synchronize()

    for _ in range(3):  # warm-up, including autotuning
        step()
    benchmark.extra_info.update(seq_len=seq_len, impl=impl, mode=mode,
                                flops=4 * BATCH * HEADS * seq_len**2 * HEAD_DIM / 2 * (3.5 if mode == "fwd_bwd" else 1))
    benchmark.pedantic(step, rounds=20, iterations=1, warmup_rounds=2)
