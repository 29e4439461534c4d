"""Paged attention over a block-first KV cache, and the per-step metadata it needs.

The KV cache of the device tier is ONE tensor

    kv_cache: (num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim)   # 0 = K, 1 = V

so a block over all layers is one contiguous chunk. The tokens of one step are packed back
to back, sequence after sequence. Each layer first writes the K/V of every query token into
its slot, then attends:

- decode sequences (one query token) together, in ONE call per layer: with the cpu
  backend a C kernel reads their blocks in place (`cpu_attention.py`); in the reference,
  their blocks are gathered into a (B, kv_heads, max_len, head_dim) batch and padding is
  masked;
- prefill chunks (several query tokens) one call each, causal with an offset when part of
  the sequence is already cached; with the cpu backend and a bfloat16 cache a C kernel
  reads their keys in place (`csrc/paged_prefill.c`, CPUs with AVX-512 BF16), else their
  blocks are gathered for SDPA.

This module is the reference and cpu backends' attention (`paged_attention`) and the
metadata they build; the seam that picks a backend, and the Triton one, are in
`attention_backend.py`.

A sliding-window layer attends to the last `window` positions only (a key at k_pos is seen
from q_pos when q_pos - window < k_pos <= q_pos, as transformers): its metadata comes from
`AttentionMetadata.windowed(window)`, built once per step and window, and lists each
sequence's blocks from the first one a query of the step can see. Blocks before it are
never gathered nor read, so the KV manager may free them (when every layer is windowed):
their table entries are then placeholders (`superinfer.core.kv.FREED_BLOCK`). Logit soft-capping (Gemma 2)
runs attention in plain matmuls, since SDPA has no cap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from superinfer.model.cpu_attention import PagedDecodeKernel, decode_kernel


class StepMetadata(Protocol):
    """What the model reads of any backend's step metadata (`attention_backend.py`)."""

    positions: Tensor  # (T,) position of each token in its sequence
    slot_blocks: Tensor  # (T,) cache block that receives each token's K/V
    slot_offsets: Tensor  # (T,) offset inside that block
    logits_indices: Tensor  # (S,) row of each sequence's last token

    @property
    def num_tokens(self) -> int: ...

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Tensor, layer: int, *,
        window: int | None = None, scale: float | None = None, softcap: float | None = None,
    ) -> Tensor: ...  # fmt: skip


@dataclass(frozen=True)
class SeqEntry:
    """One sequence of a step, in packing order.

    Its query tokens sit at positions num_context_tokens .. num_tokens - 1; the KV of the
    first num_context_tokens is already cached. `block_table` covers at least num_tokens;
    entries out of every layer's window may be placeholders (FREED_BLOCK).
    """

    num_query_tokens: int
    num_context_tokens: int
    block_table: Sequence[int]

    @property
    def num_tokens(self) -> int:
        return self.num_context_tokens + self.num_query_tokens


@dataclass
class DecodeBatch:
    """The sequences of a step that have exactly one query token.

    Under a sliding window each sequence's table starts at the first block its query sees,
    and token counts are from that block's first position."""

    tokens: slice | Tensor  # their rows in the packed step (a slice when contiguous)
    block_ids: Tensor  # (B * max_blocks,) block tables, padded with block 0
    seq_lens: Tensor  # (B,) tokens of each sequence, the query token included
    mask: Tensor  # (B, 1, 1, max_blocks * block_size) True for keys to attend to
    key_starts: Tensor | None = None  # (B,) first key to attend to; None: all from 0
    _bias: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return self.mask.shape[0]

    @property
    def block_tables(self) -> Tensor:
        """(B, max_blocks) view of `block_ids`."""
        return self.block_ids.view(self.num_seqs, -1)

    def attn_bias(self, dtype: torch.dtype) -> Tensor:
        """`mask` as an additive bias (0 or -inf), made once per step rather than by
        scaled_dot_product_attention in every layer."""
        if self._bias is None or self._bias.dtype != dtype:
            bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device)
            self._bias = bias.masked_fill_(~self.mask, float("-inf"))
        return self._bias


