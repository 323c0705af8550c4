"""Training-precision policies: fp32, bf16, fp16 (+ torch.amp.GradScaler), fp8 and the MX formats.

The trainer talks to one ``PrecisionPolicy`` and never asks which format is active::

    policy = PrecisionPolicy(config.precision, device)
    model = policy.prepare(model)                 # fp8 / MX: the Linears compute in the low format
    policy.watch(model)                           # count what the low format cannot hold
    with policy.autocast():                       # bf16 / fp16: torch.autocast
        loss = model(batch)
    policy.backward(loss)                         # fp16: GradScaler.scale(loss).backward()
    policy.unscale_(optimizer)                    # grads back to true units before clipping / grad norm
    ran = policy.step(optimizer, grads_finite)    # fp16: GradScaler skips a step with inf/NaN grads
    stats = policy.pop_stats()                    # overflow / underflow fractions, loss-scale drops
    state = policy.state_dict()                   # loss scale, counters, fp8 amax histories (checkpoints)

fp16 loss scaling is PyTorch's ``torch.amp.GradScaler`` (init scale, growth factor, backoff factor
and growth interval from PrecisionConfig); the policy reads its scale once per step for the record
and counts a step as skipped when the scale went down (GradScaler backs off only on a skipped step).

fp8 and MX run through torchao (``stability.precision.ao``): ``precision.fp8_recipe`` names a torchao.float8
recipe (default "tensorwise"), and "mxfp8" / "mxfp4" use torchao's MX matmul. Emulated on the CPU
and on GPUs without the hardware (fp8: compute capability below 8.9; MX: below 10.0), real above.

``fp8_recipe = "own"`` keeps the harness's own fp8 emulation, for what torchao's does not measure:
DELAYED scaling (torchao's float8 training has dynamic scaling only). It follows the Transformer
Engine recipe with per-tensor scaling: e4m3 (max 448) for the forward operands of every Linear
(input activation and weight), e5m2 (max 57344) for the gradient flowing back into the Linear's
output. The scale of a tensor is ``amax / fmax``, where amax is the tensor's own max |value|
("current" scaling, the same casts as torchao's "tensorwise") or the max over the last
``fp8_history`` calls ("delayed" scaling; values beyond the range then saturate at ±fmax and are
counted as overflow). Emulated on the CPU and on GPUs below compute capability 8.9: quantize to fp8,
dequantize, matmul in the original dtype. On H100/H200 the forward matmul is a real fp8
``torch._scaled_mm``; the backward stays emulated there too (matmuls in the original dtype on
e5m2-rounded gradients and the saved fp8 operands), which gives the same rounding as real fp8 up to
the accumulation order.

Overflow / underflow counts are kept in device tensors; only ``pop_stats`` syncs with the host.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from stability.config import PrecisionConfig, _check
from stability.precision import ao
from stability.record import library_version

# max finite value, smallest normal and smallest subnormal of each low-precision format
_LIMITS = {
    "fp16": {"max": 65504.0, "min_normal": 2.0 ** -14, "min_subnormal": 2.0 ** -24},
    "bf16": {"max": 3.3895313892515355e38, "min_normal": 2.0 ** -126, "min_subnormal": 2.0 ** -133},
    "e4m3": {"max": 448.0, "min_normal": 2.0 ** -6, "min_subnormal": 2.0 ** -9},
    "e5m2": {"max": 57344.0, "min_normal": 2.0 ** -14, "min_subnormal": 2.0 ** -16},
}


def format_limits(dtype: str) -> dict:
    """Range of a low-precision format ("fp16", "bf16", "e4m3", "e5m2"): a dict with
    "max" (largest finite value), "min_normal" and "min_subnormal" (smallest non-zero value).
    With round-to-nearest-even, a value with |v| <= min_subnormal / 2 becomes exactly zero."""
    if dtype not in _LIMITS:
        raise ValueError(f"format {dtype!r} is unknown: expected one of {tuple(_LIMITS)}")
    return dict(_LIMITS[dtype])


def _has_float8() -> bool:
    """Whether this torch has the float8 dtypes fp8 needs (to run or to emulate)."""
    return hasattr(torch, "float8_e4m3fn") and hasattr(torch, "float8_e5m2")


def _has_fp8_tensor_cores(device: torch.device) -> bool:
    """CUDA device of compute capability >= 8.9 (Ada, Hopper and later) and a torch with _scaled_mm."""
    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


# ----------------------------------------------------------------------------- counting

class _Tally:
    """Counts of values cast to a low-precision format. The counts stay on the device
    (no host sync per call); ``pop`` does the one sync and resets. While ``counting`` is False
    the counters skip their work (the trainer counts on every ``probes.cast_every``-th step)."""

    def __init__(self) -> None:
        self.values = 0        # host int: numel is known without a sync
        self._counts = None    # int64 device tensor (3,): overflow, underflow, non-zero
        self.counting = True

    def add(self, numel: int, overflow: torch.Tensor, underflow: torch.Tensor, nonzero: torch.Tensor) -> None:
        counts = torch.stack((overflow, underflow, nonzero))
        if self._counts is None:
            self._counts = counts
        else:
            self._counts += counts
        self.values += numel

    def pop(self) -> dict[str, float]:
        """{"overflow_fraction": overflowed / all values, "underflow_fraction": zeroed / non-zero values}."""
        overflow, underflow, nonzero = (0, 0, 0) if self._counts is None else self._counts.tolist()
        values = self.values
        self.values, self._counts = 0, None
        return {"overflow_fraction": overflow / values if values else 0.0,
                "underflow_fraction": underflow / nonzero if nonzero else 0.0}


# ----------------------------------------------------------------------------- fp8

class _Fp8State:
    """Per-Linear fp8 bookkeeping: amax histories for delayed scaling (one per role "x", "w",
    "grad"), whether to use the real fp8 matmul, and the policy's shared tally."""

    def __init__(self, delayed: bool, history_len: int, real_mm: bool, tally: _Tally) -> None:
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
    limits = _LIMITS[fmt]
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


