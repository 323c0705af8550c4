"""Trains one arm (one model, one seed) with the probes attached and returns its run record.

The record is a plain JSON-ready dict: the per-step ``series`` (loss, lr, grad norm,
spike and non-finite flags, loss scale, batch size), the non-finite ``events`` with the
first offending module, the heavy ``probes`` snapshots, the ``final`` figures (held-out
loss, perplexity, next-token accuracy, spike scores, M-Act, F-Attn, ...) and ``timing``.

An arm that diverges (non-finite loss, or loss above ``diverge_factor`` times its first
loss for ``diverge_patience`` consecutive steps) stops early with status "diverged":
that is a result, not an error. Ctrl-C stops the arm with status "killed" and the record
so far is returned; the caller decides whether to stop everything.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable

import torch

from stability import precision, probes
from stability.config import RunConfig
from stability.data import Corpus, eval_batches, get_batch, load_corpus, probe_batch
from stability.model import next_token_loss, z_loss
from stability.models import build_model
from stability.precision import PrecisionPolicy
from stability.record import final_figures, new_arm_record
from stability.schedules import Standard

StepCallback = Callable[[int, dict], None]


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


def _install_fault(model: torch.nn.Module, run: RunConfig, current_step: list[int]):
    """A forward hook that turns block ``fault.layer``'s output NaN/Inf at ``fault.step``."""
    fault = run.fault
    if fault.kind not in ("nan", "inf"):
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
          on_step: StepCallback | None = None, on_trained: Callable | None = None) -> dict:
    """Train one arm and return its run record (see module docstring).

    ``on_trained(model, corpus, record)``, when given, runs after the final evaluation of an
    arm that completed or diverged (the experiment uses it for quantization evaluation)."""
    schedule = schedule or Standard()
    device = torch.device(run.device)
    precision.check(run.precision, run.device, run.data.batch_size * run.model.context)  # ConfigError: nothing ran
    corpus = corpus or load_corpus(run.data, run.model.vocab_size, run.model.context)
    torch.manual_seed(run.seed)
    model = build_model(run.model, run.seed).to(device)
    policy = PrecisionPolicy(run.precision, run.device)
    model = policy.prepare(model)
    policy.watch(model)  # counts overflow/underflow on the device (the own fp8 counts in its casts)
    optimizer = make_optimizer(model, run)
    groups = probes.layer_groups(model)
    grad_norms = probes.GradNorms(groups)
    params = [p for p in model.parameters()]
    cfg_p = run.probes
    loss_spikes = probes.SpikeDetector(cfg_p.spike_window, cfg_p.spike_k, cfg_p.spike_min_history)
    grad_spikes = probes.SpikeDetector(cfg_p.spike_window, cfg_p.spike_k, cfg_p.spike_min_history)
    probe_x, _ = probe_batch(corpus, cfg_p.probe_batch_size, run.model.context, run.data.bos, device)
    held_out = eval_batches(corpus, cfg_p.eval_batches, run.data.batch_size, run.model.context, run.data.bos,
                            device)
    current_step = [-1]
    fault_handle = _install_fault(model, run, current_step)

    record = new_arm_record(arm, run.variant, run.seed, schedule.name)
    record.update(num_parameters=model.num_parameters(), gate_parameters=model.num_gate_parameters(),
                  layer_names=list(groups), model=model.describe(),
                  precision={"dtype": run.precision.dtype, **policy.describe()})
    series = record["series"]
    initial_loss, above_initial, tokens_seen = None, 0, 0
    train_seconds = probe_seconds = 0.0
    started = time.perf_counter()

    def take_probes(step: int) -> None:
        nonlocal probe_seconds
        t0 = time.perf_counter()
        snapshot = probes.heavy_probes(model, probe_x)
        snapshot["step"] = step
        record["probes"].append(snapshot)
        if run.precision.dtype != "fp32":
            record["precision_stats"].append({"step": step, **policy.pop_stats()})
        probe_seconds += time.perf_counter() - t0

    model.train()
    try:
        for step in range(run.steps):
            t0 = time.perf_counter()
            current_step[0] = step
            policy.count_step(step, cfg_p.cast_every)
            lr = schedule.lr_at(step, run)
            if run.fault.kind == "lr_spike" and step == run.fault.step:
                lr *= run.fault.lr_factor
            for group in optimizer.param_groups:
                group["lr"] = lr
            batch_size = schedule.batch_size_at(step, run)
            x, y = get_batch(corpus, "train", step, batch_size, run.model.context, run.seed, run.data.bos, device)
            with policy.autocast():
                logits = model(x)
            loss = next_token_loss(logits, y)  # the logged loss: cross-entropy only, comparable across arms
            policy.backward(loss + run.optim.z_loss * z_loss(logits) if run.optim.z_loss else loss)
            policy.unscale_(optimizer)
            norms = grad_norms()
            figures = torch.cat([loss.detach().float().reshape(1), norms]).tolist()  # the one sync per step
            loss_value, grad_norm, layer_norms = figures[0], figures[1], figures[2:]
            grads_finite = math.isfinite(grad_norm)
            loss_finite = math.isfinite(loss_value)
            nonfinite = "" if loss_finite and grads_finite else ("loss" if not loss_finite else "grad")
            if nonfinite:  # localise before the optimizer step can spread the NaN into the weights
                record["events"].append(_nonfinite_event(model, policy, step, nonfinite, x, cfg_p))
            if run.optim.grad_clip and grads_finite and grad_norm > run.optim.grad_clip:
                torch._foreach_mul_([p.grad for p in params if p.grad is not None],
                                    run.optim.grad_clip / (grad_norm + 1e-6))
            stepped = policy.step(optimizer, grads_finite)
            optimizer.zero_grad(set_to_none=True)
            tokens_seen += x.numel()
            train_seconds += time.perf_counter() - t0

            for key, value in (("step", step), ("lr", lr), ("batch_size", batch_size), ("tokens", tokens_seen),
                               ("loss", loss_value), ("grad_norm", grad_norm), ("layer_grad_norm", layer_norms),
                               ("loss_scale", policy.loss_scale), ("loss_spike", loss_spikes.update(loss_value)),
                               ("grad_spike", grad_spikes.update(grad_norm)), ("nonfinite", nonfinite),
                               ("skipped", not stepped)):
                series[key].append(value)
            if nonfinite:
                record["events"][-1]["skipped"] = not stepped
            if on_step:
                on_step(step, {"loss": loss_value, "lr": lr, "grad_norm": grad_norm})

            if initial_loss is None and loss_finite:
                initial_loss = loss_value
            above_initial = above_initial + 1 if (
                initial_loss is not None and loss_finite and loss_value > cfg_p.diverge_factor * initial_loss) else 0
            if not loss_finite or (nonfinite == "grad" and stepped):
                record.update(status="diverged", diverged_at_step=step,
                              stop_reason=f"non-finite {nonfinite} at step {step}")
                break
            if above_initial >= cfg_p.diverge_patience:
                record.update(status="diverged", diverged_at_step=step, stop_reason=(
                    f"loss above {cfg_p.diverge_factor:g} x initial loss {initial_loss:.3f} for "
                    f"{cfg_p.diverge_patience} consecutive steps"))
                break
            if step % cfg_p.every == 0:
                take_probes(step)
        else:
            record["status"] = "completed"
    except KeyboardInterrupt:
        record.update(status="killed", stop_reason="interrupted (Ctrl-C)")
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
        if on_trained is not None:
            on_trained(model, corpus, record)
        eval_seconds = time.perf_counter() - t0
    else:
        eval_seconds = 0.0
    record["final"].update(final_figures(record, run.steps))
    wall = time.perf_counter() - started
    record["timing"] = {"wall_seconds": wall, "train_seconds": train_seconds, "probe_seconds": probe_seconds,
                        "eval_seconds": eval_seconds, "tokens": tokens_seen,
                        "tokens_per_second": tokens_seen / train_seconds if train_seconds else 0.0}
    return record


def _nonfinite_event(model, policy, step, what, x, cfg_p) -> dict:
    """Describe a non-finite step: the first module whose output went non-finite (re-running
    the step's forward with hooks), or the parameters whose gradients did."""
    event = {"step": step, "what": what, "skipped": False, "module": None, "layer": None,
             "grad_params": probes.nonfinite_grad_modules(model)[:20]}
    if cfg_p.localize_nonfinite:
        def forward():
            with policy.autocast():
                model(x)
        module = probes.first_nonfinite_module(model, forward)
        if module is not None:
            event.update(what="activation" if what == "loss" else what, module=module,
                         layer=probes.layer_of(module, model.block_names))
    return event
