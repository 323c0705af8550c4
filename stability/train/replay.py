"""Re-run one flagged training step from its replay bundle and say what happened inside it.

    report = replay("reports/runs/<run>/replay/<case id>/gated-seed0-1a2b3c4d-step21.pt")
    print(replay_text(report))                # stability.report.replay: what `stability replay BUNDLE` prints

A bundle (``stability.train.checkpoint.step_bundle``) holds the weights before the step, the precision
state at its start, its batch, the run config and what training measured. The replay builds the
model from the config, loads the weights and runs the step's forward and backward exactly as the
trainer did (same attention backend, same thread count, forward hooks only observe), so on the CPU
the loss and gradient norm come out bit for bit. Per module it reports the largest |output|, the
gradient norm of the module's parameters, and (per attention layer, from a second pass through the
explicit attention path) the largest attention logit q.k/sqrt(d); and the first module whose output
went non-finite. With the optimiser state in the bundle it also applies the update and reports its
norm. A bundle written by another version of the code is replayed anyway when the shapes fit (the
report says so); one whose shapes do not fit, or a file that is not a bundle, is a RecordError.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from stability import config as cfg
from stability.config.overrides import check_types
from stability.model.build import build_model
from stability.model.lm import next_token_loss, z_loss
from stability.precision import PrecisionPolicy
from stability.record import RecordError
from stability.train import probes
from stability.train.checkpoint import code_version, load_state, untrusted_factory
from stability.train.faults import poison_block
from stability.train.optimizer import make_optimizer


def replay(path: str | Path, trust_factory: bool = False) -> dict:
    """Re-run the bundle's step on the CPU; returns the report (``stability.report.replay.replay_text`` shows
    it). A bundle is data: a ``model.factory`` its config names is imported (its module's code run) only with
    ``trust_factory``."""
    bundle = load_state(path, kind="bundle")
    if not isinstance(bundle.get("config"), dict):
        raise RecordError(f"bundle {str(path)!r}: config = {_shown(bundle.get('config'))}: expected the run config "
                          f"(an object)")
    try:
        run = cfg.from_dict(cfg.RunConfig, bundle["config"])
        check_types(run)
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        raise RecordError(f"bundle {str(path)!r} holds a config this code cannot read: {error}") from None
    if run.model.factory and not trust_factory:
        raise RecordError(untrusted_factory(f"bundle {str(path)!r}", run.model.factory))
    check_bundle(bundle, run, path)
    written_on = run.device
    run = replace(run, device="cpu")
    notes = []
    if bundle.get("code") != code_version():
        notes.append(f"written by code version {bundle.get('code')}, this is {code_version()}: replaying anyway "
                     f"(the shapes fit)")
    if written_on != "cpu":
        notes.append(f"written on {written_on}, replayed on the CPU: expect last-bit differences")
    threads = torch.get_num_threads()
    torch.set_num_threads(int(bundle.get("threads") or threads))
    try:
        return _replay(bundle, run, Path(path), notes)
    finally:
        torch.set_num_threads(threads)


def _shown(value) -> str:
    """A value of a bundle on one short line (a tensor by its shape and type)."""
    if torch.is_tensor(value):
        return f"a tensor of shape {tuple(value.shape)} and type {value.dtype}"
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def check_bundle(bundle: dict, run: cfg.RunConfig, path) -> None:
    """RecordError naming the bundle and the field unless each field the replay reads is of its type: the step
    a whole number >= 0, the batch (``x``, ``y``) two integer tensors of one (batch, length) shape holding
    token ids of the model's vocabulary, ``measured`` an object, the weights an object of tensors, the
    optimiser and precision states objects or null, the thread count a whole number >= 1 or null."""
    def refuse(field: str, expected: str):
        raise RecordError(f"bundle {str(path)!r}: {field} = {_shown(bundle.get(field))}: expected {expected}")
    step, threads = bundle.get("step"), bundle.get("threads")
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        refuse("step", "a whole number >= 0")
    if threads is not None and not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
        refuse("threads", "a whole number >= 1 or null")
    for field in ("x", "y"):
        batch = bundle.get(field)
        if not (torch.is_tensor(batch) and batch.dim() == 2 and batch.numel() > 0
                and not batch.is_floating_point() and batch.dtype != torch.bool):
            refuse(field, "a (batch, length) tensor of token ids")
        if batch.min() < 0 or (run.model.kind == "harness" and batch.max() >= run.model.vocab_size):
            refuse(field, f"token ids in [0, {run.model.vocab_size})")
    if bundle["x"].shape != bundle["y"].shape:
        refuse("y", f"the shape of x {tuple(bundle['x'].shape)}")
    model = bundle.get("model")
    if not (isinstance(model, dict) and all(torch.is_tensor(v) for v in model.values())):
        refuse("model", "the model's weights (an object of tensors)")
    measured = bundle.get("measured")
    if not isinstance(measured, dict):
        refuse("measured", "what training measured at the step (an object)")
    for key in ("loss", "grad_norm", "lr", "severity"):
        value = measured.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RecordError(f"bundle {str(path)!r}: measured.{key} = {_shown(value)}: expected a number or null")
    reasons = measured.get("reasons", [])
    if not isinstance(reasons, list) or not all(isinstance(reason, str) for reason in reasons):
        raise RecordError(f"bundle {str(path)!r}: measured.reasons = {_shown(reasons)}: expected a list of strings")
    if bundle.get("optimizer") is not None and not (measured.get("lr") is not None and math.isfinite(measured["lr"])):
        raise RecordError(f"bundle {str(path)!r}: measured.lr = {_shown(measured.get('lr'))}: expected the step's learning "
                          f"rate (a finite number), which the optimiser's step replays")
    for field in ("optimizer", "precision"):
        if bundle.get(field) is not None and not isinstance(bundle[field], dict):
            refuse(field, "an object or null")


def _replay(bundle: dict, run: cfg.RunConfig, path: Path, notes: list[str]) -> dict:
    """The bundle's step again: its model, precision and optimiser state restored, one forward and backward with
    every module's output watched, the optimiser step with the recorded LR, then what it measured."""
    model, policy, optimizer = _restore(bundle, run, path)
    step = int(bundle["step"])
    fault = poison_block(model, run, lambda: step)
    x, y = bundle["x"], bundle["y"]
    loss, outputs, first_nonfinite = _forward_backward(model, policy, optimizer, run, step, x, y)
    groups = probes.layer_groups(model)
    grad_norm = probes.GradNorms(groups)().tolist()[0]
    grads = _module_grad_norms(model)
    bad_grads = probes.nonfinite_grad_modules(model)
    update = None
    if bundle.get("optimizer") is not None:
        update = _update(model, policy, optimizer, run, groups, grad_norm, bundle["measured"].get("lr"))
    if fault is not None:
        fault.remove()
    logit_max = _attention_logit_max(model, x, policy)
    measured = bundle["measured"]
    modules = []
    for name, module in model.named_modules():
        if not name or (name not in outputs and name not in grads):
            continue
        layer = probes.layer_of(name)
        is_attention = name.endswith(".attn") and layer is not None
        modules.append({"module": name, "max_abs_output": outputs.get(name), "grad_norm": grads.get(name),
                        "attn_logit_max": logit_max.get(layer) if is_attention else None})
    loss_value = loss.item()
    same_loss, same_grad_norm = _same(loss_value, measured.get("loss")), _same(grad_norm, measured.get("grad_norm"))
    return {"bundle": str(path), "run_key": bundle.get("run_key"), "name": bundle.get("name"),
            "case": bundle.get("case"), "arm": bundle.get("arm"), "seed": bundle.get("seed"), "step": step,
            "reasons": measured.get("reasons", []), "severity": measured.get("severity"), "notes": notes,
            "loss": loss_value, "recorded_loss": measured.get("loss"), "grad_norm": grad_norm,
            "recorded_grad_norm": measured.get("grad_norm"),
            "reproduced_loss": same_loss, "reproduced_grad_norm": same_grad_norm,
            "reproduced": same_loss and same_grad_norm,
            "first_nonfinite_module": first_nonfinite[0] if first_nonfinite else None,
            "nonfinite_grads": bad_grads[:10], "update_norm": update, "modules": modules}


def _restore(bundle: dict, run: cfg.RunConfig, path: Path):
    """(model, precision policy, optimiser) of ``run`` with the bundle's states loaded; a RecordError when they do
    not fit this code's."""
    model = build_model(run.model, run.seed)
    policy = PrecisionPolicy(run.precision, "cpu")
    model = policy.prepare(model)
    try:
        model.load_state_dict(bundle["model"])
        if bundle.get("precision") is not None:
            policy.load_state_dict(bundle["precision"])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as error:
        raise RecordError(f"bundle {str(path)!r} does not fit this code's model (shapes differ): "
                          f"{str(error).strip().splitlines()[0][:300]}") from None
    optimizer = make_optimizer(model, run)
    if bundle.get("optimizer") is not None:
        try:
            optimizer.load_state_dict(bundle["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:
            raise RecordError(f"bundle {str(path)!r}: optimizer does not fit this code's optimiser: "
                              f"{str(error).strip().splitlines()[0][:300]}") from None
    return model, policy, optimizer


def _forward_backward(model, policy: PrecisionPolicy, optimizer, run: cfg.RunConfig, step: int, x, y):
    """The step's forward and backward (gradients unscaled), every module's output watched: (loss, {module: max
    |output|}, [the first module in forward order whose output was not finite])."""
    outputs: dict[str, float] = {}
    first_nonfinite: list[str] = []

    def hook(name):
        def observe(_module, _inputs, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if torch.is_tensor(tensor) and tensor.is_floating_point():
                outputs[name] = tensor.detach().float().abs().max().item()
                if not first_nonfinite and not torch.isfinite(tensor).all():
                    first_nonfinite.append(name)
        return observe

    handles = [module.register_forward_hook(hook(name)) for name, module in model.named_modules() if name]
    model.train()
    policy.count_step(step, run.probes.cast_every)
    try:
        with policy.autocast():
            logits = model(x)
        loss = next_token_loss(logits, y)
        policy.backward(loss + run.optim.z_loss * z_loss(logits) if run.optim.z_loss else loss)
        policy.unscale_(optimizer)
    finally:
        for handle in handles:
            handle.remove()
    return loss, outputs, first_nonfinite


def _update(model, policy: PrecisionPolicy, optimizer, run: cfg.RunConfig, groups: dict, grad_norm: float,
            lr: float) -> dict:
    """The optimiser step at the recorded ``lr`` (gradients clipped as the trainer clips them): the update norm,
    global and per layer group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    params = list(model.parameters())
    if run.optim.grad_clip and math.isfinite(grad_norm) and grad_norm > run.optim.grad_clip:
        torch._foreach_mul_([p.grad for p in params if p.grad is not None], run.optim.grad_clip / (grad_norm + 1e-6))
    updates = probes.UpdateNorms(groups)
    updates.before()
    policy.step(optimizer, math.isfinite(grad_norm))
    return dict(zip(["global", *groups], updates.after().tolist()))


def _same(a, b) -> bool:
    """Bit-equal floats (NaN equals NaN: a non-finite step reproduced is reproduced)."""
    if a is None or b is None:
        return False
    return (math.isnan(a) and math.isnan(b)) or a == b


def _module_grad_norms(model: torch.nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each module's parameters (its children's included)."""
    squares: dict[str, float] = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        square = param.grad.detach().double().pow(2).sum().item()
        parts = name.split(".")[:-1]
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            squares[prefix] = squares.get(prefix, 0.0) + square
    return {name: math.sqrt(value) if math.isfinite(value) else value for name, value in squares.items()}


@torch.no_grad()
def _attention_logit_max(model: torch.nn.Module, x: torch.Tensor, policy: PrecisionPolicy) -> dict[int, float]:
    """Per layer, the largest unmasked attention logit q.k/sqrt(d) (a second pass, explicit attention)."""
    found: dict[int, float] = {}

    def observe(layer, name, tensor):
        if name == "attn_logits":
            found[layer] = probes.max_attention_logit(tensor)

    model.set_observer(observe)
    try:
        with policy.autocast():
            model(x)
    finally:
        model.set_observer(None)
    return found