# ----------------------------------------------------------------------------- the policy

MX_FORMATS = ("mxfp8", "mxfp4")


def check(config: PrecisionConfig, device: str, tokens_per_batch: int | None = None) -> None:
    """ConfigError naming the value when ``config`` cannot train on ``device`` here (torchao missing:
    ``ao.TorchaoMissing``, a ConfigError the precision ladder turns into a skipped rung). MX formats
    also need ``tokens_per_batch`` (batch x context) to be a multiple of the MX block (32)."""
    if config.dtype == "fp8":
        _check(_has_float8(), "precision.dtype", "fp8",
               f"a torch with float8 dtypes: torch {torch.__version__} has none, so device "
               f"{device!r} can neither run nor emulate fp8")
        if config.fp8_recipe != "own":
            ao.check_fp8(config.fp8_recipe)
    if config.dtype in MX_FORMATS:
        ao.check_mx(config.dtype)
        if tokens_per_batch is not None:
            _check(tokens_per_batch % ao.MX_BLOCK == 0, "data.batch_size x model.context", tokens_per_batch,
                   f"a multiple of {ao.MX_BLOCK} for precision.dtype={config.dtype!r} (the weight gradient's "
                   f"MX blocks run over the tokens of a batch)")


def _has_mx_tensor_cores(device: torch.device) -> bool:
    """CUDA device of compute capability >= 10.0 (Blackwell): real MX matmuls."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (10, 0)


class PrecisionPolicy:
    """The numeric format of one training run (see the module docstring for the call order).

    config: the run's PrecisionConfig. device: "cpu" or "cuda[:N]", where the model lives.
    real_fp8: fp8 only; None = real fp8 matmuls when the device has fp8 tensor cores,
    False = always emulate, True = insist on real ones (ConfigError when the device has none).
    """

    def __init__(self, config: PrecisionConfig, device: str, real_fp8: bool | None = None) -> None:
        check(config, device)
        self.config = config
        self.device = torch.device(device)
        self.tally = _Tally()
        if config.dtype == "fp8":
            tensor_cores = _has_fp8_tensor_cores(self.device)
            if real_fp8:
                _check(tensor_cores, "real_fp8", real_fp8,
                       f"a CUDA device with compute capability >= 8.9 "
                       f"(device {device!r}, torch {torch.__version__})")
            self.real_fp8 = tensor_cores if real_fp8 is None else bool(real_fp8)
        else:
            self.real_fp8 = False
        self.scaling = config.dtype == "fp16" and config.loss_scaling
        self.scaler = torch.amp.GradScaler(self.device.type, init_scale=config.init_loss_scale,
                                           growth_factor=config.growth_factor,
                                           backoff_factor=config.backoff_factor,
                                           growth_interval=config.growth_interval, enabled=self.scaling)
        self._scale = float(config.init_loss_scale) if self.scaling else 1.0
        self._scale_drops = 0     # loss-scale reductions since the last pop_stats
        self._unscaled = False    # whether the current grads were already unscaled
        self._hooks: list = []
        self.high_precision: list[str] = []  # fp8 / MX: Linears the recipe left in high precision
        self._fp8_states: list[_Fp8State] = []   # the own fp8's Linears, in model.modules() order (prepare)

    # -- model and forward ---------------------------------------------------------------

    def prepare(self, model: nn.Module) -> nn.Module:
        """fp8 / MX: make the Linears of ``model`` compute in the low format, in place (torchao's
        Float8Linear or MXLinear, or the own Fp8Linear); others: no-op. Call after moving the model
        to its device. Returns the model (a new module only when ``model`` is itself a Linear that
        torchao's float8 replaces)."""
        dtype, recipe = self.config.dtype, self.config.fp8_recipe
        if dtype == "fp8" and recipe != "own":
            model, self.high_precision = ao.convert_fp8(model, recipe, emulate=not self.real_fp8)
        elif dtype in MX_FORMATS:
            self.high_precision = ao.convert_mx(model, dtype, emulate=not _has_mx_tensor_cores(self.device))
        elif dtype == "fp8":
            for module in model.modules():
                if isinstance(module, nn.Linear) and not isinstance(module, Fp8Linear):
                    module.__class__ = _fp8_class(type(module))
                    module.fp8_state = _Fp8State(self.config.fp8_scaling == "delayed", self.config.fp8_history,
                                                 self.real_fp8, self.tally)
                    self._fp8_states.append(module.fp8_state)
        return model

    def describe(self) -> dict:
        """Which library and recipe train this format, for the record: {"library", "version", "recipe",
        "emulated", "high_precision_linears"}."""
        dtype, config = self.config.dtype, self.config
        if dtype in ("bf16", "fp16"):
            recipe = "torch.autocast" + (f" + torch.amp.GradScaler(init {config.init_loss_scale:g}, growth "
                                         f"{config.growth_factor:g} every {config.growth_interval}, backoff "
                                         f"{config.backoff_factor:g})" if self.scaling else "")
            return {"library": "torch", "version": str(torch.__version__), "recipe": recipe, "emulated": False}
        if dtype == "fp8" and config.fp8_recipe == "own":
            return {"library": "stability", "version": library_version("stability"),
                    "recipe": f"own fp8, per-tensor {config.fp8_scaling} scaling"
                              + (f" (history {config.fp8_history})" if config.fp8_scaling == "delayed" else ""),
                    "emulated": not self.real_fp8, "high_precision_linears": []}
        if dtype == "fp8":
            return {"library": "torchao", "version": ao.version(), "recipe": f"float8 {config.fp8_recipe}",
                    "emulated": not self.real_fp8, "high_precision_linears": self.high_precision}
        if dtype in MX_FORMATS:
            weights = "e2m1" if dtype == "mxfp4" else "e4m3"
            real = dtype == "mxfp8" and _has_mx_tensor_cores(self.device)
            return {"library": "torchao", "version": ao.version(),
                    "recipe": f"MX mx_mm, blocks of {ao.MX_BLOCK}, e8m0 scales (rceil), e4m3 inputs and "
                              f"gradients, {weights} weights", "emulated": not real,
                    "high_precision_linears": self.high_precision}
        return {"library": "torch", "version": str(torch.__version__), "recipe": "fp32", "emulated": False}

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything that carries over from one step to the next: the GradScaler's state, the counters,
        the pending overflow/underflow tally and the own fp8's amax histories (copies; tensors stay on
        device). torchao's float8 (dynamic scaling) and MX keep no state between steps."""
        counts = self.tally._counts
        return {"scale": self._scale, "scale_drops": self._scale_drops,
                "scaler": self.scaler.state_dict() if self.scaling else None,
                "tally_values": self.tally.values, "tally_counts": None if counts is None else counts.clone(),
                "fp8": [{"history": {k: v.clone() for k, v in state._history.items()}, "calls": dict(state._calls)}
                        for state in self._fp8_states]}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` output (the model must have been ``prepare``d the same way)."""
        if len(state["fp8"]) != len(self._fp8_states):
            raise ValueError(f"precision state has {len(state['fp8'])} fp8 layers, this model {len(self._fp8_states)}")
        self._scale, self._scale_drops = float(state["scale"]), int(state["scale_drops"])
        if self.scaling and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.tally.values = int(state["tally_values"])
        counts = state["tally_counts"]
        self.tally._counts = None if counts is None else counts.to(self.device).clone()
        for saved, target in zip(state["fp8"], self._fp8_states):
            target._history = {k: v.to(self.device).clone() for k, v in saved["history"].items()}
            target._calls = dict(saved["calls"])

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast for bf16 / fp16; a do-nothing context for fp32, fp8 and MX."""
        if self.config.dtype == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        if self.config.dtype == "fp16":
            return torch.autocast(device_type=self.device.type, dtype=torch.float16)
        return contextlib.nullcontext()

    # -- loss scaling (torch.amp.GradScaler) ------------------------------------------------

    @property
    def loss_scale(self) -> float:
        """The current loss scale; 1.0 when there is no scaling."""
        return self._scale

    def backward(self, loss: torch.Tensor) -> None:
        """``GradScaler.scale(loss).backward()``; a plain backward when there is no scaling."""
        self._unscaled = False
        self.scaler.scale(loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the grads of the optimizer's parameters by the loss scale, in place, once per
        backward (call before clipping / the grad norm). No-op when there is no scaling."""
        if not self.scaling or self._unscaled:
            return
        self.scaler.unscale_(optimizer)
        self._unscaled = True

    def step(self, optimizer: torch.optim.Optimizer, grads_finite: bool) -> bool:
        """Run ``optimizer.step()``; with fp16 loss scaling through ``GradScaler.step`` and
        ``update``: the scaler skips the step and backs the scale off when the (scaled) grads hold
        an inf/NaN (its own check of the same grads the trainer's ``grads_finite`` describes), and
        grows it after ``growth_interval`` clean steps. Returns whether the step ran."""
        if not self.scaling:
            optimizer.step()
            return True
        self.unscale_(optimizer)
        self.scaler.step(optimizer)
        self.scaler.update()
        self._unscaled = False
        before, self._scale = self._scale, self.scaler.get_scale()  # one host sync per step
        skipped = self._scale < before
        self._scale_drops += skipped
        return not skipped

    # -- overflow / underflow accounting ---------------------------------------------------

    def watch(self, model: nn.Module) -> None:
        """Count, on the device, the values the low-precision format cannot hold; ``unwatch``
        removes the hooks. bf16 / fp16: the input values of every nn.Linear with |x| > max
        (overflow) or non-zero |x| <= smallest subnormal / 2 (flushed to zero), and the outputs
        that overflowed to +/-inf. torchao fp8 / MX: the casts of every converted Linear's input,
        weight and output gradient (``ao.watch_casts``). The own fp8 counts in its casts (no hooks);
        fp32 has nothing to count."""
        if self._hooks:
            return
        if self.config.uses_torchao:
            self._hooks = ao.watch_casts(model, self.tally)
            return
        if self.config.dtype not in ("bf16", "fp16"):
            return
        limits = _LIMITS[self.config.dtype]
        fmax, flush, tally = limits["max"], limits["min_subnormal"] / 2, self.tally

        def count_inputs(module, args):
            if not tally.counting or not args or not torch.is_tensor(args[0]) or not args[0].is_floating_point():
                return
            magnitude = args[0].detach().abs()
            nonzero = magnitude > 0
            tally.add(magnitude.numel(), (magnitude > fmax).sum(), (nonzero & (magnitude <= flush)).sum(),
                      nonzero.sum())

        def count_outputs(module, args, output):
            # a matmul whose result exceeds the format's range comes out as +/-inf
            if tally.counting and torch.is_tensor(output) and output.is_floating_point():
                none = torch.zeros((), dtype=torch.int64, device=output.device)
                tally.add(output.numel(), output.detach().isinf().sum(), none, none)

        for module in model.modules():
            if isinstance(module, nn.Linear):
                self._hooks.append(module.register_forward_pre_hook(count_inputs))
                self._hooks.append(module.register_forward_hook(count_outputs))

    def count_step(self, step: int, every: int) -> None:
        """Count (``watch``, the own fp8's casts) during training step ``step`` only when it is a
        multiple of ``every``; the last setting holds for the forwards after training too."""
        self.tally.counting = step % every == 0

    def unwatch(self) -> None:
        """Remove the hooks ``watch`` installed."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def pop_stats(self) -> dict[str, float]:
        """Since the last call: "overflow_fraction" (of all values cast to the low-precision
        format), "underflow_fraction" (of the non-zero ones) and "scale_drops" (loss-scale
        reductions). One host sync; resets the counters. All 0.0 when nothing was counted."""
        stats = self.tally.pop()
        stats["scale_drops"] = float(self._scale_drops)
        self._scale_drops = 0
        return stats


def plain_linears(model: nn.Module) -> nn.Module:
    """Turn every Linear a precision recipe converted (the own Fp8Linear, torchao's Float8Linear,
    MXLinear) back into a plain nn.Linear with the same parameters, in place. Returns ``model``."""
    for module in model.modules():
        if isinstance(module, (Fp8Linear, ao.MXLinear)) or ao.is_float8_linear(module):
            module.__class__ = next(c for c in type(module).__mro__ if issubclass(c, nn.Linear) and not (
                issubclass(c, (Fp8Linear, ao.MXLinear)) or c.__module__.startswith("torchao.")))
            for name in ("fp8_state", "mx_function", "mx_args", "mx_dtype"):
                module.__dict__.pop(name, None)
    return model
