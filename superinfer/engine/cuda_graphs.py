"""CUDA graphs of decode steps: one captured forward per batch-size bucket.

A decode step of a small model is launch-bound: hundreds of small kernels whose launch
costs more than their work. Captured once at start-up and replayed, a step is one launch.
A graph replays fixed addresses and shapes, so the step's inputs live in static buffers
sized for the largest bucket: token ids, positions, KV slots, and the Triton backend's
per-sequence metadata with block tables of a fixed width (`max_blocks_per_seq`). A step of
B sequences runs the smallest bucket >= B; the padding rows repeat the last real row
(same token, position, slot and table), so they write the same K/V into the same slot as
it and read nothing else, and their outputs are dropped.

Capture runs the model on zeroed buffers, writing K/V into block 0: it must happen before
any request holds a block (the engine captures at start-up). Steps that are not decode-only,
or larger than the largest bucket, or whose tables are wider, run eagerly.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from superinfer.model.attention import SeqEntry, token_rows
from superinfer.model.attention_backend import TritonBackend, TritonMetadata, padded_block_tables

logger = logging.getLogger(__name__)

# as vLLM's defaults: small sizes one by one, then every 8, then every 16 (capped to the batch)
DEFAULT_BATCH_SIZES = (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))


def batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The buckets for an engine of `max_num_seqs`: the defaults up to it, and it."""
    sizes = [size for size in DEFAULT_BATCH_SIZES if size < max_num_seqs]
    return (*sizes, max_num_seqs)


class Replay(Protocol):
    def replay(self) -> Tensor: ...


class CudaGraphReplay:
    """`forward` captured in a CUDA graph; `replay` reruns it and returns its output buffer."""

    def __init__(self, forward: Callable[[], Tensor], pool: object) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = forward()

    def replay(self) -> Tensor:
        self.graph.replay()
        return self.output


class EagerReplay:
    """Runs `forward` on every replay: the same buffers and padding as a graph, without one
    (how the tests drive this module on a CPU)."""

    def __init__(self, forward: Callable[[], Tensor], pool: object = None) -> None:
        self.forward = forward

    def replay(self) -> Tensor:
        return self.forward()


class DecodeGraphs:
    """Captured decode forwards of `model` over `kv_cache`, one per batch size."""

    def __init__(
        self,
        model: nn.Module,
        kv_cache: Tensor,
        backend: TritonBackend,
        sizes: Sequence[int],
        max_blocks_per_seq: int,
    ) -> None:
        if not sizes:
            raise ValueError("no batch size to capture")
        self.model, self.kv_cache, self.backend = model, kv_cache, backend
        self.sizes = sorted(set(sizes))
        self.max_blocks_per_seq = max_blocks_per_seq
        max_batch, device = self.sizes[-1], kv_cache.device
        self._per_token = torch.zeros(4, max_batch, dtype=torch.long, device=device)
        self._query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self._seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)
        self._block_tables = torch.zeros(
            max_batch, max_blocks_per_seq, dtype=torch.int32, device=device
        )
        self._logits_indices = torch.arange(max_batch, device=device)
        self._replays: dict[int, Replay] = {}

    def capture(self, replay_type: type = CudaGraphReplay) -> dict[str, float]:
        """Capture every bucket, largest first so the smaller ones reuse its memory pool;
        returns the count, seconds taken and graph memory."""
        is_cuda = self.kv_cache.device.type == "cuda"
        pool = torch.cuda.graph_pool_handle() if is_cuda else None
        free_before = torch.cuda.mem_get_info(self.kv_cache.device)[0] if is_cuda else 0
        start = time.perf_counter()
        with torch.inference_mode():
            for size in reversed(self.sizes):
                forward = self._forward_of(size)
                forward()  # eager once first: lazy initialisation must not land in a graph
                if is_cuda:
                    torch.cuda.synchronize(self.kv_cache.device)
                self._replays[size] = replay_type(forward, pool)
        if is_cuda:
            torch.cuda.synchronize(self.kv_cache.device)
        free_after = torch.cuda.mem_get_info(self.kv_cache.device)[0] if is_cuda else 0
        return {"num_graphs": len(self._replays), "capture_s": time.perf_counter() - start,
                "graph_memory_bytes": max(0, free_before - free_after)}  # fmt: skip

    def can_run(self, entries: Sequence[SeqEntry]) -> bool:
        """Whether this step replays a graph: decode only, and fits a bucket."""
        if not self._replays or len(entries) > self.sizes[-1]:
            return False
        block_size = self.backend.block_size
        return all(
            e.num_query_tokens == 1 and -(-e.num_tokens // block_size) <= self.max_blocks_per_seq
            for e in entries
        )

    def run(
        self, entries: Sequence[SeqEntry], token_ids: Sequence[int]
    ) -> tuple[Tensor, TritonMetadata]:
        """Hidden states (S, C) of a decode step, and the metadata the sampler reads
        (`logits_indices` over those rows)."""
        num_seqs = len(entries)
        size = self.sizes[bisect.bisect_left(self.sizes, num_seqs)]
        padded = [*entries, *[entries[-1]] * (size - num_seqs)]
        ids = [*token_ids, *[token_ids[-1]] * (size - num_seqs)]
        per_token, _ = token_rows(padded, self.backend.block_size)
        tables = padded_block_tables(padded, self.backend.block_size, self.max_blocks_per_seq)
        host = torch.cat((torch.tensor([ids]), per_token))  # (4, size): ids, pos, block, offset
        self._per_token[:, :size].copy_(host, non_blocking=True)
        seq_lens = torch.tensor([e.num_tokens for e in padded], dtype=torch.int32)
        self._seq_lens[:size].copy_(seq_lens, non_blocking=True)
        self._block_tables[:size].copy_(tables, non_blocking=True)
        hidden = self._replays[size].replay()[:num_seqs].clone()  # the buffer is reused
        meta = self._metadata(size)
        meta.logits_indices = self._logits_indices[:num_seqs]
        return hidden, meta

    def _metadata(self, size: int) -> TritonMetadata:
        """The static buffers' first `size` rows as the Triton backend's metadata."""
        positions, slot_blocks, slot_offsets = self._per_token[1:, :size]
        return TritonMetadata(
            positions, slot_blocks, slot_offsets, self._logits_indices[:size],
            self._query_start_loc[: size + 1], self._seq_lens[:size], self._block_tables[:size],
            1, self.backend,
        )  # fmt: skip

    def _forward_of(self, size: int) -> Callable[[], Tensor]:
        meta, input_ids = self._metadata(size), self._per_token[0, :size]

        def forward() -> Tensor:
            return self.model(input_ids, meta.positions, self.kv_cache, meta)

        return forward
