"""Correctness of the fused gated-attention Triton kernel (stability.kernels).

On a machine without CUDA the kernels run in the Triton interpreter on CPU (the package sets
TRITON_INTERPRET=1 on import), so every shape here is small.

The accuracy rule, as in the flash-attention test suite: with `ref` the float64 reference,
`torch` the plain PyTorch path in the test dtype (SDPA followed by `* sigmoid(gate)`, the
model's `torch` backend) and `kernel` this kernel,

    max|kernel - ref| <= F * max|torch - ref| + floor,   F = 2 (output), 3 (dq, dk, dv, dgate)
    floor = u * max|ref| + ABS_FLOOR[dtype],   u = finfo(dtype).eps / 2

u * max|ref| is one final rounding of the largest value. ABS_FLOOR is 1e-4 for fp16 and 1e-3
for bf16 (about the rounding error of a value ~0.2 in that dtype, like flash-attention's
`x + 0.3 - 0.3` floor) and 1e-6 for fp32 (the rounding left when dP - delta cancels terms of
size ~sqrt(D); it matters where the torch path happens to cancel exactly, e.g. dq at S = 1).

By default the interpreter runs 64 x 64 blocks (fast); `small_blocks()` shrinks them to
16 / 32 with BLOCK_M != BLOCK_N, so tiny shapes go through many blocks, diagonal blocks and
ragged tails.

Every kernel run happens inside `poison_outputs()`, so each buffer the kernels write starts
as NaN and an element that is never written fails the comparison.
"""

import contextlib
import importlib
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from stability.kernels import (
    GatedAttentionFunction,
    gated_attention,
    poison_outputs,
    reference_gated_attention,
)

# numpy overflow warnings from the interpreter are expected: exp of masked scores and of
# padded rows overflows to inf before tl.where discards it, and sigmoid(-30) goes through exp(30).
pytestmark = [pytest.mark.kernel, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]
ga = importlib.import_module("stability.kernels.gated_attention")  # the module (the package attribute is the function)

DEVICE = "cpu" if ga.INTERPRETED else "cuda"
HAS_CUDA = torch.cuda.is_available() and not ga.INTERPRETED
GRAD_NAMES = ("dq", "dk", "dv", "dgate")
ABS_FLOOR = {torch.float32: 1e-6, torch.float16: 1e-4, torch.bfloat16: 1e-3}


@contextlib.contextmanager
def small_blocks():
    """Interpreter blocks of (BLOCK_M, BLOCK_N) = (32, 16) forward / dq and (16, 32) for dk, dv."""
    saved = dict(ga.INTERPRETER_BLOCKS)
    ga.INTERPRETER_BLOCKS.update(fwd=(32, 16), dkdv=(16, 32), dq=(32, 16))
    try:
        yield
    finally:
        ga.INTERPRETER_BLOCKS.update(saved)


# ----------------------------------------------------------------------------- helpers


def make_inputs(batch, n_heads, n_kv_heads, seq_len, head_dim, gate_mode, dtype, seed=0,
                logit_max=None, gate_scale=1.0):
    """Leaf tensors q, k, v, gate (None / 'elem' / 'head'), dy. logit_max: rescale q so the
    largest |scale * q.k| equals it."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, n_heads, seq_len, head_dim, generator=gen)
    k = torch.randn(batch, n_kv_heads, seq_len, head_dim, generator=gen)
    v = torch.randn(batch, n_kv_heads, seq_len, head_dim, generator=gen)
    if logit_max is not None and seq_len > 0:
        kk = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        q = q * (logit_max / ((q @ kk.transpose(-1, -2)).abs().max() / math.sqrt(head_dim)))
    gate = None
    if gate_mode is not None:
        width = head_dim if gate_mode == "elem" else 1
        gate = torch.randn(batch, n_heads, seq_len, width, generator=gen) * gate_scale
    dy = torch.randn(batch, n_heads, seq_len, head_dim, generator=gen)
    leaves = [t.to(DEVICE, dtype).requires_grad_() if t is not None else None for t in (q, k, v, gate)]
    return leaves, dy.to(DEVICE, dtype)


def torch_path(q, k, v, gate=None, causal=True, scale=None):
    """The model's plain PyTorch backend: SDPA, then a separate sigmoid gate."""
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    return y * torch.sigmoid(gate) if gate is not None else y


