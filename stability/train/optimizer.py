"""The optimiser an arm trains with."""

from __future__ import annotations

import torch

from stability.config import RunConfig


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
