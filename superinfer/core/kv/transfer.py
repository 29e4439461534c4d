"""Transfer specs and the TransferEngine interface (pure Python).

The block manager plans copies of whole KV blocks between the device tier and the host
tier as `TransferSpec`s; a `TransferEngine` executes them (real copies in `engine/`,
predicted times in the simulator). Completion is polled once per scheduler step.
"""

from __future__ import annotations

import enum
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

_next_transfer_id = itertools.count(1)


class Direction(enum.Enum):
    D2H = "d2h"  # device -> host: write-back and swap-out
    H2D = "h2d"  # host -> device: swap-in


@dataclass(frozen=True)
class TransferSpec:
    """Copy block `src_blocks[i]` of the source tier to `dst_blocks[i]` of the other tier."""

    direction: Direction
    src_blocks: tuple[int, ...]
    dst_blocks: tuple[int, ...]
    transfer_id: int = field(default_factory=lambda: next(_next_transfer_id))

    def __post_init__(self) -> None:
        if len(self.src_blocks) != len(self.dst_blocks):
            raise ValueError("src_blocks and dst_blocks must have the same length")

    @property
    def num_blocks(self) -> int:
        return len(self.src_blocks)


@dataclass(frozen=True)
class BlockRun:
    """`num_blocks` consecutive blocks starting at `src_start` copied to `dst_start`."""

    src_start: int
    dst_start: int
    num_blocks: int


def merge_into_runs(src_blocks: Sequence[int], dst_blocks: Sequence[int]) -> list[BlockRun]:
    """Merge (src, dst) pairs into runs that are consecutive on both sides.

    Pairs are sorted by source block first, so one copy call can move each run.
    """
    runs: list[BlockRun] = []
    for src, dst in sorted(zip(src_blocks, dst_blocks)):
        last = runs[-1] if runs else None
        if (
            last is not None
            and src == last.src_start + last.num_blocks
            and dst == last.dst_start + last.num_blocks
        ):
            runs[-1] = BlockRun(last.src_start, last.dst_start, last.num_blocks + 1)
        else:
            runs.append(BlockRun(src, dst, 1))
    return runs


@dataclass
class DirectionStats:
    """Counters of one direction.

    `seconds` adds up the time each transfer spent copying (not time queued behind earlier
    ones), so in duplex mode the two directions' seconds overlap in wall time.
    """

    num_transfers: int = 0
    num_blocks: int = 0
    num_bytes: int = 0
    num_copy_calls: int = 0
    seconds: float = 0.0

    @property
    def gb_per_s(self) -> float:
        return self.num_bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass
class TransferStats:
    """Counters per direction; engines hand out copies, so readers never see torn values."""

    d2h: DirectionStats = field(default_factory=DirectionStats)
    h2d: DirectionStats = field(default_factory=DirectionStats)

    def of(self, direction: Direction) -> DirectionStats:
        return self.d2h if direction is Direction.D2H else self.h2d

    @property
    def num_copy_calls(self) -> int:
        return self.d2h.num_copy_calls + self.h2d.num_copy_calls

    def record(
        self, spec: TransferSpec, bytes_per_block: int, num_copy_calls: int, seconds: float
    ) -> None:
        stats = self.of(spec.direction)
        stats.num_transfers += 1
        stats.num_blocks += spec.num_blocks
        stats.num_bytes += spec.num_blocks * bytes_per_block
        stats.num_copy_calls += num_copy_calls
        stats.seconds += seconds

    def copy(self) -> TransferStats:
        return TransferStats(d2h=replace(self.d2h), h2d=replace(self.h2d))


class TransferEngine(ABC):
    """Executes `TransferSpec`s asynchronously, one lane per direction."""

    @abstractmethod
    def submit(self, spec: TransferSpec) -> None:
        """Start copying `spec`'s blocks; returns without waiting."""

    @abstractmethod
    def poll_finished(self) -> list[int]:
        """Ids of transfers that completed since the last poll (each reported once)."""

    @abstractmethod
    def wait(self, transfer_ids: Iterable[int] | None = None) -> None:
        """Block until the given transfers (all submitted ones if None) have completed.

        Completed ids are still reported by the next `poll_finished`.
        """

    def record_compute(self, forward_end: object | None = None) -> None:
        """A forward was just launched: device->host copies submitted from now on start only
        once it has ended (they may read blocks it writes).

        `forward_end` marks that end in the engine's own terms: the CUDA stream the forward
        was queued on (None: the current stream); a `threading.Event` the CPU runner sets
        when its worker thread finishes the forward (None: the forward ran synchronously,
        nothing to wait for); the forward's end in the simulator's virtual seconds (None:
        nothing to wait for). A no-op here.
        """

    def close(self) -> None:
        """Release worker threads or streams."""
