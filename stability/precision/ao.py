"""torchao as the precision policy uses it: the import, float8 training, MX training, cast counts.

    load()                          the torchao module, or TorchaoMissing (a ConfigError) saying why not
    convert_fp8(model, recipe, emulate)    torchao.float8.convert_to_float8_training with the named recipe
    convert_mx(model, dtype, emulate)      every fitting nn.Linear computes its three matmuls in an MX format
    watch_casts(model, tally)       hooks that count what the casts of the converted Linears flush to zero

fp8 (``precision.fp8_recipe`` = "tensorwise", "rowwise" or "rowwise_with_gw_hp") is torchao's float8
training, the recipe torchtitan trains with: ``Float8LinearConfig.from_recipe_name(recipe)``, with
``emulate=True`` where the device has no fp8 tensor cores (the CPU, GPUs below compute capability
8.9): the operands are cast to fp8 and back, the matmul runs in the original dtype. Scaling is
dynamic: the scale of a tensor (tensorwise) or of each row (rowwise) comes from its own amax.

MX (``precision.dtype`` = "mxfp8" or "mxfp4") is torchao's MX matmul (``mx_mm``, the autograd
function under torchao's MXFP8 training): the input, the weight and the output gradient are cast to
blocks of 32 values along the reduction dimension, each block sharing one power-of-two (e8m0) scale,
elements in e4m3; "mxfp4" casts the weights to e2m1 (fp4) instead. Real MX matmuls need compute
capability 10.0 (Blackwell) and mxfp8; everything else is emulated (``KernelPreference.EMULATED``).

Only Linears whose shapes the recipe takes are converted (fp8: both dims multiples of 16, as
``torch._scaled_mm`` needs; MX: multiples of 32, the block size); the others stay in high precision
and ``convert_*`` returns their names for the record.

Counting: a dynamic scale is computed from the tensor it scales, so a finite value can never
exceed the format's range; what the casts lose is the small values that round to zero. The hooks
of ``watch_casts`` recompute each cast of the forward input, the weight and the output gradient
with torchao's own functions and count the non-zero values that come out zero (underflow), and
the non-finite values that reach a cast (overflow: one inf makes a tensorwise scale zero). They
repeat the casts, so they cost about as much again as the casts themselves.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging

import torch
from torch import nn

from stability.config import ConfigError

MX_BLOCK = 32  # values per MX scaling block (the OCP MX spec's block size; torchao's only one)
FP8_MULTIPLE = 16  # torch._scaled_mm needs every matmul dimension to be a multiple of 16


class TorchaoMissing(ConfigError):
    """torchao cannot be imported. A run that asks for a torchao format stops with it (exit 2);
    the precision ladder skips the rung and records the reason."""


@contextlib.contextmanager
def _quiet_import():
    """torchao logs a warning for each CUDA extension it cannot load (every one, on a CPU-only
    machine) and torch one for an enum torchao registers; neither says anything about the run."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def load():
    """The torchao module. TorchaoMissing (a ConfigError) with the import error when it cannot be
    imported; nothing is cached, so a test can block the import with ``sys.modules["torchao"] = None``."""
    try:
        with _quiet_import():
            import torchao
    except ImportError as error:
        raise TorchaoMissing(f"torchao cannot be imported here ({type(error).__name__}: {error}); "
                             f"install it with `pip install torchao`") from None
    return torchao


def version() -> str:
    return str(getattr(load(), "__version__", "unknown"))


# ----------------------------------------------------------------------------- fp8 (torchao.float8)

def fp8_recipes() -> tuple[str, ...]:
    """The float8 training recipes the installed torchao names (Float8LinearRecipeName)."""
    load()
    from torchao.float8.config import Float8LinearRecipeName

    return tuple(recipe.value for recipe in Float8LinearRecipeName)


def check_fp8(recipe: str) -> None:
    """ConfigError naming ``recipe`` when the installed torchao has no such float8 recipe."""
    known = fp8_recipes()
    if recipe not in known:
        raise ConfigError(f"precision.fp8_recipe={recipe!r} is invalid: torchao {version()} knows the float8 "
                          f"recipes {known} (or use 'own' for the harness's emulation)")


