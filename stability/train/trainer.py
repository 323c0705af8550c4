"""Trains one arm (one model, one seed) with the probes attached and returns its run record.

The record is a plain JSON-ready dict: the per-step ``series`` (loss, lr, grad norm, update
norm, spike and non-finite flags, loss scale, batch size), the non-finite ``events`` with the
first offending module, the heavy ``probes`` snapshots, the ``final`` figures (held-out
loss, perplexity, next-token accuracy, spike scores, M-Act, F-Attn, ...) and ``timing``.

An arm that diverges (non-finite loss, or loss above ``diverge_factor`` times its first
loss for ``diverge_patience`` consecutive steps) stops early with status "diverged":
that is a result, not an error. Ctrl-C stops the arm with status "killed" and the record
so far is returned; the caller decides whether to stop everything. The first Ctrl-C lets the
step in flight finish (so the state is consistent and can be checkpointed); a second one
interrupts at once.

A caller attaches per-step callbacks, checkpoints and replay bundles through ``ArmHooks``; the
trainer imports no tracking and writes no file of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

import torch

from stability import precision
from stability.config import ConfigError, RunConfig
from stability.data import Corpus, eval_batches, get_batch, load_corpus, probe_batch
from stability.model.build import build_model
from stability.model.lm import next_token_loss, z_loss
from stability.model.rounding import perturb_rounding
from stability.precision import PrecisionPolicy
from stability.record import final_figures, new_arm_record
from stability.train import distributed, probes
from stability.train.checkpoint import arm_state, restore, step_bundle
from stability.train.schedules import Standard

StepCallback = Callable[[int, dict], None]


@dataclasses.dataclass
class ArmHooks:
    """What a caller attaches to one arm's training; every field is optional.

    on_start(record): before the first step trained in this call (a resumed record holds the steps so far).
    on_step(step, row): after every step, with that step's series values (the keys of ``SERIES_KEYS``).
    on_end(record): once, when the arm has stopped (any status), with its final figures.
    checkpoints: a ``stability.train.checkpoint.Checkpoints``: when and where to checkpoint, and the state to
        resume from. bundles: a ``stability.train.checkpoint.Bundles``: the budget of replay bundles.
    identity: which run this is (run key, fingerprint...), stored in checkpoints and bundles.
    replay_optimizer: put the optimiser state into replay bundles too.
    """

    on_start: Callable[[dict], None] | None = None
    on_step: StepCallback | None = None
    on_end: Callable[[dict], None] | None = None
    checkpoints: Any = None
    bundles: Any = None
    identity: dict = dataclasses.field(default_factory=dict)
    replay_optimizer: bool = False


@contextlib.contextmanager
def stop_after_step():
    """While it is active, the first Ctrl-C (SIGINT) only sets ``.requested``: the loop stops after the step
    in flight. A second Ctrl-C raises KeyboardInterrupt at once. Outside the main thread: no change."""
    flag = types.SimpleNamespace(requested=False)
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(_signum, _frame):
        if flag.requested:
            raise KeyboardInterrupt
        flag.requested = True

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def make_optimizer(model: torch.nn.Module, run: RunConfig) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on norm gains)."""
    optim = run.optim
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if optim.optimizer == "adamw8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps)


def install_fault(model: torch.nn.Module, run: RunConfig, current_step: list[int], rank: int = 0):
    """A forward hook that turns block ``fault.layer``'s output NaN/Inf at ``fault.step`` (in process
    ``fault.rank`` only, when it is not -1)."""
    fault = run.fault
    if fault.kind not in ("nan", "inf") or fault.rank not in (-1, rank):
        return None
    poison = float("nan") if fault.kind == "nan" else float("inf")

    def hook(_module, _inputs, output):
        if current_step[0] == fault.step:
            if isinstance(output, tuple):
                return (output[0] * poison, *output[1:])
            return output * poison
        return output

    return model.blocks[fault.layer].register_forward_hook(hook)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, policy: PrecisionPolicy) -> dict[str, float]:
    """Held-out mean loss (nats/token), perplexity and next-token accuracy over fixed batches."""
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for x, y in batches:
        with policy.autocast():
            logits = model(x)
        total_loss += next_token_loss(logits, y).item() * y.numel()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train(was_training)
    loss = total_loss / count
    return {"heldout_loss": loss, "perplexity": math.exp(min(loss, 700.0)), "accuracy": correct / count}


