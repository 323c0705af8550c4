"""Plain-PyTorch gated attention, written for reading rather than speed.

    Y = softmax(Q K^T * scale + causal_mask) V * sigmoid(G)

Every step runs in the dtype of the inputs (pass float64 tensors to get the
reference that the Triton kernel is tested against). The S x S score matrix is
materialised, so keep S small.

Shapes (B batch, H query heads, Hkv key/value heads, S tokens, D head dim):
    q: (B, H, S, D)    k, v: (B, Hkv, S, D) with H % Hkv == 0
    gate: None, (B, H, S, D) elementwise or (B, H, S, 1) headwise; these are
          LOGITS, the sigmoid is applied here.
Query head h reads key/value head h // (H // Hkv) (grouped-query attention).
"""

from __future__ import annotations

import math

import torch


def reference_gated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gate: torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """Return Y of shape (B, H, S, D) in the dtype of q. Differentiable by autograd."""
    n_heads, n_kv_heads, seq_len, head_dim = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)

    # Grouped-query attention: give every query head its own copy of its kv head.
    group = n_heads // n_kv_heads
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)

    scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, S, S)
    if causal:
        # Query i may look at keys 0..i only.
        future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = probs @ v  # (B, H, S, D), the ungated attention output O

    if gate is not None:
        out = out * torch.sigmoid(gate)  # a (B, H, S, 1) gate broadcasts over D
    return out
