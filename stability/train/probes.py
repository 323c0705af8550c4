"""The stability figures, each a small function on tensors or numbers (definitions: docs/figures.md).

Cheap figures run every step: ``SpikeDetector`` (loss, gradient-norm and update-norm spikes),
``grad_norms`` (global and per-layer L2 before clipping, as one device tensor so the
trainer syncs once per step), ``UpdateNorms`` (global and per-layer L2 of the optimiser's
update W_after - W_before) and ``first_nonfinite_module`` (used only after a non-finite step,
so healthy steps pay nothing for it).

Heavy figures run every K steps on a fixed probe batch through the explicit attention
path: ``heavy_probes`` measures every probe of ``LAYER_PROBES`` in each layer (M-Act, F-Attn, sink
rate, max attention logit, gate score; ``register`` adds one) and the model figures made from them,
the output logit health and the kurtosis / infinity norm of every Linear's input. What a probe
computes is declared there once; its direction and unit are in ``stability.record.figures``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from stability.record import figures

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


def layer_m_act(block_output: torch.Tensor) -> float:
    """M-Act of one layer: max |value| of the block's residual output."""
    return massive_activation(block_output)[0]


def layer_m_act_ratio(block_output: torch.Tensor) -> float:
    """max / median |value| of the block's residual output."""
    return massive_activation(block_output)[1]


def layer_f_attn(probs: torch.Tensor) -> float:
    """F-Attn of one layer: attention on position 0 from query positions >= 1, mean over heads."""
    return first_token_share(probs, first_query=1).mean().item()


def layer_sink_rate(probs: torch.Tensor) -> float:
    """Sink rate of one layer: the fraction of heads whose alpha_0 exceeds ``SINK_THRESHOLD``."""
    return sink_rate(first_token_share(probs, first_query=0))


def layer_gate_score(score: torch.Tensor) -> float:
    """Mean gate value of one layer."""
    return score.float().mean().item()


@dataclass(frozen=True)
class LayerProbe:
    """A per-layer figure of the heavy probes, and the model figures made from it.

    name: its key in each layer's entry of a snapshot (``layers``), and in MLflow (``probe.<name>.layer<i>``).
    reads: the tensor it is computed from: "block" (each block's output, (B, S, d)), or, through the
        model's observer, "attn_logits" ((B, H, S, S) scaled scores, masked entries -inf), "attn_probs"
        ((B, H, S, S) rows summing to 1) or "gate_score" (the gate's values).
    compute: that tensor -> a float (without autograd).
    mean / max: the model figures that are the mean / the max of it over the layers that show it ("": none):
        a ``stability.record.figures.Figure`` (direction, unit, meaning), added to the figure table when the
        probe is registered, or the name of one already there.
    """

    name: str
    reads: str
    compute: Callable[[torch.Tensor], float]
    mean: str | figures.Figure = ""
    max: str | figures.Figure = ""


READS = ("block", "attn_logits", "attn_probs", "gate_score")
LAYER_PROBES: dict[str, LayerProbe] = {}  # name -> probe; the model figures come out in this order


def register(probe: LayerProbe) -> LayerProbe:
    """Add a per-layer probe: every heavy-probe snapshot measures it from then on, its model figures reach
    the arm's ``final`` figures, the paired comparison, the merge check and MLflow."""
    if probe.name in LAYER_PROBES or probe.reads not in READS:
        raise ValueError(f"layer probe {probe.name!r}: expected a new name and reads in {READS} "
                         f"(got reads={probe.reads!r})")
    declared = {field: value for field, value in (("mean", probe.mean), ("max", probe.max))
                if isinstance(value, figures.Figure)}
    for entry in declared.values():   # the probe and its figures: one registration
        if figures.figure(entry.name) != entry:
            figures.add(entry)
    probe = dataclasses.replace(probe, **{field: entry.name for field, entry in declared.items()})
    for name in (probe.mean, probe.max):
        if name and figures.figure(name) is None:
            raise ValueError(f"layer probe {probe.name!r}: figure {name!r} is not in the figure table "
                             f"(stability.record.figures): add its direction and unit there first")
    LAYER_PROBES[probe.name] = probe
    return probe


for _probe in (
    LayerProbe("m_act", "block", layer_m_act, mean="m_act_mean", max="m_act_max"),
    LayerProbe("m_act_ratio", "block", layer_m_act_ratio),
    LayerProbe("f_attn", "attn_probs", layer_f_attn, mean="f_attn_mean"),
    LayerProbe("sink_rate", "attn_probs", layer_sink_rate, mean="sink_rate_mean"),
    LayerProbe("max_attn_logit", "attn_logits", max_attention_logit, max="max_attn_logit"),
    LayerProbe("gate_score", "gate_score", layer_gate_score, mean="gate_score_mean"),
):
    register(_probe)


def heavy_probes(model: nn.Module, tokens: torch.Tensor) -> dict:
    """All per-layer figures of ``model`` on one probe batch (B, S): every probe of ``LAYER_PROBES``.

    ``model`` is a ``GatedLM`` or a ``stability.model.build.WrappedLM``: the "block" probes from the outputs
    of ``model.blocks``, the attention ones through ``model.set_observer`` (the explicit attention
    path, or the eager probe attention of an HF model). Runs one forward (without autograd) with hooks, then
    removes them. A figure the model cannot show (attention of a module without an observer) is None.
    Returns {"layers": [per layer {probe name: value}], each probe's model figures, "logit_max",
    "log_z_mean", "linear_inputs": {Linear name: {"kurtosis", "inf_norm"} of its input}, "hooked": [the names
    of the modules it hooked: the blocks, then the Linears]}."""
    n_layers = len(model.blocks)
    layers = [{} for _ in range(n_layers)]
    linear_inputs: dict[str, dict[str, float]] = {}
    handles = []
    readers: dict[str, list[LayerProbe]] = {}
    for probe in LAYER_PROBES.values():
        readers.setdefault(probe.reads, []).append(probe)

    def observe(layer, name, tensor):
        for probe in readers.get(name, ()):
            layers[layer][probe.name] = probe.compute(tensor)

    def block_hook(index):
        def hook(_module, _inputs, output):
            observe(index, "block", output[0] if isinstance(output, tuple) else output)
        return hook

    def linear_hook(name):
        def hook(_module, inputs):
            x = inputs[0]
            linear_inputs[name] = {"kurtosis": kurtosis(x), "inf_norm": x.detach().float().abs().max().item()}
        return hook

    names = {module: name for name, module in model.named_modules()}
    hooked = []
    for index, block in enumerate(model.blocks):
        handles.append(block.register_forward_hook(block_hook(index)))
        hooked.append(names.get(block, f"blocks.{index}"))
    for name, module in probed_linears(model):
        handles.append(module.register_forward_pre_hook(linear_hook(name)))
        hooked.append(name)
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
    out: dict = {"layers": layers}
    for probe in LAYER_PROBES.values():
        values = [layer[probe.name] for layer in layers if probe.name in layer]
        if probe.mean:
            out[probe.mean] = sum(values) / len(values) if values else None
        if probe.max:
            out[probe.max] = max(values, default=None)
    out.update(logit_max=logit_max, log_z_mean=log_z, linear_inputs=linear_inputs, hooked=hooked)
    return out


def probed_linears(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of the Linears whose inputs the heavy probes measure: every nn.Linear."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