@dataclass
class PrefillChunk:
    """A sequence with several query tokens. Without cached context (block_ids None) it
    attends causally to its own keys; otherwise to its gathered blocks under `mask`."""

    tokens: slice  # its rows in the packed step
    block_ids: Tensor | None  # (num_blocks,)
    mask: Tensor | None  # (num_query_tokens, num_blocks * block_size)
    num_context_tokens: int = 0  # position of the first query token
    # for the CPU prefill kernel, which reads every key in the cache: the sequence's blocks
    # from the one holding `first_position` on (int64)
    table: Tensor | None = None
    first_position: int = 0

    @property
    def num_query_tokens(self) -> int:
        return self.tokens.stop - self.tokens.start


@dataclass
class AttentionMetadata:
    """Everything the layers need to know about how a step's tokens are packed."""

    positions: Tensor  # (T,) position of each token in its sequence
    slot_blocks: Tensor  # (T,) cache block that receives each token's K/V
    slot_offsets: Tensor  # (T,) offset inside that block
    logits_indices: Tensor  # (S,) row of each sequence's last token
    decode: DecodeBatch | None
    prefills: list[PrefillChunk]
    _windows: dict[int, AttentionMetadata] = field(default_factory=dict, repr=False)
    _entries: Sequence[SeqEntry] = field(default=(), repr=False)
    _block_size: int = 1
    # who runs this step's attention (`attention_backend.py`); None: `paged_attention` with
    # the CPU kernel where it runs, as a metadata built by hand in a test or benchmark
    backend: Any = field(default=None, repr=False)
    _workspace: GatherWorkspace | None = field(default=None, repr=False)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        kv_cache: Tensor,
        layer: int,
        *,
        window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        """Cache k/v of the step's tokens in `layer` and attend (`paged_attention`'s
        contract), through this step's backend."""
        if self.backend is not None:
            return self.backend.forward(q, k, v, kv_cache, layer, self, window=window,
                                        scale=scale, softcap=softcap)  # fmt: skip
        if self._workspace is None:
            self._workspace = GatherWorkspace()
        return paged_attention(q, k, v, kv_cache, layer, self, self._workspace,
                               window=window, scale=scale, softcap=softcap)  # fmt: skip

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    def windowed(self, window: int | None) -> AttentionMetadata:
        """This step's metadata for a layer that sees only the last `window` positions."""
        if window is None:
            return self
        if window not in self._windows and all(e.num_tokens <= window for e in self._entries):
            self._windows[window] = self  # the window hides nothing in this step
        if window not in self._windows:
            entries, block_size, device = self._entries, self._block_size, self.positions.device
            starts = _token_starts(entries)
            self._windows[window] = replace(
                self, decode=_decode_batch(entries, starts, block_size, device, window),
                prefills=[_prefill_chunk(e, s, block_size, device, window)
                          for e, s in zip(entries, starts) if e.num_query_tokens > 1],
                _windows={},
            )  # fmt: skip
        return self._windows[window]

    @classmethod
    def build(
        cls,
        entries: Sequence[SeqEntry],
        block_size: int,
        device: torch.device | str,
        backend: Any = None,
    ) -> AttentionMetadata:
        """Metadata for `entries` packed in the given order, with tensors on `device`."""
        per_token, logits_indices = token_rows(entries, block_size)
        per_token, starts = per_token.to(device), _token_starts(entries)
        return cls(
            positions=per_token[0],
            slot_blocks=per_token[1],
            slot_offsets=per_token[2],
            logits_indices=logits_indices.to(device),
            decode=_decode_batch(entries, starts, block_size, device),
            prefills=[
                _prefill_chunk(e, s, block_size, device)
                for e, s in zip(entries, starts)
                if e.num_query_tokens > 1
            ],
            _entries=entries,
            _block_size=block_size,
            backend=backend,
        )


