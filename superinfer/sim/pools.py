"""A `BlockPool` that counts its used blocks as they change.

`BlockPool.num_used_blocks` recounts every block, which the scheduler asks twice per step
(`memory_state`): negligible for the few thousand blocks of a real engine here, the largest
cost of a simulated step at GH200 scale (50,000+ blocks). This subclass keeps the count
incrementally and behaves otherwise identically; `check_invariants` compares it with a
recount. (Worth moving into `core` itself.)
"""

from __future__ import annotations

from collections.abc import Iterable

from superinfer.core.kv.block_pool import BlockPool
from superinfer.core.kv.errors import KVInvariantError
from superinfer.core.kv.manager import TwoTierKVManager


class CountingBlockPool(BlockPool):
    def __init__(self, num_blocks: int, name: str = "pool", enable_caching: bool = False) -> None:
        super().__init__(num_blocks, name, enable_caching)
        self._num_used = 0

    @property
    def num_used_blocks(self) -> int:
        return self._num_used

    def allocate(self, num_blocks: int) -> list[int]:
        blocks = super().allocate(num_blocks)
        self._num_used += len(blocks)
        return blocks

    def incref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self._num_used += 1
        super().incref(block)

    def free(self, blocks: Iterable[int]) -> None:
        ref_counts = self.ref_counts
        for block in blocks:
            super().free((block,))
            if ref_counts[block] == 0:
                self._num_used -= 1

    def check_invariants(self) -> None:
        super().check_invariants()
        recount = sum(1 for r in self.ref_counts if r > 0)
        if recount != self._num_used:
            raise KVInvariantError(
                f"{self.name}: {self._num_used} used blocks counted, {recount} real"
            )


def use_counting_pools(kv: TwoTierKVManager) -> TwoTierKVManager:
    """Swap the (still untouched) pools of `kv` for counting ones of the same shape."""
    if kv.tables or kv.device.num_used_blocks or kv.host.num_used_blocks:
        raise ValueError("swap the pools before the KV manager is used")
    kv.device = CountingBlockPool(kv.device.num_blocks, kv.device.name, kv.device.is_caching)
    kv.host = CountingBlockPool(kv.host.num_blocks, kv.host.name, kv.host.is_caching)
    return kv
