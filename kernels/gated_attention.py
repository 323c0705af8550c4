"""Fused gated attention in Triton, forward and backward.

    Y = softmax(Q K^T * scale + causal_mask) V * sigmoid(G)

Shapes (B batch, H query heads, Hkv key/value heads, S tokens, D head dim):
    q            (B, H, S, D)
    k, v         (B, Hkv, S, D), H % Hkv == 0; query head h reads kv head h // (H // Hkv)
    gate         None, (B, H, S, D) elementwise or (B, H, S, 1) headwise; LOGITS
    returns Y    (B, H, S, D), dtype of q

How it works
------------
Forward (`_attn_fwd`): one program per (block of BLOCK_M queries, batch*head). It
streams key/value blocks with the online softmax (running max m, running sum l, fp32
accumulator), so the S x S score matrix never exists. Exponentials are base 2: the
logits are multiplied by scale * log2(e) once, and exp2 is used throughout. In the
epilogue the ungated output O = acc / l is multiplied by sigmoid(G) and stored as Y.
The per-row log-sum-exp is stored in fp32 in LOG2 units (lse2 = lse / ln 2).

Backward: with s = sigmoid(G),
    dO = dY * s                            (gradient reaching the attention output)
    dG = dY * O * s * (1 - s)              (elementwise; headwise sums this over D)
    delta = rowsum(dO * O)                 (softmax backward's row correction)
    dS = P * (dO V^T - delta)   dQ = scale dS K   dK = scale dS^T Q   dV = P^T dO
`_bwd_preprocess` computes dO, dG and delta in one pass; `_attn_bwd_dkdv` (one program
per key block and kv head, looping over every query head of its group, so GQA needs no
atomics) and `_attn_bwd_dq` (one program per query block and query head) recompute P
from Q, K and the saved lse.

Choices
-------
* What the backward saves: q, k, v, gate, O (the UNGATED output, dtype of q) and lse2.
  O is written by the forward next to Y when a gradient is needed, so the backward never
  forms O as Y / s (s can be ~1e-13) and dG keeps full relative accuracy. Y is not saved.
  In the ungated case O is Y and is written once. (1 - s) is computed as sigmoid(-G), which
  stays accurate when s is close to 1. Nothing ever divides by sigmoid(G).
* Non-contiguous inputs are read through their strides, never copied; the model's
  `x.view(B, S, H, D).transpose(1, 2)` costs nothing. Y (and O) are allocated in
  (B, S, H, D) memory order and returned as a (B, H, S, D) view, like SDPA does, so
  `y.transpose(1, 2).reshape(B, S, H * D)` is free.
* CPU tensors: if CUDA is not available, TRITON_INTERPRET is unset and triton is not yet
  imported when this module is imported, it sets TRITON_INTERPRET=1 so the kernels run in the
  Triton interpreter on CPU (slow; meant for tests). CPU tensors while the kernels were
  compiled for the GPU raise a ValueError. If triton is not installed, the package's
  `gated_attention` raises RuntimeError.
* The interpreter cannot do bf16 arithmetic, so there every loaded tile is converted to
  fp32 right after the load (UPCAST). On the GPU fp16/bf16 tiles go to tl.dot directly with
  fp32 accumulation; fp32 inputs use exact fp32 dots (input_precision="ieee"), not TF32.
* Head dims: SUPPORTED_HEAD_DIMS. D = 96 is padded to a 128-wide block with masks.
"""

import contextlib
import math
import os
import sys

import torch

# Must happen before triton is imported: triton reads TRITON_INTERPRET when it decorates a
# @triton.jit function, its own tl.* helpers included. If triton was imported earlier, it is
# too late to switch (kernels and tl.* helpers would disagree), so it is left alone.
if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"

import triton
import triton.language as tl

SUPPORTED_HEAD_DIMS = (16, 32, 64, 96, 128, 256)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634  # log2(e): exp(x) == exp2(x * LOG2E)

# --------------------------------------------------------------------------------------
# Shared tile helpers
# --------------------------------------------------------------------------------------


