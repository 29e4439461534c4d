"""KV bookkeeping: block pools per tier, the two-tier manager, transfer specs."""

from superinfer.core.kv.block_pool import BlockPool
from superinfer.core.kv.errors import KVInvariantError, OutOfBlocksError
from superinfer.core.kv.manager import FREED_BLOCK, TwoTierKVManager
from superinfer.core.kv.transfer import Direction, TransferEngine, TransferSpec

__all__ = [
    "FREED_BLOCK",
    "BlockPool",
    "Direction",
    "KVInvariantError",
    "OutOfBlocksError",
    "TransferEngine",
    "TransferSpec",
    "TwoTierKVManager",
]