def _fits(module: nn.Module, multiple: int) -> bool:
    return (type(module) is nn.Linear and module.in_features % multiple == 0
            and module.out_features % multiple == 0)


def _linear_names(model: nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def convert_fp8(model: nn.Module, recipe: str, emulate: bool) -> tuple[nn.Module, list[str]]:
    """Swap every nn.Linear of ``model`` whose dims are multiples of 16 for torchao's Float8Linear
    (``recipe``, ``emulate``), in place; the parameters are kept. Returns the model (a new module
    only when ``model`` itself is such a Linear) and the names of the Linears left in high precision."""
    check_fp8(recipe)
    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=emulate)
    model = convert_to_float8_training(model, config=config,
                                       module_filter_fn=lambda module, _name: _fits(module, FP8_MULTIPLE))
    return model, [name for name in _linear_names(model) if type(model.get_submodule(name)) is nn.Linear]


def is_float8_linear(module: nn.Module) -> bool:
    return type(module).__name__ == "Float8Linear" and type(module).__module__.startswith("torchao.")


# ----------------------------------------------------------------------------- MX

def _mx_parts():
    """(mx_mm, ScaleCalculationMode, dim0 kernel choices, dim1 kernel choices, KernelPreference) of the
    installed torchao, or ConfigError naming what is missing. mx_mm moved from
    torchao.prototype.mx_formats.mx_linear (torchao 0.17) to torchao.prototype.moe_training.mxfp8_linear
    (0.18)."""
    torchao = load()
    mx_mm = None
    with _quiet_import():
        for where in ("torchao.prototype.moe_training.mxfp8_linear", "torchao.prototype.mx_formats.mx_linear"):
            try:
                mx_mm = getattr(importlib.import_module(where), "mx_mm", None)
            except ImportError:
                continue
            if mx_mm is not None:
                break
        try:
            from torchao.prototype.mx_formats.config import (
                MXFP8Dim0CastKernelChoice,
                MXFP8Dim1CastKernelChoice,
                ScaleCalculationMode,
            )
            from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
        except ImportError:
            mx_mm = None
    if mx_mm is None:
        raise ConfigError(f"precision.dtype names an MX format, which needs torchao's MX matmul (mx_mm, "
                          f"torchao >= 0.17): torchao {getattr(torchao, '__version__', '?')} has none")
    return mx_mm, ScaleCalculationMode, MXFP8Dim0CastKernelChoice, MXFP8Dim1CastKernelChoice, KernelPreference


def _element_dtypes(dtype: str) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(input, weight, output-gradient) element dtypes of an MX format name."""
    fp4 = getattr(torch, "float4_e2m1fn_x2", None)
    if dtype == "mxfp4" and fp4 is None:
        raise ConfigError(f"precision.dtype={dtype!r} is invalid here: torch {torch.__version__} has no "
                          f"float4_e2m1fn_x2 dtype")
    e4m3 = torch.float8_e4m3fn
    return (e4m3, fp4 if dtype == "mxfp4" else e4m3, e4m3)


def check_mx(dtype: str) -> None:
    """ConfigError naming ``dtype`` when this torch / torchao cannot run it (TorchaoMissing without torchao)."""
    _mx_parts()
    _element_dtypes(dtype)


class MXLinear(nn.Linear):
    """An nn.Linear whose forward and backward matmuls run in an MX format through torchao's mx_mm
    (see the module docstring). Made in place by ``convert_mx`` by swapping the class of an
    nn.Linear; ``mx_args`` holds mx_mm's arguments after the input and the weight."""

    mx_function: type
    mx_args: tuple
    mx_dtype: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mx_function.apply(x, self.weight, *self.mx_args)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def convert_mx(model: nn.Module, dtype: str, emulate: bool) -> list[str]:
    """Make every nn.Linear of ``model`` whose dims are multiples of 32 an MXLinear computing in
    ``dtype`` ("mxfp8" or "mxfp4"), in place. Returns the names of the Linears left in high precision.
    The tokens of a batch (batch x context) must be a multiple of 32 too: the weight gradient
    reduces over them (checked by the precision policy)."""
    mx_mm, scale_mode, dim0, dim1, preference = _mx_parts()
    elements = _element_dtypes(dtype)
    real = not emulate and dtype == "mxfp8"
    args = (*elements, MX_BLOCK, preference.AUTO if real else preference.EMULATED,
            dim0.TRITON if real else dim0.TORCH, dim1.CUDA if real else dim1.TORCH, scale_mode.RCEIL)
    if len(inspect.signature(mx_mm.forward).parameters) == len(args) + 4:  # ctx, input, weight, ..., wgrad_with_hp
        args = (*args, False)  # the weight gradient in MX too (torchao's default)
    kept = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if _fits(module, MX_BLOCK):
            module.__class__ = MXLinear
            module.mx_function, module.mx_args, module.mx_dtype = mx_mm, args, dtype
        elif type(module) is nn.Linear:
            kept.append(name)
    return kept