def run(fn, leaves, dy, causal, scale=None):
    """Output and gradients (None for an absent gate) of fn at the given leaves."""
    y = fn(*leaves, causal=causal, scale=scale)
    present = [t for t in leaves if t is not None]
    grads = iter(torch.autograd.grad(y, present, dy.to(y.dtype)))
    return y, [next(grads) if t is not None else None for t in leaves]


def as64(leaves, dy):
    return ([t.detach().double().requires_grad_() if t is not None else None for t in leaves], dy.double())


def assert_flash_rule(name, kernel, torch_out, ref, factor, dtype):
    ref = ref.detach().cpu()
    kernel, torch_out = kernel.detach().cpu().double(), torch_out.detach().cpu().double()
    assert kernel.shape == ref.shape, f"{name}: shape {tuple(kernel.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(kernel[~torch.isnan(ref)]).any(), f"{name}: NaN where the reference has none"
    err_kernel = (kernel - ref).abs().max().item() if ref.numel() else 0.0
    err_torch = (torch_out - ref).abs().max().item() if ref.numel() else 0.0
    floor = torch.finfo(dtype).eps / 2 * (ref.abs().max().item() if ref.numel() else 0.0) + ABS_FLOOR[dtype]
    assert err_kernel <= factor * err_torch + floor, (
        f"{name}: kernel error {err_kernel:.3e} > {factor} x torch error {err_torch:.3e} + floor {floor:.3e}")


def check_against_reference(batch, n_heads, n_kv_heads, seq_len, head_dim, gate_mode, causal, dtype,
                            seed=0, logit_max=None, gate_scale=1.0, scale=None, small=False):
    leaves, dy = make_inputs(batch, n_heads, n_kv_heads, seq_len, head_dim, gate_mode, dtype, seed,
                             logit_max, gate_scale)
    with poison_outputs(), (small_blocks() if small else contextlib.nullcontext()):
        y_k, g_k = run(gated_attention, leaves, dy, causal, scale)
    y_t, g_t = run(torch_path, leaves, dy, causal, scale)
    y_r, g_r = run(reference_gated_attention, *as64(leaves, dy), causal, scale)
    assert y_k.dtype == dtype and y_k.shape == (batch, n_heads, seq_len, head_dim)
    assert_flash_rule("y", y_k, y_t, y_r, 2, dtype)
    for name, a, b, r in zip(GRAD_NAMES, g_k, g_t, g_r):
        if r is not None:
            assert a.dtype == dtype
            assert_flash_rule(name, a, b, r, 3, dtype)
    return leaves, y_k, g_k


CPU_DTYPES = [torch.float32, torch.float16]


# ----------------------------------------------------------------------------- grids


@pytest.mark.agreement
@pytest.mark.parametrize("gate_mode", ["elem", "head"])
@pytest.mark.parametrize("causal", [True, False])
def test_every_gradient_agrees_with_the_float64_reference_in_each_gate_mode(gate_mode, causal):
    """The CPU workflow job's kernel step (``-m agreement``, seconds): the output and dq, dk, dv, dgate
    of one grouped-query shape per gate mode, through many small blocks, against float64. The stress
    suites on the CPU train on the ``torch`` backend, so without this step a wrong kernel backward
    would reach the merge unseen (the regression zoo's ``kernel_dg_missing_factor``)."""
    check_against_reference(2, 4, 2, 37, 32, gate_mode, causal, torch.float32, seed=11, small=True)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("gate_mode", ["elem", "head", None])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_gate_modes_gqa_causal(dtype, gate_mode, causal, group):
    check_against_reference(2, 2 * group, 2, 37, 32, gate_mode, causal, dtype, seed=group)


@pytest.mark.parametrize(("seq_len", "group", "gate_mode", "causal", "dtype"), [
    (16, 2, "elem", True, torch.float32), (37, 1, "head", True, torch.float16),
    (37, 4, "elem", False, torch.float32), (75, 2, None, True, torch.float16),
    (75, 1, "elem", False, torch.float16), (50, 4, "head", True, torch.float32),
])
def test_many_small_blocks(seq_len, group, gate_mode, causal, dtype):
    check_against_reference(1, group, 1, seq_len, 32, gate_mode, causal, dtype, seed=seq_len, small=True)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize(("seq_len", "head_dim", "causal"), [
    (1, 32, True), (1, 32, False), (7, 32, True), (7, 32, False),
    (113, 32, True), (113, 16, False), (257, 16, True), (257, 16, False),
])
def test_odd_sequence_lengths(dtype, seq_len, head_dim, causal):
    check_against_reference(1, 2, 1, seq_len, head_dim, "elem", causal, dtype, seed=seq_len)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [16, 32, 64, 96, 128, 256])
