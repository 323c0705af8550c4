"""The harness's own fp8 Linear (``precision.fp8_recipe = "own"``), for what torchao's does not measure:
DELAYED scaling (torchao's float8 training has dynamic scaling only).

It follows the Transformer Engine recipe with per-tensor scaling: e4m3 (max 448) for the forward
operands of every Linear (input activation and weight), e5m2 (max 57344) for the gradient flowing back
into the Linear's output. The scale of a tensor is ``amax / fmax``, where amax is the tensor's own max
|value| ("current" scaling, the same casts as torchao's "tensorwise") or the max over the last
``fp8_history`` calls ("delayed" scaling; values beyond the range then saturate at ±fmax and are
counted as overflow). Emulated on the CPU and on GPUs below compute capability 8.9: quantize to fp8,
dequantize, matmul in the original dtype. On H100/H200 the forward matmul is a real fp8
``torch._scaled_mm``; the backward stays emulated there too (matmuls in the original dtype on
e5m2-rounded gradients and the saved fp8 operands), which gives the same rounding as real fp8 up to
the accumulation order.

    convert(model, delayed, history, real_mm, tally)   every nn.Linear of ``model`` an Fp8Linear, in place
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from stability.precision.counting import LIMITS, Tally


def has_float8() -> bool:
    """Whether this torch has the float8 dtypes fp8 needs (to run or to emulate)."""
    return hasattr(torch, "float8_e4m3fn") and hasattr(torch, "float8_e5m2")


def has_fp8_tensor_cores(device: torch.device) -> bool:
    """CUDA device of compute capability >= 8.9 (Ada, Hopper and later) and a torch with _scaled_mm."""
    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class _Fp8State:
    """Per-Linear fp8 bookkeeping: amax histories for delayed scaling (one per role "x", "w",
    "grad"), whether to use the real fp8 matmul, and the policy's shared tally."""

    def __init__(self, delayed: bool, history_len: int, real_mm: bool, tally: Tally) -> None:
        self.delayed = delayed
        self.history_len = history_len
        self.real_mm = real_mm
        self.tally = tally
        self._history: dict[str, torch.Tensor] = {}  # role -> fp32 (history_len,) past amaxes
        self._calls: dict[str, int] = {}             # role -> calls so far

    def reference_amax(self, role: str, amax: torch.Tensor) -> torch.Tensor:
        """The amax the scale is built from (fp32 0-dim): ``amax`` itself under current scaling
        and on the first delayed call, else the max of the last ``history_len`` amaxes of this
        role; then records ``amax`` (a non-finite amax is recorded as 0, "no information")."""
        if not self.delayed:
            return amax
        calls = self._calls.get(role, 0)
        if calls == 0:
            self._history[role] = torch.zeros(self.history_len, device=amax.device)
            reference = amax
        else:
            reference = self._history[role].max()
        self._history[role][calls % self.history_len] = torch.nan_to_num(amax, nan=0.0, posinf=0.0)
        self._calls[role] = calls + 1
        return reference


def _quantize(t: torch.Tensor, role: str, fmt: str, state: _Fp8State) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaled cast of ``t`` to fp8 format ``fmt`` ("e4m3" or "e5m2").

    Returns (q, scale): q has t's shape and the fp8 dtype, scale is an fp32 0-dim tensor with
    t ~= q * scale. Values with |t / scale| > fmax are clamped to ±fmax and counted as overflow
    (only possible under delayed scaling); non-zero values that the cast turns into 0 are
    counted as underflow."""
    limits = LIMITS[fmt]
    fmax, flush = limits["max"], limits["min_subnormal"] / 2
    magnitude = t.abs()
    amax = state.reference_amax(role, magnitude.amax().float())
    amax = torch.where(amax > 0, amax, torch.full_like(amax, fmax))  # all zeros: scale 1
    scale = amax / fmax
    scaled = t / scale
    if state.tally.counting:
        overflow = (magnitude > amax).sum()  # same as |scaled| > fmax, without rounding doubts
        underflow = ((scaled != 0) & (scaled.abs() <= flush)).sum()  # round-to-nearest-even gives 0
        state.tally.add(t.numel(), overflow, underflow, (t != 0).sum())
    fp8_dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    q = scaled.clamp(-fmax, fmax).to(fp8_dtype)  # e4m3fn has no inf: saturate before the cast
    return q, scale


def _dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q * scale in ``dtype`` (one rounding: the product is formed in fp32)."""
    return (q.float() * scale).to(dtype)


def _scaled_mm_fits(m: int, k: int, n: int) -> bool:
    """Shapes torch._scaled_mm takes: all dims multiples of 16."""
    return m % 16 == 0 and k % 16 == 0 and n % 16 == 0