# ----------------------------------------------------------------------------- counting the casts

def _float8_cast(cast_config, pow2: bool):
    """The cast torchao applies to a tensor of one role (a CastConfig): its dynamic scale (per tensor,
    or per row along the last dim), then the saturated cast to the target fp8 dtype."""
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated

    dtype = cast_config.target_dtype
    rowwise = cast_config.scaling_granularity is ScalingGranularity.AXISWISE

    def cast(t: torch.Tensor) -> torch.Tensor:
        scale = tensor_to_scale(t, dtype, scaling_granularity=cast_config.scaling_granularity,
                                axiswise_dim=-1 if rowwise else None, round_scales_to_power_of_2=pow2)
        return to_fp8_saturated(t.float() * scale, dtype)
    return cast


def _mx_cast(elem_dtype, mx_args):
    """The cast torchao's mx_mm applies: blocks of 32 along the last dim, e8m0 scales (RCEIL)."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    scale_mode, preference = mx_args[7], _mx_parts()[4].EMULATED

    def cast(t: torch.Tensor) -> torch.Tensor:
        return MXTensor.to_mx(t.reshape(-1, t.shape[-1]).contiguous(), elem_dtype, MX_BLOCK, scale_mode,
                              preference).dequantize(torch.float32)
    return cast


def _casts_of(module: nn.Module) -> dict | None:
    """{"input", "weight", "grad"} -> the cast of that operand in the forward / input-gradient
    matmul of a converted Linear; None for any other module."""
    if isinstance(module, MXLinear):
        elements = module.mx_args[:3]
        return {role: _mx_cast(dtype, module.mx_args) for role, dtype in zip(("input", "weight", "grad"), elements)}
    if is_float8_linear(module):
        config = module.config
        pow2 = config.round_scales_to_power_of_2
        return {"input": _float8_cast(config.cast_config_input, pow2),
                "weight": _float8_cast(config.cast_config_weight, pow2),
                "grad": _float8_cast(config.cast_config_grad_output, pow2)}
    return None


def _count(tally, t: torch.Tensor, cast) -> None:
    """Add to ``tally`` what ``cast`` does to ``t``: non-finite values (overflow) and finite non-zero
    values that come out zero (underflow), on the device."""
    t = t.detach()
    with torch.no_grad():
        q = cast(t).reshape(t.shape)
    finite = t.isfinite()
    nonzero = (t != 0) & finite
    tally.add(t.numel(), (~finite).sum(), (nonzero & (q == 0)).sum(), nonzero.sum())


def watch_casts(model: nn.Module, tally) -> list:
    """Hooks on every converted Linear of ``model`` (torchao Float8Linear, MXLinear): the forward
    input and the weight are counted before the forward, the output gradient when autograd delivers
    it, while ``tally.counting`` is True. Returns the hook handles (``handle.remove()``)."""
    handles = []
    for module in model.modules():
        casts = _casts_of(module)
        if casts is None:
            continue

        def before(mod, args, casts=casts):
            if tally.counting and args and torch.is_tensor(args[0]) and args[0].is_floating_point():
                _count(tally, args[0], casts["input"])
                _count(tally, mod.weight, casts["weight"])

        def after(_mod, _args, output, casts=casts):
            if tally.counting and torch.is_tensor(output) and output.requires_grad:
                output.register_hook(lambda grad: _count(tally, grad, casts["grad"]))

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    return handles
