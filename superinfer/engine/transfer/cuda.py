"""Transfer engine for a CUDA device tier and a pinned host tier: CUDA streams as copy lanes.

Nothing here touches CUDA at import time; streams and events are created by the engine.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from superinfer.core.kv.transfer import Direction, TransferSpec
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer.base import KVTransferEngine, TransferStats


@dataclass
class _InFlight:
    spec: TransferSpec
    start: torch.cuda.Event
    done: torch.cuda.Event
    num_copy_calls: int


class CudaTransferEngine(KVTransferEngine):
    """Copies between a CUDA device tier and a pinned host tier on side streams.

    "duplex": one non-blocking stream per direction, one `copy_(non_blocking=True)` per run
    of consecutive blocks. "naive": one stream for both directions, one copy per (block,
    layer, K/V) piece.

    Ordering against compute:
    - `record_compute()` after launching each forward records an event on the compute
      stream; every D2H transfer submitted afterwards waits (on the GPU) for the latest
      such event, so write-back of blocks written by step k starts after step k's forward.
      Before the first `record_compute`, a D2H transfer waits for all work queued on the
      caller's current stream at submit time.
    - H2D transfers wait for nothing: the planner gives them device blocks that no
      in-flight forward or pending D2H copy uses.
    - `wait(ids)` is stream-ordered (see there); `synchronize(ids)` blocks the host.

    Not thread-safe: call it from the thread that drives the model runner. CUDA errors are
    raised by the call that observes them (`submit`, `poll_finished`, `synchronize`).
    """

    def __init__(self, kv: KVCacheTiers, mode: str = "duplex") -> None:
        super().__init__(kv, mode)
        if not kv.device.is_cuda:
            raise ValueError(f"the device tier must be on CUDA, got {kv.device.device}")
        if not kv.host.is_pinned():
            warnings.warn("host KV tier is not pinned: copies will not overlap", stacklevel=2)
        self._device = kv.device.device
        self._streams = self._create_streams()
        self._views = {Direction.D2H: (kv.device, kv.host), Direction.H2D: (kv.host, kv.device)}
        self._compute_event: torch.cuda.Event | None = None
        self._in_flight: dict[int, _InFlight] = {}
        self._finished: list[int] = []
        self._stats = TransferStats()
        self._closed = False

    def _create_streams(self) -> dict[Direction, torch.cuda.Stream]:
        if self.mode == "naive":
            stream = torch.cuda.Stream(self._device)
            return {Direction.D2H: stream, Direction.H2D: stream}
        return {d: torch.cuda.Stream(self._device) for d in Direction}

    @property
    def stats(self) -> TransferStats:
        return self._stats.copy()

    @staticmethod
    def _copy_one(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)  # on the current stream: the lane's

    def record_compute(self, forward_end: object | None = None) -> None:
        """Record the end of the forward just launched on the stream `forward_end` (default:
        the current stream)."""
        stream = forward_end if forward_end is not None else torch.cuda.current_stream(self._device)
        event = torch.cuda.Event()
        event.record(stream)
        self._compute_event = event

    def submit(self, spec: TransferSpec) -> None:
        """Enqueue the copies of `spec` on its direction's stream; the host does not wait."""
        if self._closed:
            raise RuntimeError("the transfer engine is closed")
        self._validate(spec)
        if spec.transfer_id in self._in_flight:
            raise ValueError(f"transfer {spec.transfer_id} is already pending")
        stream = self._streams[spec.direction]
        if spec.direction is Direction.D2H:
            self._order_after_compute(stream)
        start = torch.cuda.Event(enable_timing=True)
        done = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            num_copy_calls = self._copy(spec)
            done.record(stream)
        self._in_flight[spec.transfer_id] = _InFlight(spec, start, done, num_copy_calls)

    def poll_finished(self) -> list[int]:
        """Ids whose copies have completed on the GPU since the last poll (never blocks)."""
        for transfer_id, flight in list(self._in_flight.items()):
            if flight.done.query():
                self._complete(transfer_id)
        finished, self._finished = self._finished, []
        return finished

    def wait(self, transfer_ids: Iterable[int] | None = None) -> None:
        """Make the caller's current stream wait for the transfers; the host does not block.

        Every kernel or copy queued on the current stream after this call (e.g. the forward
        that reads swapped-in blocks, or writes into blocks a D2H copy still reads) runs
        after the transfers have completed. Ids not pending are ignored. The transfers are
        reported by `poll_finished` once they have actually completed, which may be a
        later poll than the next one; use `synchronize` to block the host.
        """
        current = torch.cuda.current_stream(self._device)
        if transfer_ids is None:
            for stream in self._unique_streams():
                current.wait_stream(stream)
            return
        for flight in self._select(transfer_ids):
            current.wait_event(flight.done)

    def synchronize(self, transfer_ids: Iterable[int] | None = None) -> None:
        """Block the host until the transfers (all if None) have completed.

        They are reported by the next `poll_finished`.
        """
        for flight in self._select(transfer_ids):
            flight.done.synchronize()
            self._complete(flight.spec.transfer_id)

    def close(self) -> None:
        """Wait for every queued copy; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.synchronize()

    def _order_after_compute(self, stream: torch.cuda.Stream) -> None:
        if self._compute_event is not None:
            stream.wait_event(self._compute_event)
        else:
            stream.wait_stream(torch.cuda.current_stream(self._device))

    def _select(self, transfer_ids: Iterable[int] | None) -> list[_InFlight]:
        if transfer_ids is None:
            return list(self._in_flight.values())
        return [self._in_flight[i] for i in transfer_ids if i in self._in_flight]

    def _unique_streams(self) -> list[torch.cuda.Stream]:
        return list({id(stream): stream for stream in self._streams.values()}.values())

    def _complete(self, transfer_id: int) -> None:
        flight = self._in_flight.pop(transfer_id)
        seconds = flight.start.elapsed_time(flight.done) / 1e3
        self._stats.record(flight.spec, self.kv.bytes_per_block, flight.num_copy_calls, seconds)
        self._finished.append(transfer_id)
