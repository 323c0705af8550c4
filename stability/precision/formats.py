"""Training formats: one class per ``precision.dtype``, all behind one interface, and ``FORMATS``.

A ``PrecisionPolicy`` makes one format per run, ``FORMATS[config.dtype](config, device, real_fp8)``,
and asks it, in this order:

    format.prepare(model, tally)   make the Linears compute in the format, in place (fp8, MX)
    format.watch(model, tally)     hooks that count what the format cannot hold (returns them)
    format.autocast()              around every forward (bf16, fp16: torch.autocast)
    format.scales_loss             whether the loss is scaled (fp16: torch.amp.GradScaler)
    format.describe()              which library and recipe train it, for the record

and, for the record's proof that every Linear ran in it (``stability.train.applied``), ``format.covers(linear)``
(whether the format declares that a Linear computes in it) and ``format.ran_as(linear, output)`` (what one call
ran in). What a call in the format must run in is not the format's to say: ``stability.precision.rules`` states
it by the format's name (an output dtype such as "bfloat16", or a converted class such as "Float8Linear"),
apart from the code here that makes the Linears run in it.

and, before any work, ``Format.check(config, device, tokens_per_batch)`` (a classmethod) says whether
the format can train here (a ConfigError naming the value otherwise). Adding a format is its rule
(``rules.declare_linear_rule``) and one class with ``@register``: ``precision.dtype=<name>`` and
``stress.precisions`` accept it from then on.

    fp32          plain fp32
    bf16, fp16    torch.autocast; fp16 scales the loss with torch.amp.GradScaler
    fp8           torchao's float8 training (``precision.fp8_recipe``), or the harness's own fp8 Linear
                  ("own": per-tensor current or delayed scaling, ``stability.precision.fp8``)
    mxfp8, mxfp4  torchao's MX matmul (``stability.precision.ao``)
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from stability.config import ConfigError, PrecisionConfig, check
from stability.precision.ao import (
    MX_BLOCK,
    MXLinear,
    check_fp8,
    check_mx,
    convert_fp8,
    convert_mx,
    watch_casts,
)
from stability.precision.ao import version as torchao_version
from stability.precision.counting import LIMITS, Tally
from stability.precision.fp8 import Fp8Linear, has_float8, has_fp8_tensor_cores
from stability.precision.fp8 import convert as convert_own_fp8
from stability.precision.rules import declares_linear_rule
from stability.record import library_version

FORMATS: dict[str, type[Format]] = {}  # precision.dtype -> its format, in the order they were registered


def register(cls: type[Format]) -> type[Format]:
    """Class decorator: add a format to ``FORMATS`` under its ``name`` (a name not taken, whose rule for its
    Linear calls is stated in ``stability.precision.rules``: a format without one is refused, never left
    unjudged)."""
    if not cls.name or cls.name in FORMATS:
        raise ValueError(f"training format {cls.name!r}: expected a name not registered yet")
    if not declares_linear_rule(cls.name):
        raise ValueError(f"training format {cls.name!r}: no rule for what its Linear calls run in: state one with "
                         f"stability.precision.rules.declare_linear_rule({cls.name!r}, ...) before registering it "
                         f"(None: its calls counted, none judged)")
    FORMATS[cls.name] = cls
    return cls


def format_class(name: str, field: str = "precision.dtype") -> type[Format]:
    """The format registered as ``name``; ConfigError naming ``field`` and the registered names otherwise."""
    if name not in FORMATS:
        raise ConfigError(f"{field}={name!r} is invalid: expected one of {tuple(FORMATS)} (the training formats "
                          f"of stability.precision.FORMATS)")
    return FORMATS[name]


class Format:
    """A training format (see the module docstring). ``config``: the run's PrecisionConfig; ``device``:
    where the model lives; ``real_fp8``: fp8 only (None: real fp8 matmuls where the device has them)."""

    name = ""
    counts_range = True      # whether the probes report what it cannot hold (overflow / underflow fractions)
    distributed = False      # whether an arm can train in it under torchrun (stability.train.distributed)
    shard_dtype = None       # the dtype FSDP2 gathers parameters in for it (None: as stored, fp32)
    # what a plan of its cost reads (stability.plan): the compute capability (major, minor) from which its matmuls
    # run on tensor cores at the 16-bit rate (None: never, the FP32 rate; below it torchao emulates them in
    # high precision), and the bytes of an activation autograd keeps for the backward
    tensor_cores: tuple[int, int] | None = None
    activation_bytes = 4

    def __init__(self, config: PrecisionConfig, device: torch.device, real_fp8: bool | None = None) -> None:
        self.config = config
        self.device = device
        self.high_precision: list[str] = []  # Linears the format left in high precision (fp8, MX)

    @classmethod
    def check(cls, config: PrecisionConfig, device: str, tokens_per_batch: int | None = None) -> None:
        """ConfigError when the format cannot train on ``device`` here (nothing to check by default)."""

    @property
    def scales_loss(self) -> bool:
        """Whether the loss is scaled (torch.amp.GradScaler) so that small gradients survive the format."""
        return False

    def prepare(self, model: nn.Module, tally: Tally) -> nn.Module:
        """``model`` computing in this format (converted in place; a new module only when ``model`` is itself
        a Linear that torchao replaces)."""
        return model

    def watch(self, model: nn.Module, tally: Tally) -> list:
        """Hooks that add to ``tally`` what the format cannot hold (the caller removes them)."""
        return []

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def covers(self, linear: nn.Linear) -> bool:
        """Whether the format declares that ``linear`` computes in it (the others stay in high precision).
        Stated from the Linear's shape, apart from the code that converts it."""
        return True

    def ran_as(self, linear: nn.Linear, output: torch.Tensor) -> str:
        """What one call of ``linear`` ran in, to compare with the format's rule (``stability.precision.rules``):
        its output's dtype ("float32", "bfloat16" ...). Reads metadata only (no host sync)."""
        return str(output.dtype).removeprefix("torch.")

    def describe(self) -> dict:
        """{"library", "version", "recipe", "emulated"[, "high_precision_linears"]} for the record."""
        return {"library": "torch", "version": str(torch.__version__), "recipe": self.name, "emulated": False}

    def state_dict(self) -> list:
        """What carries over between steps (the own fp8's amax histories); nothing by default."""
        return []

    def load_state_dict(self, state: list) -> None:
        """Restore ``state_dict`` output."""


@register
class Fp32(Format):
    name = "fp32"
    counts_range = False
    distributed = True


class Autocast(Format):
    """bf16 / fp16 through ``torch.autocast``: the matmuls of every nn.Linear in the low format. Counted: the
    input values of every nn.Linear with |x| > max (overflow) or non-zero |x| <= smallest subnormal / 2
    (flushed to zero), and the outputs that overflowed to +/-inf."""

    dtype = torch.float32
    tensor_cores = (8, 0)
    activation_bytes = 2

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def describe(self) -> dict:
        config = self.config
        recipe = "torch.autocast" + (f" + torch.amp.GradScaler(init {config.init_loss_scale:g}, growth "
                                     f"{config.growth_factor:g} every {config.growth_interval}, backoff "
                                     f"{config.backoff_factor:g})" if self.scales_loss else "")
        return {"library": "torch", "version": str(torch.__version__), "recipe": recipe, "emulated": False}

    def watch(self, model: nn.Module, tally: Tally) -> list:
        limits = LIMITS[self.name]
        fmax, flush = limits["max"], limits["min_subnormal"] / 2

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

        hooks = []
        for module in model.modules():
            if isinstance(module, nn.Linear):
                hooks.append(module.register_forward_pre_hook(count_inputs))
                hooks.append(module.register_forward_hook(count_outputs))
        return hooks


@register
class Bf16(Autocast):
    name = "bf16"
    dtype = torch.bfloat16
    distributed = True
    shard_dtype = torch.bfloat16


@register
class Fp16(Autocast):
    """fp16 with PyTorch's ``torch.amp.GradScaler`` unless ``precision.loss_scaling`` is off."""

    name = "fp16"
    dtype = torch.float16

    @property
    def scales_loss(self) -> bool:
        return self.config.loss_scaling


