"""Which prompt blocks each replica's prefix cache is likely to hold, as the router sees it:
the full blocks of the prompts it sent there, least recently routed first out once a
replica's share passes its device pool. No replica is asked (the router's copy is an
approximation, as SGLang's cache-aware router keeps one); block names are the replicas'
own (`core/kv/prefix.py`), so a hit here is a hit there unless the replica evicted it
first. The router lowers a replica's prefill estimate by the tokens it holds, so a
conversation's next turn goes where its history is cached when that helps its SLO.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from superinfer.core.kv.prefix import cached_prefix_tokens, prefix_hashes


class PrefixIndex:
    """Block names by replica, most recently routed last."""

    MAX_BLOCKS = 1 << 16  # a replica's bound while its pool size is not known

    def __init__(self) -> None:
        self._blocks: dict[str, OrderedDict[int, None]] = {}

    def num_cached_tokens(self, replica_id: str, token_ids: Sequence[int], block_size: int) -> int:
        """Leading tokens of a prompt the replica is likely to hold (its last token is
        always computed, as the replica's own match leaves it)."""
        blocks = self._blocks.get(replica_id)
        if not blocks or block_size < 1:
            return 0
        return cached_prefix_tokens(token_ids, block_size, blocks.__contains__)

    def add(
        self, replica_id: str, token_ids: Sequence[int], block_size: int, capacity: int
    ) -> list[int]:
        """Record a prompt routed to the replica; returns the block names it added (those
        the replica did not hold already), for `discard` if the replica refuses it.
        `capacity`: the replica's device blocks (0: not known, `MAX_BLOCKS`)."""
        if block_size < 1:
            return []
        blocks = self._blocks.setdefault(replica_id, OrderedDict())
        added = []
        for name in prefix_hashes(token_ids, block_size):
            if name in blocks:
                blocks.move_to_end(name)
            else:
                blocks[name] = None
                added.append(name)
        capacity = capacity or self.MAX_BLOCKS
        while len(blocks) > capacity:
            blocks.popitem(last=False)
        return added

    def discard(self, replica_id: str, names: Sequence[int]) -> None:
        """Forget blocks a refused request added: the replica never computed them."""
        blocks = self._blocks.get(replica_id, {})
        for name in names:
            blocks.pop(name, None)

    def num_blocks(self, replica_id: str) -> int:
        return len(self._blocks.get(replica_id, ()))
