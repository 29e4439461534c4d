"""A `TransferEngine` whose copies take predicted time on a modelled host link.

Each transfer occupies a lane from `start` to `start + duration`:

    start     = max(submit time, lane free, [D2H only] end of the forward in flight)
    duration  = copy calls x copy overhead + bytes / link bandwidth

Copy calls: "duplex" mode (block-first layout) issues one copy per run of blocks
consecutive on both sides; "naive" mode (per-layer layout, the vLLM v0 ablation) one per
(block, layer, K/V) piece. Lanes: "duplex" mode on a full-duplex link has one lane per
direction; a half-duplex link, or "naive" mode, has one lane for both. D2H copies wait for
the forward in flight, as the real engines fence them (`record_compute`).

Virtual time cannot block: the engine asks `ready_time(ids)` and starts its forward then;
`wait(ids)` marks those transfers finished, and each completion event calls `mark_done`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from superinfer.core.kv.transfer import (
    Direction,
    TransferEngine,
    TransferSpec,
    TransferStats,
    merge_into_runs,
)

MODES = ("duplex", "naive")


@dataclass(frozen=True)
class LinkModel:
    """The host link as the transfer engine sees it, for one model's KV blocks."""

    gbps_per_direction: float
    is_full_duplex: bool
    copy_overhead_s: float
    bytes_per_block: int
    num_pieces_per_block: int  # copies per block with a per-layer layout (2 x layers)

    def copy_time(self, num_blocks: int, num_copies: int) -> float:
        num_bytes = num_blocks * self.bytes_per_block
        return num_copies * self.copy_overhead_s + num_bytes / (self.gbps_per_direction * 1e9)


class SimTransferEngine(TransferEngine):
    """Predicted-time copies. `clock()` gives the virtual now; `on_submit(id, end)` is
    called for each transfer so the simulator can post its completion event."""

    def __init__(
        self,
        link: LinkModel,
        mode: str,
        clock: Callable[[], float],
        on_submit: Callable[[int, float], None] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown transfer mode {mode!r}, expected one of {MODES}")
        self.link, self.mode, self.clock = link, mode, clock
        self.on_submit = on_submit
        self.is_one_lane = mode == "naive" or not link.is_full_duplex
        self._lane_free_at = {Direction.D2H: 0.0, Direction.H2D: 0.0}
        self._end_at: dict[int, float] = {}  # pending transfers
        self._done: list[int] = []
        self._compute_fence = 0.0
        self.stats = TransferStats()

    def _lane(self, direction: Direction) -> Direction:
        return Direction.D2H if self.is_one_lane else direction

    def num_copies(self, spec: TransferSpec) -> int:
        if self.mode == "naive":
            return spec.num_blocks * self.link.num_pieces_per_block
        return len(merge_into_runs(spec.src_blocks, spec.dst_blocks))

    def submit(self, spec: TransferSpec) -> None:
        lane = self._lane(spec.direction)
        start = max(self.clock(), self._lane_free_at[lane])
        if spec.direction is Direction.D2H:
            start = max(start, self._compute_fence)
        num_copies = self.num_copies(spec)
        duration = self.link.copy_time(spec.num_blocks, num_copies)
        end = start + duration
        self._lane_free_at[lane] = end
        self._end_at[spec.transfer_id] = end
        self.stats.record(spec, self.link.bytes_per_block, num_copies, duration)
        if self.on_submit is not None:
            self.on_submit(spec.transfer_id, end)

    def record_compute(self, forward_end: object | None = None) -> None:
        """A forward ending at `forward_end` (virtual seconds) was launched: later D2H
        copies wait for it. None: nothing to wait for."""
        self._compute_fence = 0.0 if forward_end is None else float(forward_end)

    def ready_time(self, transfer_ids: Iterable[int]) -> float:
        """When the given transfers (those still pending) will have completed."""
        return max((self._end_at[i] for i in transfer_ids if i in self._end_at), default=0.0)

    def mark_done(self, transfer_id: int) -> None:
        """The transfer's completion time was reached (idempotent)."""
        if self._end_at.pop(transfer_id, None) is not None:
            self._done.append(transfer_id)

    def poll_finished(self) -> list[int]:
        done, self._done = self._done, []
        return done

    def wait(self, transfer_ids: Iterable[int] | None = None) -> None:
        """Mark the transfers finished; the caller has moved its clock to `ready_time`."""
        ids = list(self._end_at) if transfer_ids is None else list(transfer_ids)
        now = self.clock()
        for transfer_id in ids:
            end = self._end_at.get(transfer_id)
            if end is not None and end > now + 1e-9:
                raise RuntimeError(
                    f"transfer {transfer_id} waited on before it ends ({end} > {now})"
                )
            self.mark_done(transfer_id)

    def drain(self) -> list[int]:
        """End of the simulation: every pending transfer counts as finished; returns all
        finished ids not yet polled."""
        for transfer_id in list(self._end_at):
            self.mark_done(transfer_id)
        return self.poll_finished()

    @property
    def num_pending(self) -> int:
        return len(self._end_at)