@pytest.mark.parametrize("gate_mode", ["elem", "head"])
def test_head_dims(dtype, head_dim, gate_mode):
    check_against_reference(1, 2, 1, 5, head_dim, gate_mode, True, dtype, seed=head_dim)


def test_custom_scale():
    check_against_reference(1, 2, 2, 19, 32, "elem", True, torch.float32, scale=0.5)


# ----------------------------------------------------------------------------- extremes


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("gate_mode", ["elem", "head"])
def test_saturated_gate_logits(dtype, gate_mode):
    """Gate logits of exactly +30 or -30 (s = 1 - 9e-14 or 9e-14)."""
    leaves, dy = make_inputs(1, 2, 1, 21, 32, gate_mode, dtype, seed=3)
    gate = leaves[3]
    with torch.no_grad():
        gate.copy_(torch.where(torch.rand(gate.shape, generator=torch.Generator().manual_seed(1)) < 0.5, 30.0,
                               -30.0).to(gate))
    with poison_outputs():
        y_k, g_k = run(gated_attention, leaves, dy, True)
    y_t, g_t = run(torch_path, leaves, dy, True)
    y_r, g_r = run(reference_gated_attention, *as64(leaves, dy), True)
    assert_flash_rule("y", y_k, y_t, y_r, 2, dtype)
    for name, a, b, r in zip(GRAD_NAMES, g_k, g_t, g_r):
        assert_flash_rule(name, a, b, r, 3, dtype)
    if dtype == torch.float32:
        # dgate ~ 9e-14 * dy * O at both ends. The kernel keeps its relative accuracy at +30 too,
        # where the torch path (and even float64 autograd) lose 1 - s to rounding: it computes
        # s (1 - s) as s * sigmoid(-g). Exact value: dy * O * sigmoid(g) * sigmoid(-g) in float64.
        (q64, k64, v64, g64), dy64 = as64(leaves, dy)
        o64 = reference_gated_attention(q64, k64, v64, None, causal=True)
        exact = dy64 * o64 * torch.sigmoid(g64) * torch.sigmoid(-g64)
        exact = exact.sum(-1, keepdim=True) if gate_mode == "head" else exact
        for sign in (1, -1):
            at = gate.detach().cpu() == 30.0 * sign
            err = (g_k[3].detach().cpu().double() - exact.detach())[at].abs().max() / exact[at].abs().max()
            assert err < 1e-5, f"dgate normwise relative error {err:.2e} at gate logits {30 * sign}"


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_huge_attention_logits(dtype, causal):
    """Queries scaled so that the largest |scale * q.k| is 1e3 (softmax fully saturated)."""
    check_against_reference(1, 2, 1, 45, 32, "elem", causal, dtype, seed=5, logit_max=1e3)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_first_row_attends_only_to_itself(dtype):
    """Causal row 0 sees only key 0: y[0] = v[0] * sigmoid(g[0]) and its dq is ~0."""
    leaves, dy = make_inputs(1, 4, 2, 9, 32, "elem", dtype, seed=7)
    _, _, v, gate = leaves
    with poison_outputs():
        y, (dq, dk, dv, dg) = run(gated_attention, leaves, dy, True)
    expected = (v.detach().double().repeat_interleave(2, dim=1) * torch.sigmoid(gate.detach().double()))[:, :, 0]
    tol = 2 * torch.finfo(dtype).eps * expected.abs().max().item()
    assert (y[:, :, 0].double() - expected).abs().max().item() <= tol
    assert dq[:, :, 0].abs().max().item() <= 1e-2 * torch.finfo(dtype).eps ** 0.5
    for t in (y, dq, dk, dv, dg):
        assert torch.isfinite(t).all()


# ----------------------------------------------------------------------------- layout, API


def test_non_contiguous_inputs_match_contiguous():
    """The model passes x.view(B, S, H, D).transpose(1, 2); strided reads give identical results."""
    batch, n_heads, n_kv, seq_len, head_dim = 2, 4, 2, 23, 32
    gen = torch.Generator().manual_seed(11)
    qkv = torch.randn(batch, seq_len, (n_heads + 2 * n_kv) * head_dim, generator=gen).to(DEVICE)
    gate_src = torch.randn(batch, seq_len, n_heads * head_dim, generator=gen).to(DEVICE)
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    views = [t.reshape(batch, seq_len, -1, head_dim).transpose(1, 2) for t in (q, k, v, gate_src)]
    assert not any(t.is_contiguous() for t in views)
    dense = [t.contiguous() for t in views]
    dy = torch.randn(batch, n_heads, seq_len, head_dim, generator=gen).to(DEVICE)
    dy_strided = dy.transpose(1, 2).contiguous().transpose(1, 2)
    with poison_outputs():
        y1, g1 = run(gated_attention, [t.clone().requires_grad_() for t in views], dy_strided, True)
        y2, g2 = run(gated_attention, [t.clone().requires_grad_() for t in dense], dy, True)
    torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # Y lives in (B, S, H, D) memory, so the model's merge of the heads is a free view.
    assert y1.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("width", [32, 1])
