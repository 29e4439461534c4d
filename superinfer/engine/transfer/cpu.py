"""Transfer engine for CPU tensors: worker threads as copy lanes.

Each lane copies with `numpy.copyto` on zero-copy byte views of the tiers: a plain
single-threaded memcpy that releases the GIL, so the two lanes and the caller run at the
same time. Not `torch.Tensor.copy_`: from a non-main thread each `copy_` of a block opens
an OpenMP parallel region whose start-up costs about as much as copying a 360 KiB block
(measured on a 2-core VM: 40% of a plain copy's bandwidth with `copy_`, 78% with
`copyto`). On a CPU both
lanes share one memory bus: duplex overlaps the directions, it does not double bandwidth.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np
import torch

from superinfer.core.kv.transfer import Direction, TransferSpec
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer.base import KVTransferEngine, TransferError, TransferStats


class _Lane:
    """One worker thread that executes transfers in submission (FIFO) order."""

    def __init__(self, name: str, execute: Callable[[TransferSpec], None]) -> None:
        self._queue: queue.SimpleQueue[tuple[TransferSpec, threading.Event | None] | None] = (
            queue.SimpleQueue()
        )
        self._execute = execute
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, spec: TransferSpec | None, fence: threading.Event | None = None) -> None:
        """Queue `spec`, to start once `fence` (if any) is set; None stops the lane after
        everything queued before it."""
        self._queue.put(None if spec is None else (spec, fence))

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            spec, fence = item
            if fence is not None:
                fence.wait()
            self._execute(spec)


class CpuTransferEngine(KVTransferEngine):
    """Copies between two CPU tiers on worker threads.

    "duplex": one lane (thread) per direction, one copy per run of consecutive blocks.
    "naive": one lane for both directions, one copy per (block, layer, K/V) piece.

    Thread-safe. The first failed copy puts the engine in a failed state: that transfer
    and every one queued after it never complete, and `submit`, `poll_finished` and `wait`
    raise `TransferError` (cause chained) from then on. `close` drains the queued
    transfers, stops the threads, and raises the error if no call has reported it yet.
    """

    def __init__(self, kv: KVCacheTiers, mode: str = "duplex") -> None:
        super().__init__(kv, mode)
        if kv.device.device.type != "cpu":
            raise ValueError(f"CpuTransferEngine needs CPU tiers, got {kv.device.device}")
        self._cond = threading.Condition()
        self._pending: set[int] = set()
        self._finished: list[int] = []
        self._stats = TransferStats()
        self._failure: tuple[TransferSpec, Exception] | None = None
        self._failure_reported = False
        self._closed = False
        device, host = _byte_view(kv.device), _byte_view(kv.host)
        self._views = {Direction.D2H: (device, host), Direction.H2D: (host, device)}
        self._lanes = self._start_lanes()
        self._compute_fence: threading.Event | None = None

    @staticmethod
    def _copy_one(dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def _start_lanes(self) -> dict[Direction, _Lane]:
        if self.mode == "naive":
            lane = _Lane("kv-transfer", self._execute)
            return {Direction.D2H: lane, Direction.H2D: lane}
        return {d: _Lane(f"kv-transfer-{d.value}", self._execute) for d in Direction}

    @property
    def stats(self) -> TransferStats:
        with self._cond:
            return self._stats.copy()

    def submit(self, spec: TransferSpec) -> None:
        """Queue `spec` on its direction's lane; raises at once if its block ids are invalid."""
        self._validate(spec)
        with self._cond:
            if self._closed:
                raise RuntimeError("the transfer engine is closed")
            self._raise_failure()
            if spec.transfer_id in self._pending:
                raise ValueError(f"transfer {spec.transfer_id} is already pending")
            self._pending.add(spec.transfer_id)
            fence = self._compute_fence if spec.direction is Direction.D2H else None
            self._lanes[spec.direction].put(spec, fence)

    def record_compute(self, forward_end: object | None = None) -> None:
        """`forward_end` is a threading.Event the model runner sets when the forward it is
        about to run in another thread has finished; device->host copies submitted from now
        on start only after it is set. None: compute is synchronous, nothing to wait for."""
        if forward_end is not None and not isinstance(forward_end, threading.Event):
            raise TypeError("on the CPU, record_compute takes a threading.Event (or None)")
        self._compute_fence = forward_end

    def poll_finished(self) -> list[int]:
        with self._cond:
            self._raise_failure()
            finished, self._finished = self._finished, []
        return finished

    def wait(self, transfer_ids: Iterable[int] | None = None) -> None:
        """Block until the transfers have completed; ids not pending return at once."""
        with self._cond:
            ids = set(self._pending if transfer_ids is None else transfer_ids)
            self._cond.wait_for(lambda: self._failure is not None or not ids & self._pending)
            self._raise_failure()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            lanes = list({id(lane): lane for lane in self._lanes.values()}.values())
            for lane in lanes:
                lane.put(None)
        for lane in lanes:
            lane.join()
        with self._cond:
            if not self._failure_reported:
                self._raise_failure()

    def _execute(self, spec: TransferSpec) -> None:
        """Runs on a lane thread."""
        if self._failure is not None:  # failed engine: drop what is still queued
            return
        start = time.perf_counter()
        try:
            num_copy_calls = self._copy(spec)
        except Exception as error:
            self._fail(spec, error)
            return
        seconds = time.perf_counter() - start
        with self._cond:
            self._stats.record(spec, self.kv.bytes_per_block, num_copy_calls, seconds)
            self._pending.discard(spec.transfer_id)
            self._finished.append(spec.transfer_id)
            self._cond.notify_all()

    def _fail(self, spec: TransferSpec, error: Exception) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = (spec, error)
            self._cond.notify_all()

    def _raise_failure(self) -> None:
        """Raise the stored failure, if any (caller holds the lock)."""
        if self._failure is None:
            return
        self._failure_reported = True
        spec, cause = self._failure
        raise TransferError(spec) from cause


def _byte_view(tier: torch.Tensor) -> np.ndarray:
    """The tier's memory as a uint8 array of the same block-first shape (last dim in bytes)."""
    return tier.view(torch.uint8).numpy()
