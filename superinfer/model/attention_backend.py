"""The attention-backend seam: who runs paged attention for a step.

A backend builds its metadata once per step from the step's sequences (`SeqEntry`, read
from the plain `SchedulerOutput`) and then runs every layer's call,
`forward(q, k, v, kv_cache, layer, meta)`: write the step's K/V into their cache slots and
attend over the paged, block-first cache (`attention.py` gives the layout). The model only
calls `meta.attend(...)`, so layers never ask which device they are on.

- `reference`: gather each sequence's blocks and run SDPA (`attention.paged_attention`
  without its kernel). Runs everywhere; the oracle of the other backends' tests.
- `cpu`: the reference, with decode (and bfloat16 prefill, where the CPU has AVX-512
  BF16) through C kernels that read blocks in place (`cpu_attention.py`). Needs a CPU
  cache and a C compiler.
- `triton`: one Triton kernel for decode and (chunked) prefill that reads the cache in
  place (`triton_attention.py`). Needs triton and a CUDA device (or TRITON_INTERPRET=1).

`--attention-backend auto` takes the first that runs here (CPU: cpu, reference; CUDA:
triton, reference). A backend that cannot run is declined with a logged reason, never a
crash: a named one falls back to auto's choice.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from superinfer.model.attention import (
    AttentionMetadata,
    GatherWorkspace,
    SeqEntry,
    paged_attention,
    token_rows,
    write_kv,
)

logger = logging.getLogger(__name__)


class AttentionBackend(ABC):
    """Runs a step's attention: `build` once per step, `forward` once per layer."""

    name: ClassVar[str]

    def __init__(self, block_size: int, device: torch.device) -> None:
        self.block_size, self.device = block_size, torch.device(device)

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        """Why this backend cannot run on `device`; None when it can."""
        return None

    @abstractmethod
    def build(self, entries: Sequence[SeqEntry]) -> Any:
        """The step's metadata: positions, slot_blocks/slot_offsets (where each token's K/V
        goes), logits_indices (each sequence's last row) and whatever `forward` needs, as
        tensors on the device; its `attend` calls this backend's `forward`."""

    @abstractmethod
    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        kv_cache: Tensor,
        layer: int,
        meta: Any,
        *,
        window: int | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        """Cache k/v (T, Hkv, D) in `layer`, attend with q (T, H, D) -> (T, H, D): causal
        within each sequence, the last `window` positions only when set, `scale` on q.k
        (default 1/sqrt(D)), scores soft-capped by `softcap` when set."""


class ReferenceBackend(AttentionBackend):
    """Gather + SDPA: correct on every device, the oracle."""

    name = "reference"
    uses_kernel = False

    def __init__(self, block_size: int, device: torch.device) -> None:
        super().__init__(block_size, device)
        self.workspace = GatherWorkspace()  # one forward at a time per runner

    def build(self, entries: Sequence[SeqEntry]) -> AttentionMetadata:
        return AttentionMetadata.build(entries, self.block_size, self.device, backend=self)

    def forward(self, q, k, v, kv_cache, layer, meta, *, window=None, scale=None, softcap=None):
        return paged_attention(q, k, v, kv_cache, layer, meta, self.workspace, window=window,
                               scale=scale, softcap=softcap, use_kernel=self.uses_kernel)  # fmt: skip


class CpuBackend(ReferenceBackend):
    """Decode, and bfloat16 prefill where the CPU has AVX-512 BF16, through the C kernels
    reading blocks in place; the rest as the reference."""

    name = "cpu"
    uses_kernel = True

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        if torch.device(device).type != "cpu":
            return f"the C kernel runs on a CPU, not on {device}"
        from superinfer.model.cpu_attention import decode_kernel

        if decode_kernel() is None:
            return "the C kernel did not build (no compiler, or SUPERINFER_CPU_KERNELS=0)"
        return None


@dataclass
class TritonMetadata:
    """A step for the Triton kernel: per token where its K/V goes, per sequence its query
    rows, length and block table (int32, as the kernel reads them)."""

    positions: Tensor  # (T,)
    slot_blocks: Tensor  # (T,)
    slot_offsets: Tensor  # (T,)
    logits_indices: Tensor  # (S,)
    query_start_loc: Tensor  # (S + 1,) int32
    seq_lens: Tensor  # (S,) int32, context + query tokens
    block_tables: Tensor  # (S, max_blocks) int32; freed or padding entries are 0, never read
    max_query_len: int
    backend: TritonBackend

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    def attend(self, q, k, v, kv_cache, layer, *, window=None, scale=None, softcap=None):
        return self.backend.forward(q, k, v, kv_cache, layer, self, window=window,
                                    scale=scale, softcap=softcap)  # fmt: skip


