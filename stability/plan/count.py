"""What one training run costs, counted on the meta device: no GPU, no weights, nothing trained.

    cost = model_cost(run.model, optimizer="adamw", dtype="bf16", batch=32)
    cost.train_flops_per_token   fwd + bwd, every matrix product (FLOPs per token)
    cost.forward_flops_per_token the forward alone (the probes and the held-out evaluation)
    cost.parameters, cost.memory_bytes (peak of one run: weights, gradients, optimiser state, activations)

The model is built on ``torch.device("meta")`` (shapes only) and one training step of ``batch`` sequences
of ``model.context`` tokens runs under ``torch.utils.flop_counter.FlopCounterMode``, which counts the
matrix products (linear layers, the attention's Q K^T and P V) a step computes: the FLOP count of every
training step of that model, whatever it runs on. The attention is counted through the PyTorch path
(``model.backend="torch"``: the fused Triton kernel does the same products, and runs only on a GPU); its
products are counted over the whole S x S score matrix, as the usual model-FLOP count does (the causal
kernel skips the masked half, so a measured utilisation against this count can exceed what the GPU did).

Memory of one run: 4 bytes per parameter for the fp32 weights and 4 for their gradients, the optimiser's
state (AdamW 8 bytes per parameter, AdamW8bit 2), and the activations autograd saves for the backward,
summed over the distinct tensors saved during the meta step, less the parameters and the (B, H, S, S)
attention probabilities of the PyTorch math path (a fused or flash kernel keeps only its output and the
per-row log-sum-exp); counted in fp32 and scaled to the bytes the training format keeps
(``Format.activation_bytes``: 2 under bf16 and fp16 autocast). An estimate: ``validation/gpu_check.py``
measures a real step's peak.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from stability import config as cfg

OPTIMIZER_STATE_BYTES = {"adamw": 8, "adamw8bit": 2}   # per parameter


@dataclass(frozen=True)
class ModelCost:
    """The counted cost of one model: FLOPs per token of a training step and of a forward, parameters, and the
    peak memory of one training run at the batch it was counted for (bytes)."""

    train_flops_per_token: float
    forward_flops_per_token: float
    parameters: int
    memory_bytes: int


def model_cost(model: cfg.ModelConfig, optimizer: str, dtype: str, batch: int) -> ModelCost:
    """The cost of ``model`` trained with ``optimizer`` in training format ``dtype`` at ``batch`` sequences a
    step (see the module docstring)."""
    from stability.precision.formats import format_class

    train, forward, parameters, saved = _count(model, batch)
    per_token = batch * model.context
    state = OPTIMIZER_STATE_BYTES.get(optimizer, 8)
    activations = saved * format_class(dtype).activation_bytes / 4
    return ModelCost(train_flops_per_token=train / per_token, forward_flops_per_token=forward / per_token,
                     parameters=parameters, memory_bytes=int(parameters * (8 + state) + activations))


@functools.cache
def _count(model: cfg.ModelConfig, batch: int) -> tuple[float, float, int, int]:
    """(FLOPs of a training step, FLOPs of its forward, parameters, bytes of the activations saved for the backward
    in fp32) of ``model`` at ``batch`` sequences, on the meta device. Cached: the runs of a sweep share one count."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from stability.model.build import build_model

    model_config = dataclasses.replace(model, backend="torch")
    with torch.device("meta"):
        built = build_model(model_config, seed=0)
    tokens = torch.zeros(batch, model_config.context, dtype=torch.long, device="meta")
    parameters = {p.untyped_storage()._cdata for p in built.parameters()}
    saved: dict[int, int] = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        square = tensor.dim() >= 2 and tensor.shape[-1] == tensor.shape[-2] == model_config.context
        if storage._cdata not in parameters and not square:
            saved[storage._cdata] = max(saved.get(storage._cdata, 0), storage.nbytes())
        return tensor

    with FlopCounterMode(display=False) as forward, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logits = built(tokens)
    with FlopCounterMode(display=False) as backward:
        logits.float().mean().backward()
    return (forward.get_total_flops() + backward.get_total_flops(), forward.get_total_flops(),
            sum(p.numel() for p in built.parameters()), sum(saved.values()))


def formula_flops_per_token(model: cfg.ModelConfig, matmul_parameters: int) -> float:
    """The usual count of a training step per token: 6 N (N the parameters of the matrix products: every
    linear weight, and the embedding table where the head shares it) plus the attention's 12 L S d (Q K^T
    and P V over the whole S x S scores, forward and backward; Chowdhery et al. 2022, PaLM, appendix B)."""
    attention = 12 * model.n_layers * model.context * model.n_heads * (model.head_dim or model.d_model // model.n_heads)
    return 6 * matmul_parameters + attention