class _Fp8LinearFunction(torch.autograd.Function):
    """y = x @ W^T + b with x, W cast to e4m3 and the incoming gradient cast to e5m2.

    Forward: real fp8 ``_scaled_mm`` when ``state.real_mm`` and the shapes fit, else emulated.
    Backward (always emulated): g = q_e5m2(grad_y); grad_x = g @ q(W); grad_W = g^T @ q(x);
    grad_b = sum of g. The quantizers are straight-through: apart from the rounding, gradients
    flow as if the casts were the identity."""

    @staticmethod
    def forward(ctx, x, weight, bias, state):
        qx, sx = _quantize(x, "x", "e4m3", state)
        qw, sw = _quantize(weight, "w", "e4m3", state)
        ctx.save_for_backward(qx, sx, qw, sw)
        ctx.state, ctx.x_dtype, ctx.w_dtype = state, x.dtype, weight.dtype
        ctx.has_bias = bias is not None
        if state.real_mm:
            out = _real_fp8_linear(qx, sx, qw, sw, bias, x.dtype, state)
            if out is not None:
                return out
        return F.linear(_dequantize(qx, sx, x.dtype), _dequantize(qw, sw, x.dtype),
                        None if bias is None else bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad_out):
        qx, sx, qw, sw = ctx.saved_tensors
        qg, sg = _quantize(grad_out, "grad", "e5m2", ctx.state)
        g = _dequantize(qg, sg, grad_out.dtype)
        g2d = g.reshape(-1, g.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (g @ _dequantize(qw, sw, g.dtype)).to(ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            x2d = _dequantize(qx, sx, g.dtype).reshape(-1, qx.shape[-1])
            grad_w = (g2d.t() @ x2d).to(ctx.w_dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2d.sum(0).to(ctx.w_dtype)
        return grad_x, grad_w, grad_b, None


def _real_fp8_linear(qx, sx, qw, sw, bias, out_dtype, state) -> torch.Tensor | None:
    """Forward matmul on fp8 tensor cores, or None when _scaled_mm cannot take it (the caller
    then emulates). mat1 = x as (M, K) row-major, mat2 = W^T as (K, N) column-major (a view of
    the row-major W), scales fp32 scalars, output bf16 or fp32."""
    n, k = qw.shape
    x2d = qx.reshape(-1, k)
    if not _scaled_mm_fits(x2d.shape[0], k, n):
        return None
    mm_dtype = out_dtype if out_dtype in (torch.bfloat16, torch.float32) else torch.float32
    try:
        out = torch._scaled_mm(x2d.contiguous(), qw.t(), scale_a=sx, scale_b=sw, out_dtype=mm_dtype)
    except (RuntimeError, TypeError, ValueError) as error:  # an unsupported case: emulate from now on
        warnings.warn(f"torch._scaled_mm failed ({error}); emulating fp8 for this Linear", stacklevel=2)
        state.real_mm = False
        return None
    if isinstance(out, tuple):  # torch < 2.5 returned (out, amax)
        out = out[0]
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(out_dtype).reshape(*qx.shape[:-1], n)


class Fp8Linear(nn.Linear):
    """An nn.Linear whose matmul runs in fp8 (real or emulated). Made in place by
    ``PrecisionPolicy.prepare`` by swapping the class of an existing nn.Linear: parameters,
    state_dict and hooks are untouched; ``fp8_state`` holds the scaling history (not saved)."""

    fp8_state: _Fp8State

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Fp8LinearFunction.apply(x, self.weight, self.bias, self.fp8_state)


_FP8_SUBCLASSES: dict[type, type] = {}


def _fp8_class(cls: type) -> type:
    """Fp8Linear for nn.Linear; for a subclass of nn.Linear, a subclass of both (made once)."""
    if cls is nn.Linear:
        return Fp8Linear
    if cls not in _FP8_SUBCLASSES:
        _FP8_SUBCLASSES[cls] = type(f"Fp8{cls.__name__}", (Fp8Linear, cls), {})
    return _FP8_SUBCLASSES[cls]


def convert(model: nn.Module, delayed: bool, history: int, real_mm: bool, tally: Tally) -> list[_Fp8State]:
    """Make every nn.Linear of ``model`` an Fp8Linear, in place (parameters and hooks untouched); the
    scaling states of the converted Linears, in ``model.modules()`` order."""
    states = []
    for module in model.modules():
        if isinstance(module, nn.Linear) and not isinstance(module, Fp8Linear):
            module.__class__ = _fp8_class(type(module))
            module.fp8_state = _Fp8State(delayed, history, real_mm, tally)
            states.append(module.fp8_state)
    return states
