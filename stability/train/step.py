"""One training step of an arm, returning the step's row of the series.

    row = train_step(parts, state, hooks, step, stop)

In order: the step's LR and batch, forward and backward (z-loss added to what is differentiated, not
to the logged loss), the global loss and gradient norms in one host sync (``reducer.step_figures``),
a non-finite step localised before the update can spread it, the loss and gradient spikes, a replay
bundle of a flagged step (the state before its update), clipping, a rounding replicate's perturbation of
the gradients, the optimiser step (skipped by the
precision policy on non-finite gradients) and the norms of what it changed. The row holds the values
of ``stability.record.SERIES_KEYS`` and is appended to the record's series. What proves the step was
trained as logged goes to the record's ``applied`` entry (``stability.train.applied``): an optimiser LR
other than the logged one, and the forward's Linear calls against the run's format.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from stability.config import RunConfig
from stability.data import Corpus, get_batch
from stability.model.lm import next_token_loss, z_loss
from stability.model.rounding import StepRounding
from stability.precision import PrecisionPolicy
from stability.record import add_event, append_step, note_linear_calls, note_lr_off_log, note_skipped
from stability.train import applied, probes
from stability.train.checkpoint import step_bundle
from stability.train.state import TrainState


@dataclasses.dataclass(kw_only=True)
class Parts:
    """What an arm trains with, built once before its first step.

    forward: what the step calls (the model, or its DDP wrapper). reducer: ``stability.train.reducer``.
    grad_norms / update_norms: ``probes.GradNorms`` / ``probes.UpdateNorms`` over ``probes.layer_groups``.
    probe_x: the heavy probes' fixed batch (batch, context). held_out: the evaluation batches [(x, y)].
    rounding: a rounding replicate's per-step perturbation of the gradients (``stability.model.rounding``).
    stepped_lr / linears: the LR the optimiser steps with and the Linear calls against the run's format
    (``stability.train.applied``). probe_targets: the modules the heavy probes must hook.
    """

    run: RunConfig
    schedule: Any
    corpus: Corpus
    device: torch.device
    model: torch.nn.Module
    forward: torch.nn.Module
    policy: PrecisionPolicy
    optimizer: torch.optim.Optimizer
    reducer: Any
    groups: dict
    grad_norms: probes.GradNorms
    update_norms: probes.UpdateNorms
    probe_x: torch.Tensor
    held_out: list
    rounding: StepRounding
    stepped_lr: applied.SteppedLR
    linears: applied.LinearFormats
    probe_targets: list[str]


def train_step(parts: Parts, state: TrainState, hooks, step: int, stop) -> dict:
    """Train ``step`` (see the module docstring) and return its row. ``hooks``: the arm's ``ArmHooks``
    (replay bundles); ``stop.requested``: whether Ctrl-C reached this process (under torchrun it travels
    in the step's all-reduce)."""
    run, model, policy, optimizer, monitor = parts.run, parts.model, parts.policy, parts.optimizer, state.monitor
    t0 = time.perf_counter()
    state.step = step
    policy.count_step(step, run.probes.cast_every)
    lr = parts.schedule.lr_at(step, run)
    for group in optimizer.param_groups:
        group["lr"] = lr
    batch_size = parts.schedule.batch_size_at(step, run)
    x, y = get_batch(parts.corpus, "train", step, batch_size, run.model.context, run.seed, run.data.bos, parts.device)
    tokens = x.numel()
    x, y = parts.reducer.local_rows(x), parts.reducer.local_rows(y)
    policy_before = policy.state_dict() if hooks.bundles.enabled else None
    with policy.autocast(), parts.linears.training():
        logits = parts.forward(x)
    loss = next_token_loss(logits, y)  # the logged loss: cross-entropy only, comparable across arms
    policy.backward(loss + run.optim.z_loss * z_loss(logits) if run.optim.z_loss else loss)
    policy.unscale_(optimizer)
    # the one host sync of the step (under torchrun: one all-reduce)
    figures = parts.reducer.step_figures(loss, parts.grad_norms.squares(), stop.requested)
    loss_value, grad_norm, layer_norms = figures[0], figures[1], figures[2:]
    grads_finite = math.isfinite(grad_norm)
    nonfinite = monitor.nonfinite(loss_value, grad_norm)
    if nonfinite:  # localise before the optimizer step can spread the NaN into the weights
        _nonfinite_event(parts, state, step, nonfinite, x)
    loss_spike, grad_spike = monitor.gradients(loss_value, grad_norm)
    if hooks.bundles.enabled and (loss_spike or grad_spike or nonfinite):
        measured = {"loss": loss_value, "grad_norm": grad_norm, "layer_grad_norm": layer_norms, "lr": lr}
        _keep_bundle(parts, hooks, step, policy_before, x, y, measured, loss_spike, grad_spike, nonfinite, monitor)
    if run.optim.grad_clip and grads_finite and grad_norm > run.optim.grad_clip:
        torch._foreach_mul_([probes.local(p.grad) for p in model.parameters() if p.grad is not None],
                            run.optim.grad_clip / (grad_norm + 1e-6))
    parts.rounding.apply(step)   # a rounding replicate: every gradient moved by one rounding step
    parts.update_norms.before()
    stepped = policy.step(optimizer, grads_finite)
    seen = parts.stepped_lr.take()   # the LR of each parameter group as the optimiser stepped
    if applied.lr_off_log(lr, seen, stepped):
        note_lr_off_log(state.record, step, lr, seen)
    optimizer.zero_grad(set_to_none=True)
    updates = parts.reducer.norms(parts.update_norms.squares())
    update_norm, layer_updates = updates[0], updates[1:]
    state.tokens_seen += tokens
    state.train_seconds += time.perf_counter() - t0

    row = {"step": step, "lr": lr, "batch_size": batch_size, "tokens": state.tokens_seen,
           "loss": loss_value, "grad_norm": grad_norm, "layer_grad_norm": layer_norms,
           "update_norm": update_norm, "layer_update_norm": layer_updates,
           "loss_scale": policy.loss_scale, "loss_spike": loss_spike, "grad_spike": grad_spike,
           "update_spike": monitor.update_spike(update_norm), "nonfinite": nonfinite, "skipped": not stepped}
    append_step(state.record, row)
    note_linear_calls(state.record, step, *parts.linears.pop())
    if nonfinite:
        note_skipped(state.record, not stepped)
    return row


def _keep_bundle(parts: Parts, hooks, step: int, policy_state, x, y, measured: dict, loss_spike: bool,
                 grad_spike: bool, nonfinite: str, monitor) -> None:
    """Hand the state before ``step`` (not yet updated) to the bundle budget, if it wants this step."""
    reasons = [r for r, flagged in (("loss spike", loss_spike), ("grad spike", grad_spike),
                                    (f"non-finite {nonfinite}", bool(nonfinite))) if flagged]
    severity = monitor.severity(loss_spike, grad_spike, nonfinite)
    if not hooks.bundles.wants(severity):
        return
    hooks.bundles.save(step_bundle(step, parts.model, parts.optimizer, policy_state, x, y, hooks.identity,
                                   {**measured, "reasons": reasons, "severity": severity}, hooks.replay_optimizer))


def _nonfinite_event(parts: Parts, state: TrainState, step: int, what: str, x: torch.Tensor) -> None:
    """Record a non-finite step: the first module whose output went non-finite (re-running the step's
    forward with hooks), or the parameters whose gradients did. Under torchrun every rank re-runs its rows
    and the event names the first rank where a module went non-finite ("rank") and every rank's finding
    ("rank_modules")."""
    model = parts.model
    grad_params = probes.nonfinite_grad_modules(model)[:20]
    module, layer, found = None, None, {}
    if parts.run.probes.localize_nonfinite:
        def forward():
            with parts.policy.autocast():
                parts.forward(x)
        module, found = parts.reducer.first_nonfinite(probes.first_nonfinite_module(model, forward))
        if module is not None:
            what, layer = "activation" if what == "loss" else what, probes.layer_of(module, model.block_names)
    add_event(state.record, step, what, module, layer, grad_params, found)
