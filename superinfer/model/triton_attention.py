"""Unified paged attention in Triton: decode and (chunked) prefill in one launch, reading the
block-first KV cache in place.

    kv_cache: (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)   # 0 = K, 1 = V

The step's query tokens are packed back to back (`query_start_loc`, as vLLM); sequence s
has its queries at positions seq_lens[s] - num_query_tokens .. seq_lens[s] - 1 and their
K/V is already in the cache. The semantics are those of `attention.paged_attention`.

One program handles one kv head and a tile of BLOCK_Q query tokens of one sequence, times
the query heads of that kv head's group: rows are flattened (row m = token m // group, head
m % group) into BLOCK_M = BLOCK_Q * group (+ padding) rows, so each K/V tile is loaded once
per group. The grid is (T // BLOCK_Q + S, Hkv); a program finds its sequence by a binary
search over `query_start_loc`, so the host does no per-token work. The key loop walks
TILE_N keys at a time through the block table with a FlashAttention-2 online softmax in
fp32; it starts at the block holding the first key the tile's queries see (a sliding
window's freed blocks, FREED_BLOCK, are never read) and ends at the tile's last query.

Triton is optional: this module imports without it, and the kernel is jitted on first use,
so TRITON_INTERPRET=1 (Triton's CPU interpreter, used by the tests) only needs to be set
before the first call.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is not a core dependency
    triton = tl = None


def is_available(device: torch.device | str) -> str | None:
    """None when the kernel can run on `device`, else why not."""
    if triton is None:
        return "triton is not installed"
    if torch.device(device).type == "cuda" or _interpreting():
        return None
    return "needs a CUDA device (or TRITON_INTERPRET=1)"


def unified_attention(
    q: Tensor,  # (T, H, D) packed queries
    kv_cache: Tensor,  # (num_blocks, num_layers, 2, block_size, Hkv, D)
    layer: int,
    query_start_loc: Tensor,  # (S + 1,) int32 cumulative query tokens, starting at 0
    seq_lens: Tensor,  # (S,) int32 tokens of each sequence, context and query
    block_tables: Tensor,  # (S, max_blocks) int32
    *,
    max_query_len: int,
    scale: float | None = None,
    window: int | None = None,
    softcap: float | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """Attention of the packed queries over their sequences' cached K/V -> (T, H, D).

    `window`: a query at p sees keys k with p - window < k <= p; `scale` multiplies q.k
    (default 1/sqrt(D)); `softcap`: scores become softcap * tanh(scores / softcap)."""
    reason = is_available(q.device)
    if reason is not None:
        raise RuntimeError(f"unified_attention: {reason}")
    _check(q, kv_cache, query_start_loc, seq_lens, block_tables)
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = kv_cache.shape[3], kv_cache.shape[4]
    out = torch.empty_like(q) if out is None else out
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    block_m, tile_n = _tile_sizes(group, max_query_len, block_size, head_dim_pad)
    block_q = block_m // group
    scale = head_dim**-0.5 if scale is None else scale
    interpret = _interpreting()
    cache = kv_cache[:, layer]  # (num_blocks, 2, bs, Hkv, D), strided
    grid = (num_tokens // block_q + num_seqs, num_kv_heads)
    _kernel(interpret)[grid](
        q, cache, cache[:, 1], out, query_start_loc, seq_lens, block_tables,
        num_seqs, scale, softcap or 1.0, window or 0,
        *q.stride(), cache.stride(0), cache.stride(2), cache.stride(3), cache.stride(4),
        *out.stride(), block_tables.stride(0),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad,
        GROUP=group, BLOCK_Q=block_q, BLOCK_M=block_m, TILE_N=tile_n, BLOCK_SIZE=block_size,
        USE_WINDOW=window is not None, USE_SOFTCAP=softcap is not None,
        DOT_FP32=interpret, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )  # fmt: skip
    return out


def _check(
    q: Tensor, kv_cache: Tensor, query_start_loc: Tensor, seq_lens: Tensor, block_tables: Tensor
) -> None:
    num_heads, head_dim = q.shape[1:]
    if kv_cache.dim() != 6 or kv_cache.shape[2] != 2 or kv_cache.shape[5] != head_dim:
        raise ValueError(f"kv_cache {tuple(kv_cache.shape)} does not fit q {tuple(q.shape)}")
    if num_heads % kv_cache.shape[4] or kv_cache.dtype != q.dtype:
        raise ValueError(f"q {q.dtype} x{num_heads} heads vs cache {kv_cache.dtype}")
    num_seqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_seqs + 1 or block_tables.shape[0] != num_seqs:
        raise ValueError("query_start_loc, seq_lens and block_tables disagree on the sequences")
    if block_tables.stride(1) != 1:
        raise ValueError("block_tables rows must be contiguous")


def _tile_sizes(
    group: int, max_query_len: int, block_size: int, head_dim_pad: int
) -> tuple[int, int]:
    """(BLOCK_M, TILE_N): query rows (tokens x group heads) and keys per step of the loop;
    both at least 16 for tl.dot.

    A decode program has one token's few rows and walks its whole context alone (a batch-1
    step of an 8-kv-head model runs 8 programs), so each loop step is a dependent chain of
    loads: 128 keys a step (64 at head_dim 256) took an H200 2.4x less time than 16 at a
    4,096-token context (`benchmarks/triton_decode_tiles.py`, docs/results/gpu/)."""
    rows = triton.next_power_of_2(max(1, max_query_len) * group)
    block_m = max(16, triton.next_power_of_2(group), min(rows, 64))
    if max_query_len <= 1:
        keys = min(128, 16384 // head_dim_pad)
    else:
        keys = 32
    return block_m, max(keys, triton.next_power_of_2(block_size))


def _interpreting() -> bool:
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4 reads TRITON_INTERPRET here
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


@functools.cache
def _kernel(interpret: bool):  # one per mode: interpreted or compiled
    """The kernel, jitted (or wrapped by the interpreter) on first use: triton reads
    TRITON_INTERPRET when it decorates, not when it launches."""
    return triton.jit(_unified_attention_kernel, do_not_specialize=["num_seqs", "window"])


def _unified_attention_kernel(
    q_ptr,  # (T, H, D)
    k_ptr,  # K of the layer: block b, token t, head h at b*s_blk + t*s_tok + h*s_head
    v_ptr,  # V of the layer, same strides
    out_ptr,  # (T, H, D)
    query_start_loc_ptr,  # (S + 1,)
    seq_lens_ptr,  # (S,)
    block_tables_ptr,  # (S, max_blocks)
    num_seqs,
    scale,
    softcap,
    window,
    stride_q_tok,
    stride_q_head,
    stride_q_dim,
    stride_blk,
    stride_tok,
    stride_head,
    stride_dim,
    stride_o_tok,
    stride_o_head,
    stride_o_dim,
    stride_table,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per kv head
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program: BLOCK_Q * GROUP, padded to a power of 2
    TILE_N: tl.constexpr,  # keys per loop step
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    USE_WINDOW: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    DOT_FP32: tl.constexpr,  # interpreter: dots in fp32
    DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    # the sequence whose tiles hold this one: sequence s's tiles start at qsl[s] // BLOCK_Q + s
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    num_queries = tl.load(query_start_loc_ptr + seq + 1) - q_start
    q_first = (tile - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # first query of the tile
    if q_first >= num_queries:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - num_queries

    rows = tl.arange(0, BLOCK_M)
    q_idx = q_first + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < num_queries)
    q_pos = context + q_idx  # (BLOCK_M,)
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q_offs = (q_start + q_idx)[:, None] * stride_q_tok + head[:, None] * stride_q_head
    q = tl.load(
        q_ptr + q_offs + dims[None, :] * stride_q_dim,
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )  # (BLOCK_M, D)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    key_end = tl.minimum(context + q_first + BLOCK_Q, seq_len)  # past the tile's last query
    key_start = 0
    if USE_WINDOW:  # the first key the tile's first query sees, from its block's start
        key_start = tl.maximum(context + q_first - window + 1, 0) // BLOCK_SIZE * BLOCK_SIZE
    table = block_tables_ptr + seq.to(tl.int64) * stride_table
    head_off = kv_head.to(tl.int64) * stride_head
    for start in range(key_start, key_end, TILE_N):
        keys = start + tl.arange(0, TILE_N)
        key_ok = keys < key_end
        block = tl.load(table + keys // BLOCK_SIZE, mask=key_ok, other=0).to(tl.int64)
        kv_offs = block * stride_blk + (keys % BLOCK_SIZE) * stride_tok + head_off  # (TILE_N,)
        k = tl.load(
            k_ptr + kv_offs[None, :] + dims[:, None] * stride_dim,
            mask=key_ok[None, :] & dim_ok[:, None],
            other=0.0,
        )  # (D, TILE_N)
        v = tl.load(
            v_ptr + kv_offs[:, None] + dims[None, :] * stride_dim,
            mask=key_ok[:, None] & dim_ok[None, :],
            other=0.0,
        )  # (TILE_N, D)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * scale  # (BLOCK_M, TILE_N) fp32
        if USE_SOFTCAP:  # tanh(x) = 2 / (1 + exp(-2x)) - 1
            s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
        s = s * 1.4426950408889634  # log2(e): exp2 from here on
        seen = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        if USE_WINDOW:
            seen = seen & (keys[None, :] > q_pos[:, None] - window)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_new = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows that saw no key yet
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    o_offs = (q_start + q_idx)[:, None] * stride_o_tok + head[:, None] * stride_o_head
    tl.store(
        out_ptr + o_offs + dims[None, :] * stride_o_dim,
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )
