"""How fast the engine's host link moves KV blocks: measured on its own transfer engine and
tiers, for the simulator's calibration (`superinfer calibrate`)."""

from __future__ import annotations

import statistics
import time

from superinfer.core.kv.transfer import Direction, TransferSpec
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer.base import KVTransferEngine


def measure_link(
    transfer: KVTransferEngine, kv_tiers: KVCacheTiers, num_blocks: int = 256, repeats: int = 3
) -> dict[str, float | bool | int]:
    """Time KV copies on the engine's transfer engine: GB/s per direction, per-copy cost,
    and whether the two directions overlap."""
    block_bytes = kv_tiers.bytes_per_block
    num_blocks = min(num_blocks, kv_tiers.device.shape[0] // 2, kv_tiers.host.shape[0] // 2)

    def timed(*specs: TransferSpec) -> float:
        start = time.perf_counter()
        for spec in specs:
            transfer.submit(spec)
        transfer.wait([s.transfer_id for s in specs])
        transfer.poll_finished()
        return time.perf_counter() - start

    def spec(direction: Direction, stride: int) -> TransferSpec:
        blocks = tuple(range(0, num_blocks * stride, stride))[: num_blocks // stride]
        return TransferSpec(direction, blocks, blocks)

    def median(make) -> float:
        return statistics.median(timed(*make()) for _ in range(repeats))

    one_run = median(lambda: [spec(Direction.D2H, 1)])
    scattered = median(lambda: [spec(Direction.D2H, 2)])  # num_blocks/2 runs of one block
    both = median(lambda: [spec(Direction.D2H, 1), spec(Direction.H2D, 1)])
    num_bytes = num_blocks * block_bytes
    gbps = num_bytes / one_run / 1e9
    num_runs = num_blocks // 2
    overhead = max(0.0, (scattered - (num_runs * block_bytes) / (gbps * 1e9)) / num_runs)
    return {
        "gbps_per_direction": round(gbps, 3),
        "copy_overhead_s": overhead,
        "is_full_duplex": both < 1.5 * one_run,
        "both_directions_over_one": round(both / one_run, 3),
        "bytes_per_block": block_bytes,
    }