def train(run: RunConfig, schedule=None, corpus: Corpus | None = None, arm: str = "",
          on_step: StepCallback | None = None, on_trained: Callable | None = None,
          hooks: ArmHooks | None = None) -> dict:
    """Train one arm and return its run record (see module docstring).

    ``on_step(step, row)`` runs after every step with the step's series values (loss, lr, grad_norm, ...).
    ``on_trained(model, corpus, record)``, when given, runs after the final evaluation of an arm that
    completed or diverged (the experiment uses it for quantization evaluation). ``hooks``: callbacks,
    checkpoints and replay bundles (``ArmHooks``); with a checkpoint to resume from, training continues
    after its step with the record, model, optimiser, loss scaler and RNG states it holds.

    Under a process group (torchrun; ``stability.train.distributed``) the arm trains sharded with FSDP2 (or
    DDP), every figure global; checkpoints and replay bundles are single-process only and left out."""
    schedule = schedule or Standard()
    hooks = hooks or ArmHooks()
    device = torch.device(run.device)
    precision.check(run.precision, run.device, run.data.batch_size * run.model.context)  # ConfigError: nothing ran
    world = distributed.current()
    if world is not None:
        distributed.check(run, world)
        if hooks.checkpoints is not None and hooks.checkpoints.resume_state is not None:
            raise ConfigError("resuming an arm is single-process only: expected a run started without torchrun")
        hooks = dataclasses.replace(hooks, checkpoints=None, bundles=None)
    corpus = corpus or load_corpus(run.data, run.model.vocab_size, run.model.context)
    torch.manual_seed(run.seed)
    model = perturb_rounding(build_model(run.model, run.seed), run.seed, run.replicate).to(device)
    policy = PrecisionPolicy(run.precision, run.device)
    model = policy.prepare(model)
    policy.watch(model)  # counts overflow/underflow on the device (the own fp8 counts in its casts)
    forward = model      # what the training step calls: the model, or its DDP wrapper
    if world is not None:  # every rank built the same values from the same seed: now shard them
        forward = distributed.wrap(model, run, world)
    sharded = world is not None and run.distributed.strategy == "fsdp"
    optimizer = make_optimizer(model, run)
    groups = probes.layer_groups(model)
    grad_norms = probes.GradNorms(groups)
    update_norms = probes.UpdateNorms(groups)
    params = [p for p in model.parameters()]
    cfg_p = run.probes
    detectors = {name: probes.SpikeDetector(cfg_p.spike_window, cfg_p.spike_k, cfg_p.spike_min_history)
                 for name in ("loss", "grad", "update")}
    probe_x, _ = probe_batch(corpus, cfg_p.probe_batch_size, run.model.context, run.data.bos, device)
    held_out = eval_batches(corpus, cfg_p.eval_batches, run.data.batch_size, run.model.context, run.data.bos,
                            device)
    current_step = [-1]
    fault_handle = install_fault(model, run, current_step, world.rank if world is not None else 0)

    record = new_arm_record(arm, run.variant, run.seed, schedule.name)
    record.update(num_parameters=model.num_parameters(), gate_parameters=model.num_gate_parameters(),
                  layer_names=list(groups), model=model.describe(),
                  precision={"dtype": run.precision.dtype, **policy.describe()})
    if world is not None:
        record["distributed"] = world.describe(run)
    series = record["series"]
    # everything that carries over from one step to the next besides model, optimiser and policy
    loop = {"record": record, "initial_loss": None, "above_initial": 0, "tokens_seen": 0, "train_seconds": 0.0,
            "probe_seconds": 0.0, "started_at": time.time(), "detectors": {}}
    first_step = 0
    resume = hooks.checkpoints.resume_state if hooks.checkpoints is not None else None
    if resume is not None:
        loop = restore(resume, model, optimizer, policy)
        record, first_step = loop["record"], resume["step"] + 1
        record.update(status="running", stop_reason=None)
        series = record["series"]
        for name, history in loop["detectors"].items():
            detectors[name].history.extend(history)
    started = time.perf_counter()
    wall_before = record.get("timing", {}).get("wall_seconds", 0.0)  # of the run this one resumes
    record["timing"] = {"started_at": loop["started_at"], "wall_seconds": wall_before}

    def take_probes(step: int) -> None:
        t0 = time.perf_counter()
        snapshot = probes.heavy_probes(model, probe_x)
        snapshot["step"] = step
        record["probes"].append(snapshot)
        if run.precision.dtype != "fp32":
            if world is not None:
                distributed.reduce_counts(policy.tally)
            record["precision_stats"].append({"step": step, **policy.pop_stats()})
        loop["probe_seconds"] += time.perf_counter() - t0

    def checkpoint(step: int) -> None:
        loop["detectors"] = {name: list(d.history) for name, d in detectors.items()}
        record["timing"]["wall_seconds"] = wall_before + time.perf_counter() - started
        hooks.checkpoints.save(arm_state(step, model, optimizer, policy, loop, hooks.identity))

    if hooks.on_start:
        hooks.on_start(record)
    model.train()
    at_boundary = True   # between two steps: the state is consistent and may be checkpointed at a stop
    try:
        with stop_after_step() as stop:
            for step in range(first_step, run.steps):
                t0 = time.perf_counter()
                at_boundary = False
                current_step[0] = step
                policy.count_step(step, cfg_p.cast_every)
                lr = schedule.lr_at(step, run)
                if run.fault.kind == "lr_spike" and step == run.fault.step:
                    lr *= run.fault.lr_factor
                for group in optimizer.param_groups:
                    group["lr"] = lr
                batch_size = schedule.batch_size_at(step, run)
                x, y = get_batch(corpus, "train", step, batch_size, run.model.context, run.seed, run.data.bos,
                                 device)
                tokens = x.numel()
                if world is not None:  # this rank's rows of the global batch
                    x, y = distributed.local_rows(x, world), distributed.local_rows(y, world)
                    if run.fault.kind == "kill" and step == run.fault.step and world.rank == run.fault.rank:
                        os.kill(os.getpid(), signal.SIGKILL)
                policy_before = policy.state_dict() if hooks.bundles is not None else None
                with policy.autocast():
                    logits = forward(x)
                loss = next_token_loss(logits, y)  # the logged loss: cross-entropy only, comparable across arms
                policy.backward(loss + run.optim.z_loss * z_loss(logits) if run.optim.z_loss else loss)
                policy.unscale_(optimizer)
                if world is None:
                    norms = grad_norms()
                    figures = torch.cat([loss.detach().float().reshape(1), norms]).tolist()  # the one sync per step
                else:  # one all-reduce: global loss, gradient norms and stop request, the same on every rank
                    loss_all, squares, stop_all = distributed.reduce_step(loss, grad_norms.squares(),
                                                                          stop.requested, sharded, world)
                    figures = torch.cat([loss_all.reshape(1), squares.sqrt()]).tolist()
                loss_value, grad_norm, layer_norms = figures[0], figures[1], figures[2:]
                grads_finite = math.isfinite(grad_norm)
                loss_finite = math.isfinite(loss_value)
                nonfinite = "" if loss_finite and grads_finite else ("loss" if not loss_finite else "grad")
                if nonfinite:  # localise before the optimizer step can spread the NaN into the weights
                    record["events"].append(_nonfinite_event(model, policy, step, nonfinite, x, cfg_p, forward, world))
                loss_spike = detectors["loss"].update(loss_value)
                grad_spike = detectors["grad"].update(grad_norm)
                if hooks.bundles is not None and (loss_spike or grad_spike or nonfinite):
                    _keep_bundle(hooks, step, model, optimizer, policy_before, x, y, lr, loss_value, grad_norm,
                                 layer_norms, loss_spike, grad_spike, nonfinite, detectors)
                if run.optim.grad_clip and grads_finite and grad_norm > run.optim.grad_clip:
                    torch._foreach_mul_([probes.local(p.grad) for p in params if p.grad is not None],
                                        run.optim.grad_clip / (grad_norm + 1e-6))
                update_norms.before()
                stepped = policy.step(optimizer, grads_finite)
                optimizer.zero_grad(set_to_none=True)
                if world is None:
                    updates = update_norms.after().tolist()
                else:
                    updates = distributed.reduce_squares(update_norms.squares(), sharded, world).sqrt().tolist()
                update_norm, layer_updates = updates[0], updates[1:]
                loop["tokens_seen"] += tokens
                loop["train_seconds"] += time.perf_counter() - t0

                row = {"step": step, "lr": lr, "batch_size": batch_size, "tokens": loop["tokens_seen"],
                       "loss": loss_value, "grad_norm": grad_norm, "layer_grad_norm": layer_norms,
                       "update_norm": update_norm, "layer_update_norm": layer_updates,
                       "loss_scale": policy.loss_scale, "loss_spike": loss_spike, "grad_spike": grad_spike,
                       "update_spike": detectors["update"].update(update_norm), "nonfinite": nonfinite,
                       "skipped": not stepped}
                for key, value in row.items():
                    series[key].append(value)
                if nonfinite:
                    record["events"][-1]["skipped"] = not stepped
                if loop["initial_loss"] is None and loss_finite:
                    loop["initial_loss"] = loss_value
                initial_loss = loop["initial_loss"]
                loop["above_initial"] = loop["above_initial"] + 1 if (
                    initial_loss is not None and loss_finite and loss_value > cfg_p.diverge_factor * initial_loss
                ) else 0
                if on_step:
                    on_step(step, row)
                if hooks.on_step:
                    hooks.on_step(step, row)

                if not loss_finite or (nonfinite == "grad" and stepped):
                    record.update(status="diverged", diverged_at_step=step,
                                  stop_reason=f"non-finite {nonfinite} at step {step}")
                    break
                if loop["above_initial"] >= cfg_p.diverge_patience:
                    record.update(status="diverged", diverged_at_step=step, stop_reason=(
                        f"loss above {cfg_p.diverge_factor:g} x initial loss {initial_loss:.3f} for "
                        f"{cfg_p.diverge_patience} consecutive steps"))
                    break
                if step % cfg_p.every == 0:
                    take_probes(step)
                if hooks.checkpoints is not None and hooks.checkpoints.due(step) and step < run.steps - 1:
                    checkpoint(step)
                at_boundary = True
                if stop_all if world is not None else stop.requested:  # under torchrun: any rank's Ctrl-C
                    raise KeyboardInterrupt
            else:
                record["status"] = "completed"
    except KeyboardInterrupt:
        record.update(status="killed", stop_reason="interrupted (Ctrl-C)")
        if hooks.checkpoints is not None and at_boundary and series["step"]:
            checkpoint(series["step"][-1])   # the stop checkpoint: resume continues after the last step
    except Exception as error:  # noqa: BLE001 -- recorded, never lost; the caller reports it
        record.update(status="error", stop_reason=f"{type(error).__name__}: {error}",
                      traceback=traceback.format_exc())
    finally:
        if fault_handle is not None:
            fault_handle.remove()
        policy.unwatch()

    if record["status"] in ("completed", "diverged") and series["step"]:
        last = series["step"][-1]
        if not record["probes"] or record["probes"][-1]["step"] != last:
            take_probes(last)
        t0 = time.perf_counter()
        record["final"].update(evaluate(model, held_out, policy))
        if on_trained is not None and world is None:
            on_trained(model, corpus, record)
        elif on_trained is not None:  # on an unsharded copy, on rank 0 (whose record is kept)
            copy = distributed.full_model(model, run, lambda: policy.prepare(build_model(run.model, run.seed)))
            if copy is not None:
                on_trained(copy, corpus, record)
        eval_seconds = time.perf_counter() - t0
    else:
        eval_seconds = 0.0
    record["final"].update(final_figures(record, run.steps))
    wall = wall_before + time.perf_counter() - started
    train_seconds, tokens_seen = loop["train_seconds"], loop["tokens_seen"]
    record["timing"] = {"wall_seconds": wall, "train_seconds": train_seconds, "probe_seconds": loop["probe_seconds"],
                        "eval_seconds": eval_seconds, "tokens": tokens_seen,
                        "tokens_per_second": tokens_seen / train_seconds if train_seconds else 0.0,
                        "started_at": loop["started_at"], "ended_at": time.time(),
                        **({"resumed_at_step": first_step} if first_step else {})}
    if hooks.on_end:
        hooks.on_end(record)
    return record