def test_expanded_gate_with_zero_head_stride(width):
    """The model shares one gate over heads by `gate.expand(-1, H, -1, -1)` (head stride 0)."""
    leaves, dy = make_inputs(1, 4, 2, 13, 32, None, torch.float32, seed=8)
    shared = torch.randn(1, 1, 13, width, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    grads = []
    for fn in (gated_attention, reference_gated_attention):
        gate = shared.clone().requires_grad_()
        with poison_outputs():
            y = fn(*leaves[:3], gate.expand(-1, 4, -1, -1))
            grads.append(torch.autograd.grad(y, [gate], dy)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_no_grad_forward_matches_training_forward():
    leaves, _ = make_inputs(1, 2, 1, 19, 32, "elem", torch.float32, seed=2)
    with poison_outputs():
        with torch.no_grad():
            y_inference = gated_attention(*leaves)
        y_training = gated_attention(*leaves)
    torch.testing.assert_close(y_inference, y_training, rtol=0, atol=0)
    assert y_training.requires_grad and not y_inference.requires_grad


def test_autograd_function_apply_and_gate_only_grad():
    leaves, dy = make_inputs(1, 2, 2, 11, 32, "head", torch.float32, seed=4)
    q, k, v, gate = [t.detach() for t in leaves]
    gate.requires_grad_()
    with poison_outputs():
        y = GatedAttentionFunction.apply(q, k, v, gate, True, None)
        (dg,) = torch.autograd.grad(y, [gate], dy)
    y_r = reference_gated_attention(q.double(), k.double(), v.double(), gate.detach().double().requires_grad_())
    torch.testing.assert_close(y.double(), y_r, rtol=1e-5, atol=1e-6)
    assert dg.shape == gate.shape and torch.isfinite(dg).all()


def test_reference_matches_sdpa_in_float64():
    leaves, _ = make_inputs(2, 4, 2, 17, 32, "elem", torch.float64, seed=6)
    for causal in (True, False):
        torch.testing.assert_close(reference_gated_attention(*leaves, causal=causal),
                                   torch_path(*leaves, causal=causal))


def test_empty_sequence():
    leaves, dy = make_inputs(1, 2, 1, 0, 32, "elem", torch.float32)
    y, grads = run(gated_attention, leaves, dy, True)
    assert y.shape == (1, 2, 0, 32)
    assert [g.shape for g in grads] == [t.shape for t in leaves]


def test_poison_outputs_fills_buffers():
    with poison_outputs():
        assert torch.isnan(ga._new((3, 4), torch.float32, DEVICE)).all()
    assert ga._poison_value is None


# ----------------------------------------------------------------------------- property-based


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 2),
    n_kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 2, 4]),
    seq_len=st.integers(1, 70),
    head_dim=st.sampled_from([16, 32, 64]),
    small=st.booleans(),
    gate_mode=st.sampled_from(["elem", "head", None]),
    causal=st.booleans(),
    dtype=st.sampled_from(CPU_DTYPES),
    logit_max=st.sampled_from([None, 0.1, 30.0, 300.0]),
    gate_scale=st.sampled_from([0.0, 1.0, 10.0, 30.0]),
    seed=st.integers(0, 2**16),
)
def test_property_random_shapes_and_values(batch, n_kv_heads, group, seq_len, head_dim, gate_mode, causal,
                                           small, dtype, logit_max, gate_scale, seed):
    check_against_reference(batch, n_kv_heads * group, n_kv_heads, seq_len, head_dim, gate_mode, causal,
                            dtype, seed, logit_max, gate_scale, small=small)


# ----------------------------------------------------------------------------- bad input


