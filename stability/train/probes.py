"""The stability figures, each a small function on tensors or numbers (definitions: docs/figures.md).

Cheap figures run every step: ``SpikeDetector`` (loss, gradient-norm and update-norm spikes),
``grad_norms`` (global and per-layer L2 before clipping, as one device tensor so the
trainer syncs once per step), ``UpdateNorms`` (global and per-layer L2 of the optimiser's
update W_after - W_before) and ``first_nonfinite_module`` (used only after a non-finite step,
so healthy steps pay nothing for it).

Heavy figures run every K steps on a fixed probe batch through the explicit attention
path: ``heavy_probes`` returns M-Act, F-Attn, sink rate, max attention logit, output
logit health, gate score and the kurtosis / infinity norm of every Linear's input.
"""

from __future__ import annotations

import math
from collections import deque

import torch
from torch import nn

SINK_THRESHOLD = 0.3  # Gu et al. (ICLR 2025): a head has a sink at k=0 when alpha_0 > 0.3


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this process holds: the local shard of a DTensor (FSDP), else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


# ----------------------------------------------------------------------------- spikes

class SpikeDetector:
    """Flags a value at least ``k`` standard deviations above the mean of the previous
    ``window`` finite values (needs ``min_history`` values first). Non-finite values are
    never added to the history and are not spikes (they are non-finite events)."""

    def __init__(self, window: int, k: float, min_history: int = 10):
        self.k = k
        self.min_history = min_history
        self.history: deque[float] = deque(maxlen=window)
        self.score = 0.0  # the last value's distance above the mean, in standard deviations (0 without history)

    def update(self, value: float) -> bool:
        self.score = 0.0
        if not math.isfinite(value):
            return False
        spike = False
        if len(self.history) >= self.min_history:
            mean = sum(self.history) / len(self.history)
            std = math.sqrt(sum((h - mean) ** 2 for h in self.history) / len(self.history))
            spike = value >= mean + self.k * max(std, 1e-12)
            self.score = (value - mean) / max(std, 1e-12)
        self.history.append(value)
        return spike


# ----------------------------------------------------------------------------- gradients

