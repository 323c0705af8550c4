"""Rounding replicates: the same run with its rounding changed, at the start and at every step.

Training is chaotic: a change that only changes rounding (another summation order, an equivalent
formula, another thread count) makes two runs of one seed drift apart, slowly in a short clipped run
and completely in a long unclipped one (Summers & Dinneen, ICML 2021, found that a one-bit change of
one initial weight yields as much run-to-run variance as every source of nondeterminism together).
A *replicate* measures that drift directly, the way a harmless rewrite of the arithmetic makes it:

* at the start, every initial parameter is multiplied by ``1 + u * 2^-23`` (``perturb_rounding``);
* at every step, every gradient, just before the optimiser reads it, moves by ``e * 2^-23 * rms``
  (``StepRounding``), ``e`` standard normal per element and ``rms`` the root mean square of the gradient's
  tensor: a rewrite rounds every operation of every step, not the initial weights once.

``u`` is in {-1, 0, 1}, drawn per element. 2^-23 is the spacing of fp32 numbers in [1, 2), so each initial
value moves by one or two units in its last place: a change of rounding, not of the mathematics. A gradient
is a sum of many rounded terms, and a rewrite moves it by a rounding error at the scale of those terms, not
of the element: measured on the smoke model's first step, writing the gate's sigmoid through tanh, or
attention as softmax(QK^T)V in float32, moves each gradient by |dg| / rms of 5-6e-8 at the median, 2e-7 at
the 90th percentile and 5e-7 at the 99th; ``e * 2^-23 * rms`` gives 8e-8, 2e-7 and 3e-7 (an element-wise
one unit in the last place gave 2e-8 at the median: too little). The merge check
(``stability.check.rows``) takes a figure's noise from the spread of its replicates.

The draws depend only on the run's identity (``run_identity``: its whole config, its schedule and its
arm), the replicate number, the parameter's name and the step, so two arms, two cases and two rungs of a
ladder are perturbed independently, the same run of two cases (the sweep's configured LR is the plain
pair's run) alike, and a replicate is the same on every machine and after a resume. Replicate 0 (the
unperturbed run) changes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch
from torch import nn

ROUNDING_STEP = 2.0 ** -23   # the spacing of fp32 numbers in [1, 2)


def run_identity(run, schedule: str, arm: str) -> str:
    """What a replicate's draws are keyed on: the run's whole config (a ``RunConfig``), its schedule's name
    and its arm, as text (the replicate number itself is keyed separately)."""
    fields = dataclasses.asdict(run)
    fields.pop("replicate", None)
    return json.dumps({"run": fields, "schedule": schedule, "arm": arm}, sort_keys=True, default=str)


def draw_seed(identity: str, replicate: int, what: str) -> int:
    """The generator seed of one draw (63 bits from SHA-256 of the run's identity, the replicate and what is
    drawn: a parameter's name, or a step)."""
    digest = hashlib.sha256(f"{identity}/{replicate}/{what}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _factor(shape, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    """``1 + u * 2^-23``, u in {-1, 0, 1} uniform per element, on ``like``'s device and dtype."""
    u = torch.randint(-1, 2, shape, generator=generator)
    return (1 + u.to(torch.float64) * ROUNDING_STEP).to(device=like.device, dtype=like.dtype)


@torch.no_grad()
def perturb_rounding(model: nn.Module, identity: str, replicate: int) -> nn.Module:
    """Multiply each parameter of ``model`` in place by ``1 + u * 2^-23``, u in {-1, 0, 1} uniform per
    element, drawn for (``identity``, ``replicate``, parameter name). Replicate 0 leaves the model
    untouched. Returns ``model``."""
    if replicate == 0:
        return model
    for name, param in model.named_parameters():
        generator = torch.Generator().manual_seed(draw_seed(identity, replicate, name))
        param.mul_(_factor(param.shape, generator, param))
    return model


class StepRounding:
    """The per-step half of a replicate: ``apply(step)`` adds ``e * 2^-23 * rms`` to every gradient of ``model``
    in place (``e`` standard normal, drawn for the run's identity, the replicate and the step, parameter by
    parameter in the model's order; ``rms`` the root mean square of that gradient), just before the optimiser
    reads it. A gradient tensor with a non-finite value is left as it is. Replicate 0: ``apply`` does nothing.
    ``local(grad)``: the part of a gradient this process holds (a shard under FSDP2;
    ``stability.train.probes.local``)."""

    def __init__(self, model: nn.Module, identity: str, replicate: int, local=lambda grad: grad):
        self.params = list(model.parameters())
        self.identity, self.replicate, self.local = identity, replicate, local

    @property
    def enabled(self) -> bool:
        return self.replicate != 0

    @torch.no_grad()
    def apply(self, step: int) -> None:
        if not self.enabled:
            return
        generator = torch.Generator().manual_seed(draw_seed(self.identity, self.replicate, f"step{step}"))
        for param in self.params:
            if param.grad is None:
                continue
            grad = self.local(param.grad)
            e = torch.randn(grad.shape, generator=generator, dtype=torch.float32)
            rms = grad.detach().float().pow(2).mean().sqrt()
            if torch.isfinite(rms):
                grad.add_((e.to(grad.device) * (ROUNDING_STEP * rms)).to(grad.dtype))
