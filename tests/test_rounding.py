"""Rounding replicates (stability.model.rounding): one rounding step at the start and at every step, drawn
per run, replicate, parameter and step; replicate 0 changes nothing."""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from stability import config as cfg
from stability.model.rounding import ROUNDING_STEP, StepRounding, perturb_rounding, run_identity
from stability.train import trainer
from stability.train.trainer import train


def tiny_run(**changes) -> cfg.RunConfig:
    run = cfg.preset("smoke").run
    return replace(run, steps=6, model=replace(run.model, n_layers=1, d_model=32, n_heads=2, n_kv_heads=2),
                   **changes)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 4))


def relative_moves(before: nn.Module, after: nn.Module) -> torch.Tensor:
    return torch.cat([((a - b) / b).abs().flatten() for b, a in zip(before.parameters(), after.parameters())])


def test_an_initial_parameter_moves_by_at_most_one_rounding_step_and_replicate_0_not_at_all():
    identity = run_identity(tiny_run(), "standard", "reference")
    untouched = perturb_rounding(model(), identity, 0)
    moved = perturb_rounding(model(), identity, 3)
    assert all(torch.equal(a, b) for a, b in zip(model().parameters(), untouched.parameters()))
    moves = relative_moves(model(), moved)
    assert moves.max().item() <= 2 * ROUNDING_STEP   # one rounding step, and the rounding of the product
    assert (moves > 0).float().mean().item() > 0.5   # two elements in three move (u = -1 or 1)


def test_the_draws_are_independent_per_arm_and_run_and_the_same_for_the_same_run():
    run = tiny_run()
    draws = {name: perturb_rounding(model(), identity, 1) for name, identity in (
        ("reference", run_identity(run, "standard", "reference")),
        ("reference again", run_identity(run, "standard", "reference")),
        ("gated", run_identity(run, "standard", "gated")),
        ("other schedule", run_identity(run, "lr_ramp", "reference")),
        ("other rung", run_identity(replace(run, precision=replace(run.precision, dtype="bf16")), "standard",
                                    "reference")))}
    weight = {name: next(m.parameters()) for name, m in draws.items()}
    assert torch.equal(weight["reference"], weight["reference again"])
    for other in ("gated", "other schedule", "other rung"):
        assert not torch.equal(weight["reference"], weight[other]), other
    # the replicate number is keyed apart from the run: the identity leaves it out
    assert run_identity(replace(run, replicate=4), "standard", "reference") == run_identity(run, "standard",
                                                                                             "reference")


def test_every_step_moves_every_gradient_by_a_rounding_error_at_its_tensor_s_scale():
    """Each step adds e * 2^-23 * rms(gradient) per element (e standard normal, a fresh draw each step); a tensor
    holding a NaN or Inf is left as it is; replicate 0 changes nothing. (In float64 here, so that the move is
    not rounded back to the gradient's grid.)"""
    net = model().double()
    rounding = StepRounding(net, "identity", replicate=2)
    moves = []
    for step in range(2):
        for param in net.parameters():
            param.grad = torch.full_like(param, 1.5)
        net[1].bias.grad[0] = math.nan
        rounding.apply(step)
        moved = torch.cat([p.grad.flatten() for p in list(net.parameters())[:3]])
        assert torch.isnan(net[1].bias.grad[0]) and torch.equal(net[1].bias.grad[1:], torch.full((3,), 1.5))
        moves.append((moved - 1.5) / (1.5 * ROUNDING_STEP))   # in units of 2^-23 x rms (rms 1.5 here)
    for e in moves:
        assert (e != 0).all() and e.abs().max().item() < 6          # a normal draw, in units of the rounding step
        assert 0.5 < e.std().item() < 1.6                             # 84 draws of a standard normal
    assert not torch.equal(moves[0], moves[1])   # a fresh draw each step
    still = StepRounding(model(), "identity", replicate=0)
    for param in still.params:
        param.grad = torch.full_like(param, 1.5)
    still.apply(0)
    assert all(torch.equal(p.grad, torch.full_like(p, 1.5)) for p in still.params)


def test_a_replicate_is_perturbed_at_every_step_it_trains(monkeypatch):
    applied = []
    original = StepRounding.apply

    def spy(self, step):
        applied.append((self.replicate, step))
        original(self, step)
    monkeypatch.setattr(trainer.StepRounding, "apply", spy)
    run = tiny_run(replicate=2)
    record = train(run, arm="reference")
    assert applied == [(2, step) for step in range(run.steps)]
    unperturbed = train(replace(run, replicate=0), arm="reference")
    again = train(run, arm="reference")
    # the same replicate trains the same figures; another rounding differs from the unperturbed run
    assert record["series"]["loss"] == again["series"]["loss"]
    assert record["series"]["loss"][1:] != unperturbed["series"]["loss"][1:]
    assert abs(record["series"]["loss"][-1] - unperturbed["series"]["loss"][-1]) < 1e-3
