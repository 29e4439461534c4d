"""What the CPU and CUDA transfer engines share: modes, counters, errors, checks, copies."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import torch

from superinfer.core.kv.transfer import (  # noqa: F401 (stats re-exported)
    Direction,
    DirectionStats,
    TransferEngine,
    TransferSpec,
    TransferStats,
    merge_into_runs,
)
from superinfer.engine.kv_cache import KVCacheTiers

# "duplex": one lane per direction, one copy per run of consecutive blocks (DuplexKV).
# "naive": the ablation of vLLM v0's swap: one lane, one copy per (block, layer, K/V) piece.
MODES = ("duplex", "naive")

# copy(dst, src): copy a slice of a source view into the same-shaped destination slice
CopyFn = Callable[[Any, Any], None]


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown transfer mode {mode!r}, expected one of {MODES}")


class TransferError(RuntimeError):
    """A transfer failed inside the engine; raised in the caller, with the cause chained."""

    def __init__(self, spec: TransferSpec) -> None:
        super().__init__(
            f"KV transfer {spec.transfer_id} ({spec.direction.value}, "
            f"{spec.num_blocks} blocks) failed; the engine accepts no more transfers"
        )
        self.transfer_id = spec.transfer_id
        self.direction = spec.direction


class KVTransferEngine(TransferEngine):
    """A `TransferEngine` over the two tiers of a `KVCacheTiers`.

    Adds what the metrics and callers need on top of the core interface (whose
    `record_compute` the model runner calls after launching each forward): `synchronize`
    (a host-side wait), `stats`, and use as a context manager (closes on exit).

    Ordering: transfers of one direction run in submission order. In "duplex" mode the two
    directions run concurrently with no order between them, so the planner must not submit
    a transfer that touches blocks a pending transfer of the other direction writes, or
    writes blocks it reads (quarantine such blocks until `poll_finished` reports the copy).
    """

    # (source, destination) views of the tiers per direction, block-first like the tiers;
    # set by each engine to what its `_copy_one` copies between
    _views: dict[Direction, tuple[Any, Any]]

    def __init__(self, kv: KVCacheTiers, mode: str) -> None:
        check_mode(mode)
        self.kv = kv
        self.mode = mode

    @property
    @abstractmethod
    def stats(self) -> TransferStats:
        """A snapshot of the counters."""

    def synchronize(self, transfer_ids: Iterable[int] | None = None) -> None:
        """Block the calling thread until the transfers (all if None) have completed."""
        self.wait(transfer_ids)

    def __enter__(self) -> KVTransferEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:  # keep the exception already in flight
            exc.add_note(f"and closing the transfer engine failed: {close_error!r}")

    def _tiers(self, direction: Direction) -> tuple[torch.Tensor, torch.Tensor]:
        """(source, destination) tiers of `direction`."""
        if direction is Direction.D2H:
            return self.kv.device, self.kv.host
        return self.kv.host, self.kv.device

    def _validate(self, spec: TransferSpec) -> None:
        src, dst = self._tiers(spec.direction)
        _check_range(spec.src_blocks, src.shape[0], "source")
        _check_range(spec.dst_blocks, dst.shape[0], "destination")
        if len(set(spec.dst_blocks)) != len(spec.dst_blocks):
            raise ValueError(f"transfer {spec.transfer_id}: destination blocks repeat")

    def _copy(self, spec: TransferSpec) -> int:
        """Issue the copies of `spec` as the mode says; returns the number of copy calls."""
        src, dst = self._views[spec.direction]
        if self.mode == "naive":
            return copy_pieces(src, dst, spec, self._copy_one)
        return copy_runs(src, dst, spec, self._copy_one)

    @staticmethod
    @abstractmethod
    def _copy_one(dst: Any, src: Any) -> None:
        """Copy one slice of a source view into the same-shaped slice of a destination view."""


def _check_range(blocks: tuple[int, ...], num_blocks: int, side: str) -> None:
    # Slicing would not catch these: a negative start wraps, a run past the end shrinks
    # and the copy then broadcasts a one-block source over the whole destination run.
    if blocks and (min(blocks) < 0 or max(blocks) >= num_blocks):
        bad = next(block for block in blocks if not 0 <= block < num_blocks)
        raise IndexError(f"{side} block {bad} out of range [0, {num_blocks})")


def copy_runs(src: Any, dst: Any, spec: TransferSpec, copy: CopyFn) -> int:
    """One copy per run of blocks consecutive on both sides; returns the number of runs."""
    runs = merge_into_runs(spec.src_blocks, spec.dst_blocks)
    for run in runs:
        copy(
            dst[run.dst_start : run.dst_start + run.num_blocks],
            src[run.src_start : run.src_start + run.num_blocks],
        )
    return len(runs)


def copy_pieces(src: Any, dst: Any, spec: TransferSpec, copy: CopyFn) -> int:
    """One copy per (block, layer, K/V) piece, as a per-layer KV layout forces."""
    num_layers, num_kv = src.shape[1], src.shape[2]
    for src_block, dst_block in zip(spec.src_blocks, spec.dst_blocks):
        for layer in range(num_layers):
            for kv in range(num_kv):
                copy(dst[dst_block, layer, kv], src[src_block, layer, kv])
    return spec.num_blocks * num_layers * num_kv