def _keep_bundle(hooks, step, model, optimizer, policy_state, x, y, lr, loss_value, grad_norm, layer_norms,
                 loss_spike, grad_spike, nonfinite, detectors) -> None:
    """Hand the state before ``step`` (not yet updated) to the bundle budget, if it wants this step."""
    reasons = [r for r, flagged in (("loss spike", loss_spike), ("grad spike", grad_spike),
                                    (f"non-finite {nonfinite}", bool(nonfinite))) if flagged]
    severity = math.inf if nonfinite else max(detectors["loss"].score if loss_spike else 0.0,
                                              detectors["grad"].score if grad_spike else 0.0)
    if not hooks.bundles.wants(severity):
        return
    measured = {"loss": loss_value, "grad_norm": grad_norm, "layer_grad_norm": layer_norms, "lr": lr,
                "reasons": reasons, "severity": severity}
    hooks.bundles.save(step_bundle(step, model, optimizer, policy_state, x, y, hooks.identity, measured,
                                   hooks.replay_optimizer))


def _nonfinite_event(model, policy, step, what, x, cfg_p, forward_model=None, world=None) -> dict:
    """Describe a non-finite step: the first module whose output went non-finite (re-running
    the step's forward with hooks), or the parameters whose gradients did. Under a process group every
    rank re-runs its rows and the event names the first rank where a module went non-finite ("rank")
    and every rank's finding ("rank_modules")."""
    event = {"step": step, "what": what, "skipped": False, "module": None, "layer": None,
             "grad_params": probes.nonfinite_grad_modules(model)[:20]}
    if cfg_p.localize_nonfinite:
        def forward():
            with policy.autocast():
                (forward_model or model)(x)
        module = probes.first_nonfinite_module(model, forward)
        if world is not None:
            rank, module, found = distributed.first_rank_module(module, world)
            event.update(rank=rank, rank_modules=found)
        if module is not None:
            event.update(what="activation" if what == "loss" else what, module=module,
                         layer=probes.layer_of(module, model.block_names))
    return event
