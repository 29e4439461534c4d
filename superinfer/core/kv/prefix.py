"""The prefix cache's block identity: each full block of a token sequence is named by a hash
of its tokens chained to its predecessor's, so equal hashes mean equal prefixes (up to hash
collisions, as in vLLM). Python's hash of a tuple of ints is the same in every process
(`PYTHONHASHSEED` salts only str and bytes), so a router computes the names a replica's
cache holds without asking it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """The name of a full block holding `tokens` after the block named `parent` (0: first)."""
    return hash((parent, tuple(tokens)))


def prefix_hashes(token_ids: Sequence[int], block_size: int) -> Iterator[int]:
    """The names of the full blocks of `token_ids`, first block first (lazily: a lookup
    that stops at its first miss names no block past it)."""
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start : start + block_size])
        yield parent


def num_matchable_blocks(num_tokens: int, block_size: int) -> int:
    """Full blocks of a prompt a cache hit may cover: the last token is always computed,
    because the model needs it to produce the next token's logits."""
    return max(0, num_tokens - 1) // block_size


def cached_prefix_tokens(token_ids: Sequence[int], block_size: int,
                      is_cached: Callable[[int], bool]) -> int:  # fmt: skip
    """Leading tokens of a prompt whose full blocks `is_cached` knows by name, stopping at
    the first it does not, and never the last token (`num_matchable_blocks`)."""
    num_blocks = num_matchable_blocks(len(token_ids), block_size)
    num_hit = 0
    for name in prefix_hashes(token_ids[: num_blocks * block_size], block_size):
        if not is_cached(name):
            break
        num_hit += 1
    return num_hit * block_size
