"""The held-out evaluation of a model: mean loss, perplexity and next-token accuracy."""

from __future__ import annotations

import math

import torch

from stability.model.lm import next_token_loss
from stability.precision import PrecisionPolicy


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, policy: PrecisionPolicy) -> dict[str, float]:
    """Held-out mean loss (nats/token), perplexity and next-token accuracy over fixed batches (x, y),
    each (batch, context), in the policy's format."""
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