def layer_groups(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Parameters grouped for per-layer gradient norms: "embed", "layer0".."layerN-1", "head".

    Layer i holds the parameters below ``model.block_names[i]`` ("blocks.i" in the harness's model);
    "embed" the embeddings (a name with "embed" outside the blocks); "head" the rest."""
    prefixes = [name + "." for name in getattr(model, "block_names", None) or []]
    groups: dict[str, list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        layer = next((i for i, prefix in enumerate(prefixes) if name.startswith(prefix)), None)
        if layer is None and not prefixes and name.startswith("blocks."):
            layer = int(name.split(".")[1])
        if layer is not None:
            key = f"layer{layer}"
        elif "embed" in name:
            key = "embed"
        else:
            key = "head"
        groups.setdefault(key, []).append(param)
    return groups


class GradNorms:
    """Global and per-group L2 norms of the gradients in one pass, kept on device.

    Calling it returns a tensor: entry 0 is the global norm, then one entry per group of
    ``layer_groups`` order. One fused ``_foreach_norm`` over all gradients, then a
    scatter-add of the squares into their groups: no host sync, no per-group loop."""

    def __init__(self, groups: dict[str, list[nn.Parameter]]):
        self.params = [p for params in groups.values() for p in params]
        self.group_of = torch.tensor([i for i, params in enumerate(groups.values()) for _ in params])
        self.n_groups = len(groups)

    def __call__(self) -> torch.Tensor:
        return self.squares().sqrt()

    def squares(self) -> torch.Tensor:
        """The squared norms, laid out like the call's result. Under FSDP each process holds shards of the
        gradients (``local``): their squares add up over the processes to the global ones."""
        pairs = [(i, local(p.grad)) for i, p in enumerate(self.params) if p.grad is not None]
        device = local(self.params[0]).device
        if not pairs:
            return torch.zeros(self.n_groups + 1, device=device)
        index = self.group_of[[i for i, _ in pairs]].to(device)
        squares = torch.stack(torch._foreach_norm([g for _, g in pairs])).float().pow(2)
        per_group = torch.zeros(self.n_groups, device=device).index_add_(0, index, squares)
        return torch.cat([squares.sum().reshape(1), per_group])


class UpdateNorms:
    """Global and per-group L2 norms of what one optimiser step changed, ||W_after - W_before||.

    ``before()`` copies the weights (one extra copy of the model in memory), ``after()`` returns
    a device tensor laid out like ``GradNorms``: entry 0 the global norm, then one per group. It
    measures the update as applied (Adam's step, weight decay, a skipped step's zero), whatever
    the optimiser."""

    def __init__(self, groups: dict[str, list[nn.Parameter]]):
        self.params = [p for params in groups.values() for p in params]
        self.group_of = torch.tensor([i for i, params in enumerate(groups.values()) for _ in params])
        self.n_groups = len(groups)
        self.previous = [torch.empty_like(local(p.detach()), memory_format=torch.preserve_format) for p in self.params]

    def before(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self.previous, [local(p.detach()) for p in self.params])

    def after(self) -> torch.Tensor:
        return self.squares().sqrt()

    def squares(self) -> torch.Tensor:
        """``after`` before the square root (under FSDP: of this process's shards, see ``GradNorms.squares``)."""
        with torch.no_grad():
            torch._foreach_sub_(self.previous, [local(p.detach()) for p in self.params])   # W_before - W_after
            device = self.previous[0].device
            squares = torch.stack(torch._foreach_norm(self.previous)).float().pow(2)
            per_group = torch.zeros(self.n_groups, device=device).index_add_(0, self.group_of.to(device), squares)
            return torch.cat([squares.sum().reshape(1), per_group])


def grad_norms(groups: dict[str, list[nn.Parameter]]) -> torch.Tensor:
    """L2 norms of the gradients: entry 0 is the global norm, then one per group, on device."""
    return GradNorms(groups)()


# ----------------------------------------------------------------------------- non-finite

def first_nonfinite_module(model: nn.Module, run_forward) -> str | None:
    """Name of the first module, in the order modules finish their forward, whose output
    holds a NaN or Inf when ``run_forward()`` is called; None if every output is finite."""
    found: list[str] = []
    handles = []

    def hook(name):
        def check(_module, _inputs, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if not found and torch.is_tensor(tensor) and not torch.isfinite(tensor).all():
                found.append(name)
        return check

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.no_grad():
            run_forward()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None


def nonfinite_grad_modules(model: nn.Module) -> list[str]:
    """Names of parameters whose gradient holds a NaN or Inf, in registration order."""
    return [name for name, p in model.named_parameters()
            if p.grad is not None and not torch.isfinite(local(p.grad)).all()]


def layer_of(module_name: str | None, block_names: list[str] | None = None) -> int | None:
    """The block index of a module name like "blocks.3.attn.q_proj" (or one below ``block_names[i]``),
    else None."""
    if not module_name:
        return None
    if block_names:
        return next((i for i, block in enumerate(block_names)
                     if module_name == block or module_name.startswith(block + ".")), None)
    if module_name.startswith("blocks."):
        return int(module_name.split(".")[1])
    return None


# ----------------------------------------------------------------------------- heavy figures

def massive_activation(residual: torch.Tensor) -> tuple[float, float]:
    """M-Act of one layer's residual output (B, S, d): (max |value|, max / median |value|)."""
    magnitude = residual.detach().float().abs()
    peak = magnitude.max().item()
    median = magnitude.median().item()
    return peak, peak / median if median > 0 else float("inf")


def first_token_share(probs: torch.Tensor, first_query: int = 1) -> torch.Tensor:
    """Per-head attention on position 0, averaged over batch and query positions >= ``first_query``.

    probs: (B, H, S, S) rows summing to 1 -> (H,). With ``first_query=1`` (the default) its mean over
    heads is F-Attn: query 0 is left out because under the causal mask it can only attend to itself
    (its share is 1 whatever the model learned). With ``first_query=0`` it is Gu et al.'s alpha_0."""
    if probs.shape[-2] <= first_query:
        raise ValueError(f"probs has {probs.shape[-2]} query positions: F-Attn needs more than {first_query}")
    return probs.detach().float()[..., first_query:, 0].mean(dim=(0, 2))


def sink_rate(alpha_0: torch.Tensor, threshold: float = SINK_THRESHOLD) -> float:
    """Fraction of heads whose alpha_0 (mean over all queries i >= 0 of A[i, 0], Gu et al. 2025)
    exceeds the threshold."""
    return (alpha_0 > threshold).float().mean().item()


def max_attention_logit(logits: torch.Tensor) -> float:
    """max of q.k / sqrt(d) over the unmasked entries of (B, H, S, S) logits (masked = -inf)."""
    return logits.detach().float().max().item()


def logit_health(logits: torch.Tensor) -> tuple[float, float]:
    """Output-logit max |logit| and mean log Z (log-sum-exp over the vocab) of (B, S, V) logits."""
    logits = logits.detach().float()
    return logits.abs().max().item(), torch.logsumexp(logits, dim=-1).mean().item()


def kurtosis(x: torch.Tensor) -> float:
    """Kurtosis E[(x - mu)^4] / sigma^4 over all elements (3 for a Gaussian)."""
    x = x.detach().double().flatten()
    centred = x - x.mean()
    var = centred.pow(2).mean()
    return (centred.pow(4).mean() / var.pow(2)).item() if var > 0 else float("nan")


def heavy_probes(model: nn.Module, tokens: torch.Tensor) -> dict:
    """All per-layer figures of ``model`` on one probe batch (B, S).

    ``model`` is a ``GatedLM`` or a ``stability.model.build.WrappedLM``: M-Act from the outputs of
    ``model.blocks``, the attention figures through ``model.set_observer`` (the explicit attention
    path, or the eager probe attention of an HF model). Runs one forward (without autograd) with hooks, then removes them.
    A figure the model cannot show (attention of a module without an observer) is None."""
    n_layers = len(model.blocks)
    layers = [{} for _ in range(n_layers)]
    linear_inputs: dict[str, dict[str, float]] = {}
    handles = []

    def observe(layer, name, tensor):
        if name == "attn_probs":
            layers[layer]["f_attn"] = first_token_share(tensor, first_query=1).mean().item()
            layers[layer]["sink_rate"] = sink_rate(first_token_share(tensor, first_query=0))
        elif name == "attn_logits":
            layers[layer]["max_attn_logit"] = max_attention_logit(tensor)
        elif name == "gate_score":
            layers[layer]["gate_score"] = tensor.float().mean().item()

    def block_hook(index):
        def hook(_module, _inputs, output):
            peak, ratio = massive_activation(output[0] if isinstance(output, tuple) else output)
            layers[index]["m_act"] = peak
            layers[index]["m_act_ratio"] = ratio
        return hook

    def linear_hook(name):
        def hook(_module, inputs):
            x = inputs[0]
            linear_inputs[name] = {"kurtosis": kurtosis(x), "inf_norm": x.detach().float().abs().max().item()}
        return hook

    for index, block in enumerate(model.blocks):
        handles.append(block.register_forward_hook(block_hook(index)))
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_pre_hook(linear_hook(name)))
    was_training = model.training
    model.eval()
    model.set_observer(observe)
    try:
        with torch.no_grad():
            logits = model(tokens)
    finally:
        model.set_observer(None)
        model.train(was_training)
        for handle in handles:
            handle.remove()
    logit_max, log_z = logit_health(logits)

    def mean_of(key):
        values = [layer[key] for layer in layers if key in layer]
        return sum(values) / len(values) if values else None

    return {
        "layers": layers,
        "m_act_mean": mean_of("m_act"),
        "m_act_max": max(layer["m_act"] for layer in layers),
        "f_attn_mean": mean_of("f_attn"),
        "sink_rate_mean": mean_of("sink_rate"),
        "max_attn_logit": max((layer["max_attn_logit"] for layer in layers if "max_attn_logit" in layer),
                              default=None),
        "gate_score_mean": mean_of("gate_score"),
        "logit_max": logit_max,
        "log_z_mean": log_z,
        "linear_inputs": linear_inputs,
    }