def token_rows(entries: Sequence[SeqEntry], block_size: int) -> tuple[Tensor, Tensor]:
    """On the host, for a step's packed tokens: (3, T) position, cache block and offset in
    the block of each token (where its K/V goes), and (S,) the row of each sequence's last
    token (whose logits are sampled). Checks the entries."""
    _check_entries(entries, block_size)
    positions = [p for e in entries for p in range(e.num_context_tokens, e.num_tokens)]
    blocks = [
        e.block_table[p // block_size]
        for e in entries
        for p in range(e.num_context_tokens, e.num_tokens)
    ]
    offsets = [p % block_size for p in positions]
    logits_indices = [s + e.num_query_tokens - 1 for s, e in zip(_token_starts(entries), entries)]
    return (torch.tensor([positions, blocks, offsets], dtype=torch.long),
            torch.tensor(logits_indices, dtype=torch.long))  # fmt: skip


def _check_entries(entries: Sequence[SeqEntry], block_size: int) -> None:
    if not entries:
        raise ValueError("a step needs at least one sequence")
    for e in entries:
        if e.num_query_tokens < 1 or e.num_context_tokens < 0:
            raise ValueError(f"bad token counts in {e}")
        if len(e.block_table) * block_size < e.num_tokens:
            raise ValueError(f"block table too short for {e.num_tokens} tokens: {e}")


def _token_starts(entries: Sequence[SeqEntry]) -> list[int]:
    starts, start = [], 0
    for e in entries:
        starts.append(start)
        start += e.num_query_tokens
    return starts


def _num_blocks(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def _first_block(query_pos: int, window: int | None, block_size: int) -> int:
    """The first block holding a key that the query at `query_pos` sees."""
    return 0 if window is None else max(0, query_pos - window + 1) // block_size


def _decode_batch(
    entries: Sequence[SeqEntry],
    starts: list[int],
    block_size: int,
    device: torch.device | str,
    window: int | None = None,
) -> DecodeBatch | None:
    rows = [i for i, e in enumerate(entries) if e.num_query_tokens == 1]
    if not rows:
        return None
    seqs = [entries[i] for i in rows]
    token_rows = [starts[i] for i in rows]
    # a window skips the blocks before the first one the query sees
    firsts = [_first_block(e.num_tokens - 1, window, block_size) * block_size for e in seqs]
    tables = [list(e.block_table[f // block_size :]) for e, f in zip(seqs, firsts)]
    max_blocks = max(_num_blocks(e.num_tokens - f, block_size) for e, f in zip(seqs, firsts))
    block_ids = [t[:max_blocks] + [0] * (max_blocks - len(t)) for t in tables]
    lengths = torch.tensor([e.num_tokens - f for e, f in zip(seqs, firsts)])
    keys = torch.arange(max_blocks * block_size)
    mask = keys < lengths.unsqueeze(1)  # (B, N)
    key_starts = None
    if window is not None and any(e.num_tokens > window for e in seqs):
        key_starts = torch.tensor([max(0, e.num_tokens - window) - f for e, f in zip(seqs, firsts)])
        mask &= keys >= key_starts.unsqueeze(1)
        key_starts = key_starts.to(device)
    contiguous = token_rows[-1] - token_rows[0] == len(token_rows) - 1
    tokens = (
        slice(token_rows[0], token_rows[-1] + 1)
        if contiguous
        else torch.tensor(token_rows, device=device)
    )
    return DecodeBatch(
        tokens=tokens,
        block_ids=torch.tensor(block_ids, dtype=torch.long).view(-1).to(device),
        seq_lens=lengths.to(device),
        mask=mask.view(len(seqs), 1, 1, -1).to(device),
        key_starts=key_starts,
    )


def _prefill_chunk(
    entry: SeqEntry,
    start: int,
    block_size: int,
    device: torch.device | str,
    window: int | None = None,
) -> PrefillChunk:
    tokens = slice(start, start + entry.num_query_tokens)
    query_pos = torch.arange(entry.num_context_tokens, entry.num_tokens).unsqueeze(1)
    first = _first_block(entry.num_context_tokens, window, block_size)
    num_blocks = _num_blocks(entry.num_tokens, block_size)
    block_ids = torch.tensor(entry.block_table[first:num_blocks], dtype=torch.long)
    table = {"table": block_ids.to(device), "first_position": first * block_size}
    if entry.num_context_tokens == 0:  # the chunk's own keys, from position 0
        if window is None or entry.num_tokens <= window:
            return PrefillChunk(tokens, None, None, **table)
        keys = torch.arange(entry.num_query_tokens)
        mask = (keys <= query_pos) & (keys > query_pos - window)  # (Tq, Tq)
        return PrefillChunk(tokens, None, mask.to(device), **table)
    keys = torch.arange(first * block_size, num_blocks * block_size)
    mask = keys <= query_pos  # (Tq, N) causal with offset
    if window is not None:
        mask &= keys > query_pos - window
    return PrefillChunk(tokens, table["table"], mask.to(device), entry.num_context_tokens, **table)


class GatherWorkspace:
    """Memory for gathered K/V blocks, reused by every layer and step (so one forward at a
    time per workspace). On CPU a fresh multi-MB tensor per layer costs page faults that
    take longer than the copy itself."""

    def __init__(self) -> None:
        self._buffer: Tensor | None = None

    def take(self, shape: tuple[int, ...], like: Tensor) -> tuple[Tensor, Tensor]:
        """Two uninitialised tensors of `shape` with the dtype and device of `like`."""
        numel = 2 * math.prod(shape)
        buffer = self._buffer
        if (
            buffer is None
            or buffer.numel() < numel
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            buffer = self._buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
        k, v = buffer[:numel].view(2, *shape).unbind(0)
        return k, v


def paged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_cache: Tensor,
    layer: int,
    meta: AttentionMetadata,
    workspace: GatherWorkspace | None = None,
    *,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    use_kernel: bool = True,
) -> Tensor:
    """Cache k/v of the step's tokens, then attend. q (T, H, D), k/v (T, Hkv, D) -> (T, H, D).

    `window`: attend to the last `window` positions only; `scale` multiplies q.k (default
    1/sqrt(D)); `softcap`: scores become softcap * tanh(scores / softcap); `use_kernel`:
    decode through the CPU kernel where it runs (False: gather + SDPA, the reference)."""
    kernel = decode_kernel() if use_kernel else None
    if kernel is not None and kernel.can_write(kv_cache, k, v):
        kernel.write_kv(kv_cache, layer, k, v, meta.slot_blocks, meta.slot_offsets)
    else:
        write_kv(kv_cache, layer, k, v, meta)
    workspace = workspace or GatherWorkspace()
    meta = meta.windowed(window)
    attend = Scores(scale, softcap)
    # the prefill kernel reads the cache as written above; it has no soft-capping
    prefill_kernel = kernel if attend.softcap is None and kv_cache.device.type == "cpu" else None
    parts = []
    for chunk in meta.prefills:
        o = _prefill_attention(
            q, k, v, kv_cache, layer, chunk, workspace, attend, prefill_kernel, window
        )
        parts.append((chunk.tokens, o))
    if meta.decode is not None:
        o = _decode_attention(q, kv_cache, layer, meta.decode, workspace, attend, use_kernel)
        parts.append((meta.decode.tokens, o))
    if len(parts) == 1:  # one group holds every token, in order
        return parts[0][1]
    out = q.new_empty(q.shape)
    for tokens, o in parts:
        out[tokens] = o
    return out


def write_kv(kv_cache: Tensor, layer: int, k: Tensor, v: Tensor, meta: StepMetadata) -> None:
    """Store k/v (T, Hkv, D) of each token in its cache slot of `layer`."""
    kv_cache[meta.slot_blocks, layer, :, meta.slot_offsets] = torch.stack((k, v), 1)


def _gather(
    kv_cache: Tensor, layer: int, block_ids: Tensor, num_seqs: int, workspace: GatherWorkspace
) -> tuple[Tensor, Tensor]:
    """K and V of the given blocks of `layer`, each as (B, Hkv, N, D)."""
    block_shape = kv_cache.shape[-3:]  # (bs, Hkv, D)
    k, v = workspace.take((block_ids.shape[0], *block_shape), kv_cache)  # (B * nb, bs, Hkv, D)
    torch.index_select(kv_cache[:, layer, 0], 0, block_ids, out=k)
    torch.index_select(kv_cache[:, layer, 1], 0, block_ids, out=v)
    k, v = (x.view(num_seqs, -1, *block_shape[1:]).transpose(1, 2) for x in (k, v))
    return k, v


@dataclass(frozen=True)
class Scores:
    """How q.k becomes attention weights: SDPA, or plain matmuls when soft-capped."""

    scale: float | None = None
    softcap: float | None = None

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q (B, H, Tq, D), k/v (B, Hkv, N, D), boolean mask (.., Tq, N) or None for causal
        over the chunk's own keys -> (B, H, Tq, D)."""
        if self.softcap is None:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scale,
                enable_gqa=q.shape[1] != k.shape[1])  # fmt: skip
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scale = self.scale or q.shape[-1] ** -0.5
        scores = torch.tanh((q @ k.transpose(-1, -2)) * (scale / self.softcap)) * self.softcap
        if mask is None:
            mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores.float(), -1).to(v.dtype) @ v


def _decode_attention(
    q: Tensor,
    kv_cache: Tensor,
    layer: int,
    batch: DecodeBatch,
    workspace: GatherWorkspace,
    attend: Scores,
    use_kernel: bool = True,
) -> Tensor:
    """One query token per sequence: (T, H, D) -> (B, H, D)."""
    plain = use_kernel and attend.softcap is None and kv_cache.device.type == "cpu"
    kernel = decode_kernel() if plain else None
    if kernel is not None and kernel.supports(kv_cache, q.shape[1]):
        return kernel(q[batch.tokens], kv_cache, layer, batch.block_tables, batch.seq_lens,
                      attend.scale, batch.key_starts)  # fmt: skip
    num_seqs, num_kv_heads, head_dim = batch.num_seqs, kv_cache.shape[-2], kv_cache.shape[-1]
    k, v = _gather(kv_cache, layer, batch.block_ids, num_seqs, workspace)  # (B, Hkv, N, D)
    # the query heads that share a kv head become that head's query rows: no k/v repeat
    q = q[batch.tokens].view(num_seqs, num_kv_heads, -1, head_dim)  # (B, Hkv, H/Hkv, D)
    if attend.softcap is None:
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=batch.attn_bias(q.dtype), scale=attend.scale
        )
    else:
        o = attend(q, k, v, batch.mask)
    return o.reshape(num_seqs, -1, head_dim)  # a copy only where SDPA returns another layout


def _prefill_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kv_cache: Tensor,
    layer: int,
    chunk: PrefillChunk,
    workspace: GatherWorkspace,
    attend: Scores,
    kernel: PagedDecodeKernel | None = None,
    window: int | None = None,
) -> Tensor:
    """Several query tokens of one sequence: (T, H, D) -> (Tq, H, D). With `kernel`, its
    prefill reads the keys in the cache where it runs."""
    if kernel is not None and chunk.table is not None:
        o = kernel.prefill(q[chunk.tokens], kv_cache, layer, chunk.table, chunk.first_position,
                           chunk.num_context_tokens, window, attend.scale)  # fmt: skip
        if o is not None:
            return o
    q = q[chunk.tokens].transpose(0, 1).unsqueeze(0)  # (1, H, Tq, D)
    if chunk.block_ids is None:  # no cached context: the chunk's own keys suffice
        k = k[chunk.tokens].transpose(0, 1).unsqueeze(0)  # (1, Hkv, Tq, D)
        v = v[chunk.tokens].transpose(0, 1).unsqueeze(0)
    else:
        k, v = _gather(kv_cache, layer, chunk.block_ids, 1, workspace)  # (1, Hkv, N, D)
    o = attend(q, k, v, chunk.mask)
    return o.squeeze(0).transpose(0, 1)  # (Tq, H, D)