@register
class Fp8(Format):
    """fp8: torchao's float8 training with the recipe ``precision.fp8_recipe`` (dynamic scaling; its
    casts counted by ``ao.watch_casts``), or "own", the harness's own fp8 Linear (``stability.precision.fp8``:
    current or delayed per-tensor scaling, counted in its casts). Real fp8 matmuls on compute capability
    8.9 and above, emulated elsewhere."""

    name = "fp8"
    tensor_cores = (8, 9)

    def __init__(self, config: PrecisionConfig, device: torch.device, real_fp8: bool | None = None) -> None:
        super().__init__(config, device)
        tensor_cores = has_fp8_tensor_cores(device)
        if real_fp8:
            check(tensor_cores, "real_fp8", real_fp8,
                  f"a CUDA device with compute capability >= 8.9 (device {str(device)!r}, torch {torch.__version__})")
        self.real_fp8 = tensor_cores if real_fp8 is None else bool(real_fp8)
        self.own = config.fp8_recipe == "own"
        self.states: list = []  # the own fp8's per-Linear scaling states, in model.modules() order

    @classmethod
    def check(cls, config: PrecisionConfig, device: str, tokens_per_batch: int | None = None) -> None:
        check(has_float8(), "precision.dtype", "fp8",
              f"a torch with float8 dtypes: torch {torch.__version__} has none, so device "
              f"{device!r} can neither run nor emulate fp8")
        if config.fp8_recipe != "own":
            check_fp8(config.fp8_recipe)

    def prepare(self, model: nn.Module, tally: Tally) -> nn.Module:
        config = self.config
        if not self.own:
            model, self.high_precision = convert_fp8(model, config.fp8_recipe, emulate=not self.real_fp8)
            return model
        self.states += convert_own_fp8(model, config.fp8_scaling == "delayed", config.fp8_history, self.real_fp8, tally)
        return model

    def watch(self, model: nn.Module, tally: Tally) -> list:
        return [] if self.own else watch_casts(model, tally)

    def covers(self, linear: nn.Linear) -> bool:
        """The own fp8 converts every Linear; torchao's recipes those whose in and out features are multiples of
        16 (what torch._scaled_mm takes)."""
        return self.own or (linear.in_features % 16 == 0 and linear.out_features % 16 == 0)

    def ran_as(self, linear: nn.Linear, output: torch.Tensor) -> str:
        """The Linear's class ("Fp8Linear" for the own fp8's subclasses of other Linears too)."""
        return "Fp8Linear" if isinstance(linear, Fp8Linear) else type(linear).__name__

    def describe(self) -> dict:
        config = self.config
        if self.own:
            return {"library": "stability", "version": library_version("stability"),
                    "recipe": f"own fp8, per-tensor {config.fp8_scaling} scaling"
                              + (f" (history {config.fp8_history})" if config.fp8_scaling == "delayed" else ""),
                    "emulated": not self.real_fp8, "high_precision_linears": []}
        return {"library": "torchao", "version": torchao_version(), "recipe": f"float8 {config.fp8_recipe}",
                "emulated": not self.real_fp8, "high_precision_linears": self.high_precision}

    def state_dict(self) -> list:
        return [{"history": {k: v.clone() for k, v in state._history.items()}, "calls": dict(state._calls)}
                for state in self.states]

    def load_state_dict(self, state: list) -> None:
        for saved, target in zip(state, self.states):
            target._history = {k: v.to(self.device).clone() for k, v in saved["history"].items()}
            target._calls = dict(saved["calls"])


def has_mx_tensor_cores(device: torch.device) -> bool:
    """CUDA device of compute capability >= 10.0 (Blackwell): real MX matmuls."""
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (10, 0)


class Mx(Format):
    """The MX block formats through torchao's MX matmul: the input, the weight and the output gradient in
    blocks of 32 values along the reduction dimension sharing one power-of-two scale; the batch's tokens
    must fill whole blocks. Real on compute capability 10.0 (mxfp8), emulated elsewhere."""

    weights = "e4m3"

    @classmethod
    def check(cls, config: PrecisionConfig, device: str, tokens_per_batch: int | None = None) -> None:
        check_mx(config.dtype)
        if tokens_per_batch is not None:
            check(tokens_per_batch % MX_BLOCK == 0, "data.batch_size x model.context", tokens_per_batch,
                  f"a multiple of {MX_BLOCK} for precision.dtype={config.dtype!r} (the weight gradient's "
                  f"MX blocks run over the tokens of a batch)")

    def prepare(self, model: nn.Module, tally: Tally) -> nn.Module:
        self.high_precision = convert_mx(model, self.name, emulate=not has_mx_tensor_cores(self.device))
        return model

    def watch(self, model: nn.Module, tally: Tally) -> list:
        return watch_casts(model, tally)

    def covers(self, linear: nn.Linear) -> bool:
        """The Linears whose in and out features are multiples of the MX block (32)."""
        return linear.in_features % 32 == 0 and linear.out_features % 32 == 0

    def ran_as(self, linear: nn.Linear, output: torch.Tensor) -> str:
        """The Linear's class ("MXLinear" for its subclasses too)."""
        return "MXLinear" if isinstance(linear, MXLinear) else type(linear).__name__

    def describe(self) -> dict:
        real = self.name == "mxfp8" and has_mx_tensor_cores(self.device)
        return {"library": "torchao", "version": torchao_version(),
                "recipe": f"MX mx_mm, blocks of {MX_BLOCK}, e8m0 scales (rceil), e4m3 inputs and "
                          f"gradients, {self.weights} weights", "emulated": not real,
                "high_precision_linears": self.high_precision}


@register
class Mxfp8(Mx):
    """mxfp8: e4m3 elements in every operand."""

    name = "mxfp8"
    tensor_cores = (10, 0)


@register
class Mxfp4(Mx):
    """mxfp4: e2m1 (fp4) weights, e4m3 inputs and gradients."""

    name = "mxfp4"
    weights = "e2m1"