@triton.jit
def _load_tile(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr, UPCAST: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; masked rows (>= n_rows) and padded columns read as 0."""
    if CHECK_ROWS:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    if UPCAST:  # Triton interpreter: no bf16 arithmetic, compute everything in fp32
        x = x.to(tl.float32)
    return x


@triton.jit
def _sigmoid(x):
    """sigmoid of an fp32 tile; exp(-x) overflowing to inf for x << 0 gives exactly 0."""
    return 1.0 / (1.0 + tl.exp(-x))


# --------------------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------------------


@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_base, v_base, sk_s, sk_d, sv_s, sv_d,
               rows, offs_n, offs_d, lo, hi, seq_len, qk_scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr, MASKED: tl.constexpr, UPCAST: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    """Online softmax over key blocks [lo, hi). MASKED: apply the key-tail and causal masks."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_base + cols[:, None] * sk_s + offs_d[None, :] * sk_d, cols, seq_len, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        v = _load_tile(v_base + cols[:, None] * sv_s + offs_d[None, :] * sv_d, cols, seq_len, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # log2 units
        if MASKED:
            keep = cols[None, :] < seq_len
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            s = tl.where(keep, s, float("-inf"))
        # Every row sees key 0 in its first block, so m_new is finite from the first step on.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales what was accumulated under the old max
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, G, Y, O, LSE,
              sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
              sg_b, sg_h, sg_s, sg_d, sy_b, sy_h, sy_s, sy_d,
              n_heads, group, seq_len, qk_scale, seq_bucket,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, GATE: tl.constexpr, STORE_O: tl.constexpr, UPCAST: tl.constexpr,
              DOT_PRECISION: tl.constexpr):
    """Grid (cdiv(S, BLOCK_M), B * H). GATE: 0 none, 1 elementwise, 2 headwise.
    Y and O share strides sy_*. LSE is (B * H, S) fp32 in log2 units. seq_bucket: autotune key only."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    hk = h // group
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_tile(Q + b * sq_b + h * sq_h + rows[:, None] * sq_s + offs_d[None, :] * sq_d,
                   rows, seq_len, offs_d, HEAD_DIM, BLOCK_D, True, UPCAST)
    k_base = K + b * sk_b + hk * sk_h
    v_base = V + b * sv_b + hk * sv_h

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Key blocks left of the diagonal (causal) or fully inside S (non-causal) need no mask;
    # the rest (diagonal blocks, the ragged tail) do.
    if CAUSAL:
        n_full = start_m
        n_end = tl.minimum(start_m + BLOCK_M, seq_len)
    else:
        n_full = (seq_len // BLOCK_N) * BLOCK_N
        n_end = seq_len
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, sk_s, sk_d, sv_s, sv_d,
                               rows, offs_n, offs_d, 0, n_full, seq_len, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, False, UPCAST, DOT_PRECISION)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, sk_s, sk_d, sv_s, sv_d,
                               rows, offs_n, offs_d, n_full, n_end, seq_len, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, UPCAST, DOT_PRECISION)

    # Epilogue: normalise, store lse (+ O for the backward), gate, store Y.
    o = acc / l_i[:, None]
    row_ok = rows < seq_len
    tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    tl.store(LSE + pid_bh.to(tl.int64) * seq_len + rows, m_i + tl.log2(l_i), mask=row_ok)
    out_offs = b * sy_b + h * sy_h + rows[:, None] * sy_s + offs_d[None, :] * sy_d
    if STORE_O:
        tl.store(O + out_offs, o.to(O.dtype.element_ty), mask=tile_ok)
    if GATE == 1:
        g = tl.load(G + b * sg_b + h * sg_h + rows[:, None] * sg_s + offs_d[None, :] * sg_d,
                    mask=tile_ok, other=0.0)
        o = o * _sigmoid(g.to(tl.float32))
    elif GATE == 2:
        g = tl.load(G + b * sg_b + h * sg_h + rows * sg_s, mask=row_ok, other=0.0)
        o = o * _sigmoid(g.to(tl.float32))[:, None]
    tl.store(Y + out_offs, o.to(Y.dtype.element_ty), mask=tile_ok)


# --------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------


@triton.jit
def _bwd_preprocess(DY, O, G, DO, DG, DELTA,
                    sdy_b, sdy_h, sdy_s, sdy_d, so_b, so_h, so_s, so_d,
                    sg_b, sg_h, sg_s, sg_d, sdo_b, sdo_h, sdo_s, sdo_d, sdg_b, sdg_h, sdg_s, sdg_d,
                    n_heads, seq_len,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    GATE: tl.constexpr):
    """Grid (cdiv(S, BLOCK_M), B * H). Writes delta = rowsum(dO * O) (fp32, (B * H, S)),
    and when gated dO = dY * s (dtype of q) and dG. Ungated: dO is dY itself, nothing written."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < seq_len
    tile_ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)

    dy = tl.load(DY + b * sdy_b + h * sdy_h + rows[:, None] * sdy_s + offs_d[None, :] * sdy_d,
                 mask=tile_ok, other=0.0).to(tl.float32)
    o = tl.load(O + b * so_b + h * so_h + rows[:, None] * so_s + offs_d[None, :] * so_d,
                mask=tile_ok, other=0.0).to(tl.float32)
    do_offs = b * sdo_b + h * sdo_h + rows[:, None] * sdo_s + offs_d[None, :] * sdo_d
    if GATE == 0:
        delta = tl.sum(dy * o, 1)
    elif GATE == 1:
        g = tl.load(G + b * sg_b + h * sg_h + rows[:, None] * sg_s + offs_d[None, :] * sg_d,
                    mask=tile_ok, other=0.0).to(tl.float32)
        s = _sigmoid(g)
        do = (dy * s).to(DO.dtype.element_ty)
        tl.store(DO + do_offs, do, mask=tile_ok)
        delta = tl.sum(do.to(tl.float32) * o, 1)  # with the rounded dO the main kernels use
        dg = dy * o * s * _sigmoid(-g)  # s * (1 - s), accurate at both ends
        tl.store(DG + b * sdg_b + h * sdg_h + rows[:, None] * sdg_s + offs_d[None, :] * sdg_d,
                 dg.to(DG.dtype.element_ty), mask=tile_ok)
    else:
        g = tl.load(G + b * sg_b + h * sg_h + rows * sg_s, mask=row_ok, other=0.0).to(tl.float32)
        s = _sigmoid(g)
        do = (dy * s[:, None]).to(DO.dtype.element_ty)
        tl.store(DO + do_offs, do, mask=tile_ok)
        delta = tl.sum(do.to(tl.float32) * o, 1)
        dg = tl.sum(dy * o, 1) * s * _sigmoid(-g)
        tl.store(DG + b * sdg_b + h * sdg_h + rows * sdg_s, dg.to(DG.dtype.element_ty), mask=row_ok)
    tl.store(DELTA + pid_bh.to(tl.int64) * seq_len + rows, delta, mask=row_ok)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, sq_s, sq_d, sdo_s, sdo_d, lse_base, delta_base,
                    cols, offs_m, offs_d, lo, hi, seq_len, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                    CAUSAL: tl.constexpr, MASKED: tl.constexpr, UPCAST: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [lo, hi), working transposed:
    every (BLOCK_N, BLOCK_M) tile below is indexed [key, query]."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        q = _load_tile(q_base + rows[:, None] * sq_s + offs_d[None, :] * sq_d, rows, seq_len, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        do = _load_tile(do_base + rows[:, None] * sdo_s + offs_d[None, :] * sdo_d, rows, seq_len, offs_d,
                        HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        if MASKED:
            lse = tl.load(lse_base + rows, mask=rows < seq_len, other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < seq_len, other=0.0)
        else:
            lse = tl.load(lse_base + rows)
            delta = tl.load(delta_base + rows)
        p_t = tl.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale - lse[None, :])
        if MASKED:  # exact zeros, so padded query rows cannot leak into the sums over queries
            keep = rows[None, :] < seq_len
            if CAUSAL:
                keep = keep & (rows[None, :] >= cols[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, acc=dv, input_precision=DOT_PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, acc=dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                   sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                   sdo_b, sdo_h, sdo_s, sdo_d, sdk_b, sdk_h, sdk_s, sdk_d, sdv_b, sdv_h, sdv_s, sdv_d,
                   n_heads, n_kv_heads, group, seq_len, qk_scale, sm_scale, seq_bucket,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Grid (cdiv(S, BLOCK_N), B * Hkv). dK, dV of one key block, summed over the `group`
    query heads that share this kv head."""
    tl.static_assert(BLOCK_N % BLOCK_M == 0)
    pid_n = tl.program_id(0)
    pid_bhk = tl.program_id(1)
    b = (pid_bhk // n_kv_heads).to(tl.int64)
    hk = (pid_bhk % n_kv_heads).to(tl.int64)
    start_n = pid_n * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load_tile(K + b * sk_b + hk * sk_h + cols[:, None] * sk_s + offs_d[None, :] * sk_d,
                   cols, seq_len, offs_d, HEAD_DIM, BLOCK_D, True, UPCAST)
    v = _load_tile(V + b * sv_b + hk * sv_h + cols[:, None] * sv_s + offs_d[None, :] * sv_d,
                   cols, seq_len, offs_d, HEAD_DIM, BLOCK_D, True, UPCAST)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # Query blocks: causal ones before this key block see none of it (skipped); the rest are one loop, every
    # block masked (the causal and the ragged-tail mask; on a block that needs neither they keep every value, so
    # the sums are those of unmasked blocks). One loop, not a masked diagonal loop, an unmasked middle and a
    # masked tail as in the forward and dQ: three loops carrying the dK and dV accumulators keep more registers
    # live, and every config with 64 or more keys per block spilled on sm_90 (docs/kernel.md, the compile table).
    m_lo = start_n if CAUSAL else 0
    for j in range(group):
        h = hk * group + j
        q_base = Q + b * sq_b + h * sq_h
        do_base = DO + b * sdo_b + h * sdo_h
        lse_base = LSE + (b * n_heads + h) * seq_len
        delta_base = DELTA + (b * n_heads + h) * seq_len
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, sq_s, sq_d, sdo_s, sdo_d,
                                 lse_base, delta_base, cols, offs_m, offs_d, m_lo, seq_len,
                                 seq_len, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, CAUSAL, True,
                                 UPCAST, DOT_PRECISION)

    tile_ok = (cols[:, None] < seq_len) & (offs_d[None, :] < HEAD_DIM)
    dk = dk * sm_scale
    tl.store(DK + b * sdk_b + hk * sdk_h + cols[:, None] * sdk_s + offs_d[None, :] * sdk_d,
             dk.to(DK.dtype.element_ty), mask=tile_ok)
    tl.store(DV + b * sdv_b + hk * sdv_h + cols[:, None] * sdv_s + offs_d[None, :] * sdv_d,
             dv.to(DV.dtype.element_ty), mask=tile_ok)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, sk_s, sk_d, sv_s, sv_d,
                  rows, offs_n, offs_d, lo, hi, seq_len, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, MASKED: tl.constexpr, UPCAST: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi)."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _load_tile(k_base + cols[:, None] * sk_s + offs_d[None, :] * sk_d, cols, seq_len, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        v = _load_tile(v_base + cols[:, None] * sv_s + offs_d[None, :] * sv_d, cols, seq_len, offs_d,
                       HEAD_DIM, BLOCK_D, MASKED, UPCAST)
        p = tl.exp2(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale - lse[:, None])
        if MASKED:  # exact zeros, so padded keys cannot leak into the sum over keys
            keep = cols[None, :] < seq_len
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, acc=dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                 sdo_b, sdo_h, sdo_s, sdo_d, sdq_b, sdq_h, sdq_s, sdq_d,
                 n_heads, group, seq_len, qk_scale, sm_scale, seq_bucket,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 CAUSAL: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Grid (cdiv(S, BLOCK_M), B * H). dQ of one query block."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    hk = h // group
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < seq_len

    q = _load_tile(Q + b * sq_b + h * sq_h + rows[:, None] * sq_s + offs_d[None, :] * sq_d,
                   rows, seq_len, offs_d, HEAD_DIM, BLOCK_D, True, UPCAST)
    do = _load_tile(DO + b * sdo_b + h * sdo_h + rows[:, None] * sdo_s + offs_d[None, :] * sdo_d,
                    rows, seq_len, offs_d, HEAD_DIM, BLOCK_D, True, UPCAST)
    lse = tl.load(LSE + pid_bh.to(tl.int64) * seq_len + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * seq_len + rows, mask=row_ok, other=0.0)
    k_base = K + b * sk_b + hk * sk_h
    v_base = V + b * sv_b + hk * sv_h
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    if CAUSAL:
        n_full = start_m
        n_end = tl.minimum(start_m + BLOCK_M, seq_len)
    else:
        n_full = (seq_len // BLOCK_N) * BLOCK_N
        n_end = seq_len
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, sk_s, sk_d, sv_s, sv_d,
                       rows, offs_n, offs_d, 0, n_full, seq_len, qk_scale,
                       HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, False, UPCAST, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, sk_s, sk_d, sv_s, sv_d,
                       rows, offs_n, offs_d, n_full, n_end, seq_len, qk_scale,
                       HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, UPCAST, DOT_PRECISION)

    dq = dq * sm_scale
    tl.store(DQ + b * sdq_b + h * sdq_h + rows[:, None] * sdq_s + offs_d[None, :] * sdq_d,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM))


# --------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------

try:
    from triton.runtime.interpreter import InterpretedFunction as _InterpretedFunction
except ImportError:  # pragma: no cover - very old triton
    _InterpretedFunction = ()
INTERPRETED = isinstance(_attn_fwd, _InterpretedFunction)
# TRITON_INTERPRET set after triton was imported: our kernels are interpreted, triton's own
# @jit helpers (tl.zeros, tl.sigmoid, ...) are not, and every launch would fail.
_INTERPRETER_MISMATCH = INTERPRETED != isinstance(getattr(tl.standard, "sigmoid", _attn_fwd), _InterpretedFunction)

# Interpreter (CPU tests): fixed (BLOCK_M, BLOCK_N), no autotuning. Big blocks keep the
# interpreter fast; tests shrink them to push many blocks through tiny shapes.
INTERPRETER_BLOCKS = {"fwd": (64, 64), "dkdv": (64, 64), "dq": (64, 64)}
_PRE_BLOCK_M = 64
PREPROCESS_ELEMENTS = 2048   # values of one preprocess tile on the GPU: rows x BLOCK_D, so no head dim spills


def preprocess_rows(block_d: int) -> int:
    """Rows of one preprocess program on the GPU (4 warps): 2048 / BLOCK_D, at most 64. 64 rows spill with triton
    3.9.0 (bf16, elementwise gate, compiled on the CPU by ``validation.kernel_compile``): a 128-wide tile on sm_80
    and sm_100, a 256-wide one on sm_80, sm_90 and sm_100; the rows kept are in docs/kernel.md's table. The
    interpreter keeps _PRE_BLOCK_M."""
    return min(_PRE_BLOCK_M, PREPROCESS_ELEMENTS // block_d)


def _configs(entries):
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in entries]


# (BLOCK_M queries, BLOCK_N keys, num_warps, num_stages) per target (compute capability: 80 Ampere, 90 Hopper,
# 100 Blackwell) and tier ("fast": fp16 / bf16 with D <= 128; "big": D = 256 or fp32 tiles). Each list holds
# configs that compile for that target without spilling a register, within its shared memory, for every dtype,
# gate mode and head dim of the tier, under each triton version the table holds: 3.6.0 (the oldest the package
# accepts, the GPU runners' version) and 3.9.0; one list for both, so nothing here depends on the triton
# installed. The last of each fast list is the smallest. On sm_90 the dK/dV configs with 64 or more keys per
# block compile to wgmma (the rest of its list to mma.sync). The evidence is the table in
# docs/kernel.md (every compile: reports/kernel-compile.md), made on the CPU by ``python -m
# validation.compile_kernels``; tests/test_kernel_compile.py keeps lists and table in step. The configs tried and
# left out (they spilled under either version, did not compile within the time limit, or compiled to a kernel
# that traps) are in the table too.
# forward and dq: BLOCK_M % BLOCK_N == 0; dkdv: BLOCK_N % BLOCK_M == 0
GPU_CONFIGS = {
    80: {
        ("fwd", "fast"): [(64, 64, 8, 2), (64, 32, 4, 3), (64, 32, 4, 2), (32, 32, 4, 2)],
        ("fwd", "big"): [(32, 16, 4, 2), (16, 16, 4, 1)],
        ("dkdv", "fast"): [(32, 64, 8, 2), (32, 32, 4, 2), (16, 32, 4, 1)],
        ("dkdv", "big"): [(16, 16, 8, 2), (16, 16, 8, 1), (16, 16, 4, 1)],
        ("dq", "fast"): [(128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 3), (32, 32, 4, 2), (32, 32, 4, 1)],
        ("dq", "big"): [(32, 32, 8, 1), (32, 16, 4, 2), (32, 16, 4, 1), (16, 16, 4, 1)],
    },
    90: {
        ("fwd", "fast"): [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 64, 8, 2), (32, 32, 4, 2)],
        ("fwd", "big"): [(32, 16, 8, 2), (32, 16, 8, 1), (16, 16, 4, 1)],
        ("dkdv", "fast"): [(16, 128, 8, 2), (32, 64, 8, 3), (32, 64, 8, 2), (16, 64, 4, 2), (32, 32, 4, 2), (16, 32, 4, 2)],
        ("dkdv", "big"): [(16, 32, 8, 2), (16, 16, 8, 2), (16, 16, 4, 1)],
        ("dq", "fast"): [(128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 8, 2), (64, 32, 4, 3), (32, 32, 4, 1)],
        ("dq", "big"): [(32, 16, 4, 2), (16, 16, 4, 1)],
    },
    100: {
        ("fwd", "fast"): [(128, 64, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (32, 32, 4, 2)],
        ("fwd", "big"): [(32, 16, 8, 2), (32, 16, 8, 1), (16, 16, 8, 1)],
        ("dkdv", "fast"): [(16, 64, 8, 2), (32, 32, 4, 2), (16, 32, 4, 2)],
        ("dkdv", "big"): [(16, 16, 4, 2), (16, 16, 4, 1)],
        ("dq", "fast"): [(128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 8, 2), (64, 32, 4, 3), (32, 32, 4, 1)],
        ("dq", "big"): [(32, 16, 4, 2), (16, 16, 4, 1)],
    },
}
GPU_TARGETS = tuple(sorted(GPU_CONFIGS))
_KERNELS = {"fwd": _attn_fwd, "dkdv": _attn_bwd_dkdv, "dq": _attn_bwd_dq}
_TUNED = {}


def tier(block_d: int, dtype: torch.dtype) -> str:
    """The config list a launch draws from: "big" for D > 128 or fp32 tiles, else "fast"."""
    return "big" if block_d > 128 or dtype == torch.float32 else "fast"


def target_of(capability: tuple[int, int]) -> int:
    """The target whose lists a device of compute capability (major, minor) uses: the highest of GPU_TARGETS
    at or below it (sm_86 and sm_89 take sm_80's; a config over their 99 KB of shared memory per block is
    skipped by the autotuner). ValueError below sm_80."""
    number = 10 * capability[0] + capability[1]
    below = [target for target in GPU_TARGETS if target <= number]
    if not below:
        raise ValueError(f"compute capability {capability[0]}.{capability[1]} is below sm_{GPU_TARGETS[0]}, the "
                         "oldest target the kernel has configs for")
    return max(below)


def _kernel(name, block_d, dtype, device):
    """(kernel, block kwargs): the raw kernel with fixed blocks under the interpreter, else an
    autotuned wrapper (built on first use per target) that picks the blocks itself from the lists of the
    device's target (``target_of`` its compute capability)."""
    if INTERPRETED:
        block_m, block_n = INTERPRETER_BLOCKS[name]
        return _KERNELS[name], {"BLOCK_M": block_m, "BLOCK_N": block_n}
    key = (name, tier(block_d, dtype), target_of(torch.cuda.get_device_capability(device)))
    if key not in _TUNED:
        tuned_on = ["seq_bucket", "HEAD_DIM", "CAUSAL", "DOT_PRECISION"] + (["GATE", "STORE_O"] if name == "fwd" else [])
        configs = _configs(GPU_CONFIGS[key[2]][key[:2]])
        _TUNED[key] = triton.autotune(configs=configs, key=tuned_on)(_KERNELS[name])
    return _TUNED[key], {}


def tuned_configs() -> dict[str, dict[str, str]]:
    """The blocks the autotuner chose in this process: {"fwd/fast/sm_90": {autotune key: config}, ...}. Two
    processes that chose different blocks for a shape sum in a different order (their outputs differ
    in the last bits); this is what to compare (``validation/gpu_check.py`` prints it)."""
    return {f"{name}/{kind}/sm_{target}": {str(key): str(config) for key, config in getattr(tuned, "cache", {}).items()}
            for (name, kind, target), tuned in _TUNED.items()}


# --------------------------------------------------------------------------------------
# Buffers (with an optional poison fill for tests)
# --------------------------------------------------------------------------------------

_poison_value = None


@contextlib.contextmanager
def poison_outputs(value=float("nan")):
    """Testing aid: inside this context every buffer the kernels write (Y, O, lse, dO, delta,
    dQ, dK, dV, dG) starts filled with `value`, so an element a kernel forgets to write shows."""
    global _poison_value
    previous, _poison_value = _poison_value, value
    try:
        yield
    finally:
        _poison_value = previous


def _new(shape, dtype, device):
    t = torch.empty(shape, dtype=dtype, device=device)
    if _poison_value is not None:
        t.fill_(_poison_value)
    return t


# --------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------


def _validate(q, k, v, gate, causal, scale):
    """Raise TypeError/ValueError naming the bad value; return the scale as a float."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seq, head_dim), got shape {tuple(t.shape)}")
    if gate is not None and not isinstance(gate, torch.Tensor):
        raise TypeError(f"gate must be None or a torch.Tensor, got {type(gate).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")

    named = [("q", q), ("k", k), ("v", v)] + ([("gate", gate)] if gate is not None else [])
    for name, t in named:
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has dtype {q.dtype}; all inputs must match")
        if t.device != q.device:
            raise ValueError(f"{name} is on device {t.device} but q is on {q.device}; all inputs must match")
    if _INTERPRETER_MISMATCH:
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton had been imported, so the Triton interpreter is "
            "half-enabled; set TRITON_INTERPRET=1 in the environment before starting Python")
    if q.device.type == "cpu" and not INTERPRETED:
        raise ValueError(
            f"q is on device {q.device}, but the Triton kernels were compiled for the GPU; move the tensors "
            "to CUDA, or set TRITON_INTERPRET=1 before triton and stability.kernels are imported, or use "
            "reference_gated_attention")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q is on device {q.device}; expected a cuda device")

    batch, n_heads, seq_len, head_dim = q.shape
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {head_dim} (q.shape[-1]) is not supported; expected one of {SUPPORTED_HEAD_DIMS}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    n_kv_heads = k.shape[1]
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq_len, head_dim):
        raise ValueError(
            f"k/v shape {tuple(k.shape)} does not match q shape {tuple(q.shape)}; expected "
            f"({batch}, Hkv, {seq_len}, {head_dim})")
    if n_kv_heads == 0 or n_heads % n_kv_heads != 0:
        raise ValueError(f"number of kv heads {n_kv_heads} must divide number of query heads {n_heads}")
    if gate is not None and tuple(gate.shape) not in ((batch, n_heads, seq_len, head_dim),
                                                      (batch, n_heads, seq_len, 1)):
        raise ValueError(
            f"gate has shape {tuple(gate.shape)}; expected ({batch}, {n_heads}, {seq_len}, {head_dim}) "
            f"(elementwise) or ({batch}, {n_heads}, {seq_len}, 1) (headwise)")

    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float or None, got {scale!r}")
    return float(scale)


# --------------------------------------------------------------------------------------
# Launchers
# --------------------------------------------------------------------------------------


def _gate_mode(gate, head_dim):
    if gate is None:
        return 0
    return 1 if gate.shape[-1] == head_dim else 2


def _common(q):
    """Constexpr / scalar arguments shared by all kernels."""
    head_dim, seq_len = q.shape[3], q.shape[2]
    consts = {
        "HEAD_DIM": head_dim,
        "BLOCK_D": max(16, triton.next_power_of_2(head_dim)),
        "UPCAST": INTERPRETED,
        "DOT_PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
    }
    return consts, max(128, triton.next_power_of_2(seq_len))


def _forward(q, k, v, gate, causal, scale, store_o):
    """Returns (Y, O or None, lse2). Y, O: (B, H, S, D) views of (B, S, H, D) memory."""
    batch, n_heads, seq_len, head_dim = q.shape
    y = _new((batch, seq_len, n_heads, head_dim), q.dtype, q.device).transpose(1, 2)
    o = _new((batch, seq_len, n_heads, head_dim), q.dtype, q.device).transpose(1, 2) if store_o else None
    lse = _new((batch, n_heads, seq_len), torch.float32, q.device)
    if q.numel() == 0:
        return y, o, lse
    consts, bucket = _common(q)
    g = gate if gate is not None else q  # dummy pointer when ungated, never read
    sg = gate.stride() if gate is not None else (0, 0, 0, 0)
    grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), batch * n_heads)
    kernel, blocks = _kernel("fwd", consts["BLOCK_D"], q.dtype, q.device)
    kernel[grid](
        q, k, v, g, y, o if store_o else y, lse,
        *q.stride(), *k.stride(), *v.stride(), *sg, *y.stride(),
        n_heads, n_heads // k.shape[1], seq_len, scale * LOG2E, bucket,
        CAUSAL=causal, GATE=_gate_mode(gate, head_dim), STORE_O=store_o, **consts, **blocks)
    return y, o, lse


def _backward(dy, q, k, v, gate, o, lse, causal, scale):
    """Returns (dq, dk, dv, dgate or None)."""
    batch, n_heads, seq_len, head_dim = q.shape
    n_kv_heads = k.shape[1]
    dq = _new(q.shape, q.dtype, q.device)
    dk = _new(k.shape, k.dtype, k.device)
    dv = _new(v.shape, v.dtype, v.device)
    dg = _new(gate.shape, gate.dtype, gate.device) if gate is not None else None
    if q.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_(), dg.zero_() if dg is not None else None
    consts, bucket = _common(q)
    delta = _new((batch, n_heads, seq_len), torch.float32, q.device)
    # Gated: dO = dY * sigmoid(G) gets its own buffer; ungated: dO is dY, read in place.
    do = _new((batch, n_heads, seq_len, head_dim), q.dtype, q.device) if gate is not None else dy
    g, sg = (gate, gate.stride()) if gate is not None else (q, (0, 0, 0, 0))
    dg_arg, sdg = (dg, dg.stride()) if dg is not None else (delta, (0, 0, 0, 0))
    pre_rows = _PRE_BLOCK_M if INTERPRETED else preprocess_rows(consts["BLOCK_D"])
    _bwd_preprocess[(triton.cdiv(seq_len, pre_rows), batch * n_heads)](
        dy, o, g, do, dg_arg, delta,
        *dy.stride(), *o.stride(), *sg, *do.stride(), *sdg,
        n_heads, seq_len,
        HEAD_DIM=head_dim, BLOCK_D=consts["BLOCK_D"], BLOCK_M=pre_rows, GATE=_gate_mode(gate, head_dim))

    qk_scale, group = scale * LOG2E, n_heads // n_kv_heads
    grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_N"]), batch * n_kv_heads)
    kernel, blocks = _kernel("dkdv", consts["BLOCK_D"], q.dtype, q.device)
    kernel[grid](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        n_heads, n_kv_heads, group, seq_len, qk_scale, scale, bucket,
        CAUSAL=causal, **consts, **blocks)
    grid = lambda meta: (triton.cdiv(seq_len, meta["BLOCK_M"]), batch * n_heads)
    kernel, blocks = _kernel("dq", consts["BLOCK_D"], q.dtype, q.device)
    kernel[grid](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        n_heads, group, seq_len, qk_scale, scale, bucket,
        CAUSAL=causal, **consts, **blocks)
    return dq, dk, dv, dg


# --------------------------------------------------------------------------------------
# Autograd and the public entry point
# --------------------------------------------------------------------------------------


def device_guard(tensor: torch.Tensor):
    """Launch on the tensor's GPU, not on the current one: ``torch.cuda.device(tensor.device)`` for a CUDA
    tensor (a process whose tensors live on cuda:1 while cuda:0 is current would launch there
    otherwise); nothing to guard for a CPU tensor (the interpreter)."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


class GatedAttentionFunction(torch.autograd.Function):
    """autograd Function: apply(q, k, v, gate, causal, scale) -> Y. gate may be None;
    scale may be None (1 / sqrt(D)). Double backward is not supported."""

    @staticmethod
    def forward(ctx, q, k, v, gate, causal, scale):
        scale = _validate(q, k, v, gate, causal, scale)
        needs_grad = any(ctx.needs_input_grad[:4])
        store_o = needs_grad and gate is not None  # ungated: O is Y
        with device_guard(q):
            y, o, lse = _forward(q, k, v, gate, causal, scale, store_o)
        if needs_grad:
            ctx.save_for_backward(q, k, v, gate, o if gate is not None else y, lse)
        ctx.causal, ctx.scale = causal, scale
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        q, k, v, gate, o, lse = ctx.saved_tensors
        with device_guard(q):
            dq, dk, dv, dg = _backward(dy, q, k, v, gate, o, lse, ctx.causal, ctx.scale)
        return dq, dk, dv, dg, None, None


def gated_attention(q, k, v, gate=None, causal=True, scale=None):
    """Fused causal (or not) attention with a sigmoid output gate.

    q (B, H, S, D); k, v (B, Hkv, S, D) with H % Hkv == 0; gate None, (B, H, S, D) or
    (B, H, S, 1) logits; scale defaults to 1 / sqrt(D). Returns Y (B, H, S, D), dtype of q,
    as a view of (B, S, H, D) memory. Same contract as
    `F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
    * torch.sigmoid(gate)`.
    """
    return GatedAttentionFunction.apply(q, k, v, gate, causal, scale)