def _good(seq_len=8, head_dim=32, dtype=torch.float32):
    q = torch.randn(1, 4, seq_len, head_dim, dtype=dtype, device=DEVICE)
    kv = torch.randn(1, 2, seq_len, head_dim, dtype=dtype, device=DEVICE)
    return q, kv, kv.clone(), torch.randn(1, 4, seq_len, head_dim, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(("mutate", "error", "pattern"), [
    (lambda q, k, v, g: (*(t.repeat(1, 1, 1, 2)[..., :48] for t in (q, k, v, g)),), ValueError, r"head_dim 48"),
    (lambda q, k, v, g: (q[:, :3], k, v, g[:, :3]), ValueError, r"kv heads 2 .* query heads 3"),
    (lambda q, k, v, g: (q, k[:, :, :5], v[:, :, :5], g), ValueError, r"\(1, 2, 5, 32\)"),
    (lambda q, k, v, g: (q, k, v[:, :1], g), ValueError, r"v \(1, 1, 8, 32\)"),
    (lambda q, k, v, g: (q, k.half(), v, g), TypeError, r"k has dtype torch.float16"),
    (lambda q, k, v, g: (q, k, v, g.half()), TypeError, r"gate has dtype torch.float16"),
    (lambda q, k, v, g: (q.double(), k.double(), v.double(), g.double()), TypeError, r"torch.float64"),
    (lambda q, k, v, g: (q, k, v, g[..., :2]), ValueError, r"gate has shape \(1, 4, 8, 2\)"),
    (lambda q, k, v, g: (q, k, v, g[:, :2]), ValueError, r"gate has shape \(1, 2, 8, 32\)"),
    (lambda q, k, v, g: (q[0], k, v, g), ValueError, r"q must be 4-D .* \(4, 8, 32\)"),
    (lambda q, k, v, g: (q, k.numpy(force=True), v, g), TypeError, r"k must be a torch.Tensor, got ndarray"),
    (lambda q, k, v, g: (q, k, v, "gate"), TypeError, r"gate must be None or a torch.Tensor, got str"),
    (lambda q, k, v, g: (q, k.to("meta"), v, g), ValueError, r"k is on device meta"),
])
def test_bad_input_messages(mutate, error, pattern):
    with pytest.raises(error, match=pattern):
        gated_attention(*mutate(*_good()))


def test_bad_causal_and_scale_messages():
    q, k, v, g = _good()
    with pytest.raises(TypeError, match=r"causal must be a bool, got 'yes'"):
        gated_attention(q, k, v, g, causal="yes")
    with pytest.raises(ValueError, match=r"scale must be a finite float or None, got nan"):
        gated_attention(q, k, v, g, scale=float("nan"))


def test_cpu_tensors_without_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(ga, "INTERPRETED", False)
    q, k, v, g = (t.cpu() for t in _good())
    with pytest.raises(ValueError, match=r"q is on device cpu.*TRITON_INTERPRET=1"):
        gated_attention(q, k, v, g)


def test_half_enabled_interpreter_is_refused(monkeypatch):
    monkeypatch.setattr(ga, "_INTERPRETER_MISMATCH", True)
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET=1 was set after triton had been imported"):
        gated_attention(*_good())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only import behaviour")
def test_triton_imported_first_leaves_interpreter_off():
    """Without CUDA, importing triton before stability.kernels (and no TRITON_INTERPRET) means
    compiled kernels: CPU tensors are then refused with a clear message, not a triton crash."""
    code = ("import triton, torch\n"
            "from stability.kernels import gated_attention\n"
            "q = torch.randn(1, 1, 4, 32)\n"
            "try:\n    gated_attention(q, q, q)\n"
            "except ValueError as e:\n    print('REFUSED', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    assert "REFUSED q is on device cpu" in out.stdout, out.stdout + out.stderr


# ----------------------------------------------------------------------------- GPU only


needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (compiled Triton kernels)")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("seq_len", "head_dim", "group", "gate_mode", "causal"), [
    (1, 64, 1, "elem", True), (257, 64, 2, "head", True), (1000, 128, 4, "elem", True),
    (777, 128, 1, None, False), (333, 96, 2, "elem", False), (1024, 256, 2, "elem", True),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_gpu_shapes(seq_len, head_dim, group, gate_mode, causal, dtype):
    check_against_reference(2, 2 * group, 2, seq_len, head_dim, gate_mode, causal, dtype, seed=seq_len)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("gate_mode", ["elem", "head"])
def test_gpu_bf16_extremes(gate_mode):
    check_against_reference(1, 4, 2, 300, 128, gate_mode, True, torch.bfloat16, seed=9, logit_max=1e3,
                            gate_scale=30.0)
