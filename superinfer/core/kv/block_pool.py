"""A pool of KV blocks for one tier: free list, reference counts, in-flight quarantine,
and (optionally) a prefix cache of full, computed blocks.

A block is in exactly one of these states:

    free         ref 0, no copy in flight, in the free list (maybe still holding a cached
                 prefix: it is evicted from the cache when handed out again)
    used         ref > 0
    quarantined  ref 0 but a copy into or out of it is in flight: not handed out until
                 the copy completes (`end_copy`), then it joins the free list
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from superinfer.core.kv.errors import KVInvariantError, OutOfBlocksError


class BlockPool:
    """Blocks `0 .. num_blocks-1` of one tier."""

    def __init__(self, num_blocks: int, name: str = "pool", enable_caching: bool = False) -> None:
        if num_blocks < 0:
            raise ValueError(f"{name}: num_blocks must be >= 0, got {num_blocks}")
        self.name = name
        self.num_blocks = num_blocks
        self.is_caching = enable_caching
        self.ref_counts = [0] * num_blocks
        self._num_used = 0  # blocks with ref > 0, kept as they change (asked every step)
        self.num_inflight = [0] * num_blocks  # copies into or out of each block
        # Insertion order = eviction order (least recently freed first). Values unused.
        self._free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.block_hash: dict[int, int] = {}  # block -> prefix hash of its (full) content
        self.hash_to_block: dict[int, int] = {}

    # --- capacity -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self._num_used

    @property
    def num_quarantined_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks - self.num_used_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks not available for allocation (0 for an empty pool)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    # --- allocation -----------------------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int]:
        """Hand out `num_blocks` free blocks, each with ref count 1."""
        if num_blocks > len(self._free):
            raise OutOfBlocksError(
                f"{self.name}: asked for {num_blocks} blocks, {len(self._free)} free"
            )
        blocks = []
        for _ in range(num_blocks):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self.ref_counts[block] = 1
            blocks.append(block)
        self._num_used += num_blocks
        return blocks

    def incref(self, block: int) -> None:
        """Share `block`. A prefix-cache hit may revive a free cached block, or a quarantined
        one: its content stays valid while a copy reads it, and the copy's end then finds
        it owned again."""
        self._free.pop(block, None)
        if self.ref_counts[block] == 0:
            self._num_used += 1
        self.ref_counts[block] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop one reference to each block; a block reaching 0 becomes free or quarantined."""
        for block in blocks:
            if self.ref_counts[block] <= 0:
                raise KVInvariantError(f"{self.name}: double free of block {block}")
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._num_used -= 1
                if not self.is_caching:
                    self._evict(block)
                self._release_if_idle(block)

    # --- in-flight copies -----------------------------------------------------------------
    def begin_copy(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            if self.ref_counts[block] == 0:
                raise KVInvariantError(f"{self.name}: copy involving unowned block {block}")
            self.num_inflight[block] += 1

    def end_copy(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self.num_inflight[block] -= 1
            self._release_if_idle(block)

    def is_inflight(self, block: int) -> bool:
        return self.num_inflight[block] > 0

    def _release_if_idle(self, block: int) -> None:
        if self.ref_counts[block] == 0 and self.num_inflight[block] == 0:
            self._free[block] = None

    # --- prefix cache ---------------------------------------------------------------------
    def cache_block(self, block: int, block_hash: int) -> None:
        """Remember that `block` holds the full, computed content identified by `block_hash`."""
        if not self.is_caching or block_hash in self.hash_to_block or block in self.block_hash:
            return
        self.block_hash[block] = block_hash
        self.hash_to_block[block_hash] = block

    def lookup(self, block_hash: int) -> int | None:
        return self.hash_to_block.get(block_hash)

    def _evict(self, block: int) -> None:
        block_hash = self.block_hash.pop(block, None)
        if block_hash is not None:
            del self.hash_to_block[block_hash]

    # --- checks ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise KVInvariantError unless free + used + quarantined == total, consistently."""
        for block in range(self.num_blocks):
            ref, inflight = self.ref_counts[block], self.num_inflight[block]
            is_free = block in self._free
            if ref < 0 or inflight < 0:
                raise KVInvariantError(f"{self.name}: negative count on block {block}")
            if is_free != (ref == 0 and inflight == 0):
                raise KVInvariantError(
                    f"{self.name}: block {block} free={is_free} ref={ref} inflight={inflight}"
                )
        if self._num_used != sum(1 for r in self.ref_counts if r > 0):
            raise KVInvariantError(f"{self.name}: used-block count {self._num_used} is off")
        for block, block_hash in self.block_hash.items():
            if self.hash_to_block.get(block_hash) != block:
                raise KVInvariantError(f"{self.name}: cache maps disagree on block {block}")
        if len(self.block_hash) != len(self.hash_to_block):
            raise KVInvariantError(f"{self.name}: cache maps differ in size")