class TritonBackend(AttentionBackend):
    """One Triton kernel for decode and chunked prefill, reading the cache in place."""

    name = "triton"

    @classmethod
    def unavailable_reason(cls, device: torch.device) -> str | None:
        from superinfer.model import triton_attention

        return triton_attention.is_available(torch.device(device))

    def build(self, entries: Sequence[SeqEntry]) -> TritonMetadata:
        return build_triton_metadata(entries, self.block_size, self.device, self)

    def forward(self, q, k, v, kv_cache, layer, meta, *, window=None, scale=None, softcap=None):
        from superinfer.model.triton_attention import unified_attention

        write_kv(kv_cache, layer, k, v, meta)
        return unified_attention(
            q, kv_cache, layer, meta.query_start_loc, meta.seq_lens, meta.block_tables,
            max_query_len=meta.max_query_len, scale=scale, window=window, softcap=softcap,
        )  # fmt: skip


def padded_block_tables(
    entries: Sequence[SeqEntry], block_size: int, width: int | None = None
) -> Tensor:
    """(S, width) int32 block tables on the host, as the Triton kernel reads them: each cut
    to the blocks its tokens use and padded with 0 (the longest sets the default width;
    CUDA graphs pass a fixed one). A freed entry (FREED_BLOCK, -1) becomes 0: it is out of
    every window, so never read."""
    counts = [-(-e.num_tokens // block_size) for e in entries]
    width = max(counts) if width is None else width
    rows = [[max(block, 0) for block in e.block_table[:n]] + [0] * (width - n)
            for e, n in zip(entries, counts)]  # fmt: skip
    return torch.tensor(rows, dtype=torch.int32)


def build_triton_metadata(
    entries: Sequence[SeqEntry], block_size: int, device: torch.device, backend: TritonBackend
) -> TritonMetadata:
    """`TritonMetadata` of `entries`, with its tensors on `device`."""
    per_token, logits_indices = token_rows(entries, block_size)
    tables = padded_block_tables(entries, block_size)
    counts = [e.num_query_tokens for e in entries]
    starts = torch.tensor([0, *counts], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seq_lens = torch.tensor([e.num_tokens for e in entries], dtype=torch.int32)
    on = [t.to(device, non_blocking=True) for t in (*per_token, logits_indices)]
    return TritonMetadata(*on, starts.to(device), seq_lens.to(device), tables.to(device),
                          max(counts), backend)  # fmt: skip


BACKENDS: dict[str, type[AttentionBackend]] = {
    backend.name: backend for backend in (CpuBackend, TritonBackend, ReferenceBackend)
}
AUTO_ORDER = {"cpu": ("cpu", "reference"), "cuda": ("triton", "reference")}


def select_backend(name: str, block_size: int, device: torch.device) -> AttentionBackend:
    """The backend `name` (`--attention-backend`) on `device`. `auto`: the first of
    `AUTO_ORDER` that runs here. A named backend that cannot run is declined with its
    reason in the log and auto's choice is used."""
    device = torch.device(device)
    if name != "auto" and name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: auto, {', '.join(BACKENDS)}")
    if name != "auto":
        reason = BACKENDS[name].unavailable_reason(device)
        if reason is None:
            return _chosen(BACKENDS[name], block_size, device, "asked for")
        logger.warning("attention backend %s declined: %s; choosing one as auto", name, reason)
    for candidate in AUTO_ORDER.get(device.type, ("reference",)):
        reason = BACKENDS[candidate].unavailable_reason(device)
        if reason is None:
            return _chosen(BACKENDS[candidate], block_size, device, "auto")
        logger.info("attention backend %s declined: %s", candidate, reason)
    return _chosen(ReferenceBackend, block_size, device, "auto")


def _chosen(
    backend: type[AttentionBackend], block_size: int, device: torch.device, how: str
) -> AttentionBackend:
    logger.info("attention backend: %s (%s, on %s)", backend.name, how, device)
    return backend(block_size, device)
