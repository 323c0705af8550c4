"""Training precision: the one ``PrecisionPolicy`` the trainer talks to, whatever the format.

The trainer never asks which format is active::

    precision.check(config.precision, device, tokens)   # before any work: the format can train here
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

The formats themselves are classes registered in ``stability.precision.formats.FORMATS`` (fp32, bf16,
fp16, fp8, mxfp8, mxfp4): the policy holds the run's one and does what every format shares, the loss
scaling and the counters. fp16 loss scaling is PyTorch's ``torch.amp.GradScaler`` (init scale, growth
factor, backoff factor and growth interval from PrecisionConfig); the policy reads its scale once per
step for the record and counts a step as skipped when the scale went down (GradScaler backs off only on
a skipped step).

fp8 and MX run through torchao (``stability.precision.ao``): ``precision.fp8_recipe`` names a
torchao.float8 recipe (default "tensorwise"), and "mxfp8" / "mxfp4" use torchao's MX matmul. Emulated on
the CPU and on GPUs without the hardware (fp8: compute capability below 8.9; MX: below 10.0), real
above. ``fp8_recipe = "own"`` keeps the harness's own fp8 emulation (``stability.precision.fp8``), for
DELAYED scaling, which torchao's float8 training does not have.

Overflow / underflow counts are kept in device tensors (``stability.precision.counting``); only
``pop_stats`` syncs with the host.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from stability.config import ConfigError, PrecisionConfig
from stability.precision import ao
from stability.precision.counting import Tally, format_limits
from stability.precision.formats import FORMATS, Format, format_class
from stability.precision.fp8 import Fp8Linear

__all__ = ["FORMATS", "Format", "Fp8Linear", "PrecisionPolicy", "Tally", "check", "check_formats", "format_class",
           "format_limits", "plain_linears"]


def check(config: PrecisionConfig, device: str, tokens_per_batch: int | None = None) -> None:
    """ConfigError naming the value when ``config`` cannot train on ``device`` here: a format no one
    registered, or one that cannot run here (torchao missing: ``ao.TorchaoMissing``, a ConfigError the
    precision ladder turns into a skipped rung). MX formats also need ``tokens_per_batch`` (batch x
    context) to be a multiple of the MX block (32). Run once, before any work."""
    format_class(config.dtype).check(config, device, tokens_per_batch)


def check_formats(names: tuple[str, ...], field: str) -> None:
    """ConfigError naming ``field`` and its value when one of ``names`` is not a registered training format."""
    unknown = [name for name in names if name not in FORMATS]
    if unknown:
        raise ConfigError(f"{field}={tuple(names)!r} is invalid: expected training formats from {tuple(FORMATS)} "
                          f"(unknown: {unknown})")


class PrecisionPolicy:
    """The numeric format of one training run (see the module docstring for the call order).

    config: the run's PrecisionConfig. device: "cpu" or "cuda[:N]", where the model lives.
    real_fp8: fp8 only; None = real fp8 matmuls when the device has fp8 tensor cores,
    False = always emulate, True = insist on real ones (ConfigError when the device has none).
    """

    def __init__(self, config: PrecisionConfig, device: str, real_fp8: bool | None = None) -> None:
        self.config = config
        self.device = torch.device(device)
        self.tally = Tally()
        self.format = format_class(config.dtype)(config, self.device, real_fp8)
        self.scaling = self.format.scales_loss
        self.scaler = torch.amp.GradScaler(self.device.type, init_scale=config.init_loss_scale,
                                           growth_factor=config.growth_factor,
                                           backoff_factor=config.backoff_factor,
                                           growth_interval=config.growth_interval, enabled=self.scaling)
        self._scale = float(config.init_loss_scale) if self.scaling else 1.0
        self._scale_drops = 0     # loss-scale reductions since the last pop_stats
        self._unscaled = False    # whether the current grads were already unscaled
        self._hooks: list = []

    @property
    def high_precision(self) -> list[str]:
        """fp8 / MX: the Linears the recipe left in high precision."""
        return self.format.high_precision

    # -- model and forward ---------------------------------------------------------------

    def prepare(self, model: nn.Module) -> nn.Module:
        """fp8 / MX: make the Linears of ``model`` compute in the low format, in place (torchao's
        Float8Linear or MXLinear, or the own Fp8Linear); others: no-op. Call after moving the model
        to its device. Returns the model (a new module only when ``model`` is itself a Linear that
        torchao's float8 replaces)."""
        return self.format.prepare(model, self.tally)

    def describe(self) -> dict:
        """Which library and recipe train this format, for the record: {"library", "version", "recipe",
        "emulated", "high_precision_linears"}."""
        return self.format.describe()

    # -- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything that carries over from one step to the next: the GradScaler's state, the counters,
        the pending overflow/underflow tally and the own fp8's amax histories (copies; tensors stay on
        device). torchao's float8 (dynamic scaling) and MX keep no state between steps."""
        counts = self.tally._counts
        return {"scale": self._scale, "scale_drops": self._scale_drops,
                "scaler": self.scaler.state_dict() if self.scaling else None,
                "tally_values": self.tally.values, "tally_counts": None if counts is None else counts.clone(),
                "fp8": self.format.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict`` output (the model must have been ``prepare``d the same way)."""
        layers = len(self.format.state_dict())
        if len(state["fp8"]) != layers:
            raise ValueError(f"precision state has {len(state['fp8'])} fp8 layers, this model {layers}")
        self._scale, self._scale_drops = float(state["scale"]), int(state["scale_drops"])
        if self.scaling and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.tally.values = int(state["tally_values"])
        counts = state["tally_counts"]
        self.tally._counts = None if counts is None else counts.to(self.device).clone()
        self.format.load_state_dict(state["fp8"])

    def autocast(self) -> contextlib.AbstractContextManager:
        """torch.autocast for bf16 / fp16; a do-nothing context for fp32, fp8 and MX."""
        return self.format.autocast()

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
        self._hooks = self.format.watch(model, self.tally)

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
