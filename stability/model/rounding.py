"""Rounding replicates: the same run with its initial parameters moved by one rounding step.

Training is chaotic: a change that only changes rounding (another summation order, an equivalent
formula, another thread count) makes two runs of one seed drift apart, slowly in a short clipped run
and completely in a long unclipped one (Summers & Dinneen, ICML 2021, found that a one-bit change of
one initial weight yields as much run-to-run variance as every source of nondeterminism together).
A *replicate* measures that drift directly: replicate r of a run multiplies every initial parameter
by ``1 + u * 2^-23`` with ``u`` in {-1, 0, 1} drawn per element. 2^-23 is the spacing of fp32 numbers
in [1, 2), so each weight moves by one or two units in its last place: a change of rounding, not of
the mathematics. The merge check (``stability.check.regression``) takes a figure's noise from the
spread of its replicates.

The draw of ``u`` depends only on the run's seed, the replicate number and the parameter's name, so
the arms of a seed (which share every parameter of the same name) get the same perturbation, and a
replicate is the same on every machine.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

ROUNDING_STEP = 2.0 ** -23   # the spacing of fp32 numbers in [1, 2)


def draw_seed(seed: int, replicate: int, name: str) -> int:
    """The generator seed of one parameter's perturbation (63 bits from SHA-256 of seed, replicate, name)."""
    digest = hashlib.sha256(f"{seed}/{replicate}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@torch.no_grad()
def perturb_rounding(model: nn.Module, seed: int, replicate: int) -> nn.Module:
    """Multiply each parameter of ``model`` in place by ``1 + u * 2^-23``, u in {-1, 0, 1} uniform per
    element, drawn for (``seed``, ``replicate``, parameter name). Replicate 0 (the unperturbed run) leaves
    the model untouched. Returns ``model``."""
    if replicate == 0:
        return model
    for name, param in model.named_parameters():
        generator = torch.Generator().manual_seed(draw_seed(seed, replicate, name))
        u = torch.randint(-1, 2, param.shape, generator=generator).to(device=param.device, dtype=param.dtype)
        param.mul_(1 + u * ROUNDING_STEP)
    return model
