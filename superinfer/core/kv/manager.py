"""Two-tier KV block manager: device and host pools, per-request block tables, prefix
caching, and the bookkeeping of rotation (swap-out / swap-in) with host shadows.

It answers capacity questions and plans copies as `TransferSpec`s; it never decides who
runs (the scheduler does) and never moves bytes (a `TransferEngine` does).

Host shadows. A device block may be paired with a host block holding a copy of its full,
computed content (`shadow_of[device_block] = host_block`; the pairing holds one host
reference). With eager write-back, a block is copied to a fresh shadow as soon as it is
full and computed, so a swap-out copies only the dirty tail:

    device table   [d0 d1 d2 d3]         d3 partial (tail)
    shadow_of       d0->h0 d1->h1 d2->h2  (written back eagerly)
    swap-out       host table [h0 h1 h2 h3']: refs taken on h0..h2, one copy d3 -> h3'
    swap-in        new device table [e0 e1 e2 e3], copies h* -> e*; e0..e2 re-paired with
                   h0..h2 (the request's references move to the pairings); h3' released

A pairing is dropped when its device block's reference count reaches zero, so a reused
device block gets a fresh shadow while the old one stays with the rotary request that
owns it (copy-on-write). Blocks with copies in flight are quarantined by the pools.

Sliding windows. When every layer of the model sees only the last `sliding_window`
positions (a key at k_pos is seen from q_pos when q_pos - k_pos < window), a block whose
positions all lie before `num_computed_tokens - window + 1` is out of reach of every future
query. It is freed as soon as its request computes past it, and its table entry becomes
FREED_BLOCK (the attention kernels never read it), so a long generation holds about
window / block_size + 1 device blocks:

    positions      0..3  4..7  8..11 12..15 16..   window 8, block 4, 15 tokens computed
    device table   [ -1    -1   d2    d3    d4 ]   the next query (15) sees keys 8..15
    host table     [ -1    -1   h2    h3 ]         after a swap-out: live blocks only

Freeing drops only this request's reference: a block shared through the prefix cache stays
with the other holders, and a freed block keeps its prefix hash in the pool's free list
(its content is still the KV of that exact prefix), so prefix caching stays correct with
no special case; a later request revives it on a hit or the pool evicts it on reuse.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from superinfer.core.kv.block_pool import BlockPool
from superinfer.core.kv.errors import KVInvariantError
from superinfer.core.kv.prefix import cached_prefix_tokens, chain_hash, num_matchable_blocks
from superinfer.core.kv.transfer import Direction, TransferSpec
from superinfer.core.request import Request, RequestStatus

FREED_BLOCK = -1  # a table entry whose block was freed out of the sliding window


def _live(blocks: Iterable[int]) -> list[int]:
    return [block for block in blocks if block != FREED_BLOCK]


@dataclass
class BlockTables:
    """One request's blocks: device blocks while running, host blocks while swapped."""

    device: list[int] = field(default_factory=list)
    host: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # prefix hash of each full block
    num_registered: int = 0  # leading device blocks already cached / written back
    num_freed: int = 0  # leading entries freed out of the sliding window (FREED_BLOCK)


@dataclass
class KVStats:
    """Counters the engine reports as metrics."""

    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0
    num_writeback_blocks: int = 0
    num_reclaimed_shadows: int = 0  # shadows dropped to make host room for a swap-out
    num_prefix_query_tokens: int = 0  # all tokens of each request looked up (vLLM's queries)
    num_prefix_hit_tokens: int = 0
    num_window_freed_blocks: int = 0  # device blocks freed out of the sliding window


class TwoTierKVManager:
    def __init__(
        self,
        num_device_blocks: int,
        num_host_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        writeback_host_usage_limit: float = 0.9,
        sliding_window: int | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
        self.block_size = block_size
        self.sliding_window = sliding_window  # every layer's window; None: no freeing
        self.device = BlockPool(num_device_blocks, "device", enable_caching=enable_prefix_caching)
        self.host = BlockPool(num_host_blocks, "host")
        self.is_prefix_caching = enable_prefix_caching
        self.is_eager_writeback = False  # the scheduling policy switches it on
        self.writeback_host_usage_limit = writeback_host_usage_limit
        self.tables: dict[str, BlockTables] = {}
        self.shadow_of: dict[int, int] = {}
        self.stats = KVStats()
        self._inflight: dict[int, tuple[list[int], list[int]]] = {}  # id -> (device, host)
        self._planned: list[TransferSpec] = []
        self._writeback: list[tuple[int, int]] = []  # (device, host) pairs not yet in a spec
        self.is_step_in_flight = False  # a forward may still read or write device blocks
        self._fenced: list[int] = []  # device blocks freed while a forward was in flight

    # --- sizes ----------------------------------------------------------------------------
    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _table(self, request: Request) -> BlockTables:
        return self.tables.setdefault(request.request_id, BlockTables())

    def num_device_blocks_of(self, request: Request) -> int:
        """Device blocks the request holds (freed window entries not counted)."""
        table = self.tables.get(request.request_id)
        return len(table.device) - table.num_freed if table and table.device else 0

    def num_blocks_held_for(self, num_tokens: int) -> int:
        """Device blocks a request of `num_tokens` holds once decoding: all of them, or
        about a window's worth when blocks out of the window are freed."""
        num_blocks = self.num_blocks_for(num_tokens)
        if self.sliding_window is None:
            return num_blocks
        return min(num_blocks, self.num_blocks_for(self.sliding_window) + 1)

    def _num_out_of_window(self, request: Request) -> int:
        """Leading blocks no future query of `request` can see (all before the first key
        visible from position num_computed_tokens)."""
        if self.sliding_window is None:
            return 0
        return max(0, request.num_computed_tokens - self.sliding_window + 1) // self.block_size

    def block_table(self, request: Request) -> list[int]:
        return self._table(request).device

    # --- allocation -----------------------------------------------------------------------
    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Device blocks to add so that `num_new_tokens` more tokens have slots."""
        num_tokens = request.num_computed_tokens + num_new_tokens
        table = self.tables.get(request.request_id)
        return max(0, self.num_blocks_for(num_tokens) - (len(table.device) if table else 0))

    def can_allocate(self, request: Request, num_new_tokens: int, num_keep_free: int = 0) -> bool:
        needed = self.num_blocks_needed(request, num_new_tokens)
        return needed + num_keep_free <= self.device.num_free_blocks

    def allocate_slots(self, request: Request, num_new_tokens: int) -> None:
        """Give `request` device slots for `num_new_tokens` more tokens (ask first)."""
        needed = self.num_blocks_needed(request, num_new_tokens)
        if needed:
            self._table(request).device.extend(self.device.allocate(needed))

    def match_prefix(self, request: Request) -> int:
        """Share cached device blocks holding a prefix of a request without blocks.

        Returns the number of tokens hit. At least the last token is left to compute,
        because the model needs it to produce the next token's logits. A request that asks
        for its prompt's log-probabilities reads no hit (every prompt position must run
        through the model, as in vLLM); its blocks are cached for others all the same.
        """
        table = self._table(request)
        if not self.is_prefix_caching or table.device or table.host:
            return 0
        if request.sampling_params.prompt_logprobs is not None:
            return 0
        self.stats.num_prefix_query_tokens += request.num_tokens
        self._extend_hashes(request, table)
        num_matchable = num_matchable_blocks(request.num_tokens, self.block_size)
        for block_hash in table.block_hashes[:num_matchable]:
            block = self.device.lookup(block_hash)
            if block is None:
                break
            self.device.incref(block)
            table.device.append(block)
        table.num_registered = len(table.device)
        num_hit = len(table.device) * self.block_size
        self.stats.num_prefix_hit_tokens += num_hit
        return num_hit

    def num_cached_tokens(self, token_ids: list[int]) -> int:
        """Prompt tokens of `token_ids` the device's prefix cache holds now: what
        `match_prefix` would hit if the request were scheduled at once. Reads only (two
        dict lookups a block), so another thread may ask between or during steps, as
        admission does; the answer may be a step stale."""
        if not self.is_prefix_caching:
            return 0
        return cached_prefix_tokens(token_ids, self.block_size,
                                 lambda name: self.device.lookup(name) is not None)  # fmt: skip

    def _extend_hashes(self, request: Request, table: BlockTables) -> None:
        num_full = request.num_tokens // self.block_size
        for i in range(len(table.block_hashes), num_full):
            parent = table.block_hashes[i - 1] if i else 0
            tokens = request.token_ids_slice(i * self.block_size, (i + 1) * self.block_size)
            if min(tokens) < 0:  # a placeholder of a token still being sampled
                return
            table.block_hashes.append(chain_hash(parent, tokens))

    # --- after a forward ------------------------------------------------------------------
    def on_tokens_computed(self, request: Request) -> None:
        """Register newly full, computed blocks in the prefix cache and write them back;
        free the blocks the sliding window left behind."""
        table = self._table(request)
        num_full = min(request.num_computed_tokens // self.block_size, len(table.device))
        num_dead = min(self._num_out_of_window(request), len(table.device))
        if num_full > table.num_registered:
            self._extend_hashes(request, table)
            for i in range(table.num_registered, num_full):
                block = table.device[i]
                self.device.cache_block(block, table.block_hashes[i])
                if self.is_eager_writeback and i >= num_dead and block not in self.shadow_of:
                    self._plan_writeback(block)
            table.num_registered = num_full
        if num_dead > table.num_freed:  # sliding window
            dead = table.device[table.num_freed : num_dead]
            self._free_device(dead)
            table.device[table.num_freed : num_dead] = [FREED_BLOCK] * len(dead)
            table.num_freed = num_dead
            self.stats.num_window_freed_blocks += len(dead)

    def _plan_writeback(self, block: int) -> None:
        if self.host.num_free_blocks == 0 or self.host.usage >= self.writeback_host_usage_limit:
            return
        (shadow,) = self.host.allocate(1)
        self.shadow_of[block] = shadow
        self.device.begin_copy([block])
        self.host.begin_copy([shadow])
        self._writeback.append((block, shadow))
        self.stats.num_writeback_blocks += 1

    # --- rotation -------------------------------------------------------------------------
    def _num_computed_blocks(self, request: Request) -> int:
        return self.num_blocks_for(request.num_computed_tokens)

    def num_swap_out_copies(self, request: Request) -> int:
        """Blocks a swap-out must copy (those without a shadow)."""
        table = self._table(request)
        computed = _live(table.device[: self._num_computed_blocks(request)])
        return sum(1 for block in computed if block not in self.shadow_of)

    def can_swap_out(self, request: Request) -> bool:
        num_copies = self.num_swap_out_copies(request)
        if num_copies <= self.host.num_free_blocks:
            return True
        keep = _live(self._table(request).device)
        return num_copies <= self.host.num_free_blocks + len(self._reclaimable(keep))

    # --- host room --------------------------------------------------------------------------
    # A shadow only its pairing holds is a cache of a live device block: the host tier
    # drops it when a swap-out needs the room, and it does not count as host memory in use
    # for the policies' guards (eager write-back alone would fill the host with them).
    def _reclaimable(self, keep: Iterable[int] = ()) -> list[int]:
        """Device blocks whose shadow could be dropped now (held by the pairing alone, its
        copy landed), except those of `keep`."""
        kept = set(keep)
        return [block for block, shadow in self.shadow_of.items()
                if self.host.ref_counts[shadow] == 1 and not self.host.is_inflight(shadow)
                and block not in kept]  # fmt: skip

    def num_reclaimable_host_blocks(self, past_usage: float = 0.0) -> int:
        """Shadows that could be dropped now, counted only while the raw host usage is past
        `past_usage` (0 below it): the count scans every shadow, and below a guard's usage
        no guard there or higher can trip whatever the count is."""
        return len(self._reclaimable()) if self.host.usage > past_usage else 0

    def host_usage_pinned(self, past_usage: float = 0.0) -> float:
        """Fraction of host blocks in use other than reclaimable shadows (rotated-out KV,
        shadows it shares, copies in flight); the raw usage while it is <= `past_usage`."""
        host = self.host
        num_used = host.num_blocks - host.num_free_blocks
        num_pinned = num_used - self.num_reclaimable_host_blocks(past_usage)
        return num_pinned / host.num_blocks if host.num_blocks else 0.0

    def _reclaim_host(self, num_needed: int, keep: Iterable[int]) -> None:
        """Drop reclaimable shadows (not those of `keep`) until `num_needed` host blocks
        are free."""
        num_short = num_needed - self.host.num_free_blocks
        if num_short <= 0:
            return
        for block in self._reclaimable(keep)[:num_short]:
            self._drop_shadow(block)
            self.stats.num_reclaimed_shadows += 1

    def num_blocks_freed_by_swap_out(self, request: Request) -> int:
        """Device blocks a swap-out would release (those not shared), some of them only
        once their copies land."""
        blocks = _live(self._table(request).device)
        return sum(1 for block in blocks if self.device.ref_counts[block] == 1)

    def swap_out(self, request: Request) -> None:
        """Move the request's computed KV to the host tier; its device blocks are released."""
        table = self._table(request)
        self._reclaim_host(self.num_swap_out_copies(request), keep=_live(table.device))
        host_blocks, pairs = [], []
        for block in table.device[: self._num_computed_blocks(request)]:
            shadow = self.shadow_of.get(block)
            if block == FREED_BLOCK:
                shadow = FREED_BLOCK
            elif shadow is None:
                (shadow,) = self.host.allocate(1)
                pairs.append((block, shadow))
            else:
                self.host.incref(shadow)
            host_blocks.append(shadow)
        if pairs:
            self._plan(Direction.D2H, [d for d, _ in pairs], [h for _, h in pairs])
        self._free_device(_live(table.device))
        table.device, table.host = [], host_blocks
        table.num_registered = 0
        self.stats.num_swap_out_blocks += len(pairs)

    def is_swap_in_ready(self, request: Request) -> bool:
        """True once the copies into the request's host blocks have landed."""
        return not any(self.host.is_inflight(block) for block in _live(self._table(request).host))

    def can_swap_in(self, request: Request, num_new_tokens: int, num_keep_free: int = 0) -> bool:
        """Room on the device for the request's KV and `num_new_tokens`, its copies landed."""
        host = self._table(request).host
        num_tokens = request.num_computed_tokens + num_new_tokens
        num_new = max(0, self.num_blocks_for(num_tokens) - len(host))
        num_needed = len(_live(host)) + num_new + num_keep_free
        return self.is_swap_in_ready(request) and num_needed <= self.device.num_free_blocks

    def swap_in(self, request: Request) -> TransferSpec | None:
        """Plan the copy of the request's KV back to fresh device blocks; re-pair shadows."""
        table = self._table(request)
        host_blocks, live = table.host, _live(table.host)
        allocated = iter(self.device.allocate(len(live)))
        device_blocks = [b if b == FREED_BLOCK else next(allocated) for b in host_blocks]
        spec = self._plan(Direction.H2D, live, _live(device_blocks)) if live else None
        num_full = request.num_computed_tokens // self.block_size
        for i, (host_block, device_block) in enumerate(zip(host_blocks, device_blocks)):
            if host_block == FREED_BLOCK:
                continue
            if i < num_full:  # the request's host reference becomes the pairing's
                self.shadow_of[device_block] = host_block
            else:  # the tail will change: its host copy is stale once the copy lands
                self.host.free([host_block])
        table.device, table.host = device_blocks, []
        self._extend_hashes(request, table)
        for i in range(table.num_freed, num_full):
            self.device.cache_block(device_blocks[i], table.block_hashes[i])
        table.num_registered = num_full
        self.stats.num_swap_in_blocks += len(live)
        return spec

    # --- release --------------------------------------------------------------------------
    def free(self, request: Request, forget: bool = True) -> None:
        """Release all blocks of `request` in both tiers (finish, abort, recompute)."""
        table = self.tables.get(request.request_id)
        if table is None:
            return
        self._free_device(_live(table.device))
        self.host.free(_live(table.host))
        table.device, table.host, table.num_registered, table.num_freed = [], [], 0, 0
        if forget:
            del self.tables[request.request_id]

    def _free_device(self, blocks: Iterable[int]) -> None:
        blocks = list(blocks)
        if self.is_step_in_flight:  # quarantine what the running forward may still touch
            released = [b for b in blocks if self.device.ref_counts[b] == 1]
            self.device.begin_copy(released)
            self._fenced += released
        self.device.free(blocks)
        for block in blocks:
            if self.device.ref_counts[block] == 0:
                self._drop_shadow(block)

    def _drop_shadow(self, block: int) -> None:
        shadow = self.shadow_of.pop(block, None)
        if shadow is not None:
            self.host.free([shadow])

    # --- transfers ------------------------------------------------------------------------
    def _plan(self, direction: Direction, src: list[int], dst: list[int]) -> TransferSpec:
        spec = TransferSpec(direction, tuple(src), tuple(dst))
        device, host = (src, dst) if direction is Direction.D2H else (dst, src)
        self.device.begin_copy(device)
        self.host.begin_copy(host)
        self._inflight[spec.transfer_id] = (list(device), list(host))
        self._planned.append(spec)
        return spec

    def begin_step_fence(self) -> None:
        """A forward was launched: blocks freed from now on wait for `end_step_fence`."""
        self.is_step_in_flight = True

    def end_step_fence(self) -> None:
        """The forward finished: release the blocks freed while it ran."""
        self.is_step_in_flight = False
        self.device.end_copy(self._fenced)
        self._fenced = []

    def take_planned_transfers(self) -> list[TransferSpec]:
        """Specs planned since the last call, write-backs merged into one; the caller
        submits them to the transfer engine."""
        if self._writeback:
            device = [d for d, _ in self._writeback]
            host = [h for _, h in self._writeback]
            spec = TransferSpec(Direction.D2H, tuple(device), tuple(host))
            self._inflight[spec.transfer_id] = (device, host)
            self._planned.append(spec)
            self._writeback = []
        planned, self._planned = self._planned, []
        return planned

    def complete_transfers(self, transfer_ids: Iterable[int]) -> None:
        """Release the quarantine of blocks whose copies finished."""
        for transfer_id in transfer_ids:
            device, host = self._inflight.pop(transfer_id)
            self.device.end_copy(device)
            self.host.end_copy(host)

    @property
    def num_inflight_transfers(self) -> int:
        return len(self._inflight) + (1 if self._writeback else 0)

    # --- checks ---------------------------------------------------------------------------
    def check_invariants(self, requests: Iterable[Request] = ()) -> None:
        """Raise KVInvariantError if the pools, tables, shadows or copies disagree."""
        self.device.check_invariants()
        self.host.check_invariants()
        device_refs: Counter[int] = Counter()
        host_refs: Counter[int] = Counter(self.shadow_of.values())
        for table in self.tables.values():
            device_refs.update(_live(table.device))
            host_refs.update(_live(table.host))
            if table.device and table.host:
                raise KVInvariantError("a request holds blocks in both tiers")
            blocks = table.device or table.host
            num_freed = table.num_freed if blocks else 0
            if _live(blocks[:num_freed]) or FREED_BLOCK in blocks[num_freed:]:
                raise KVInvariantError("freed window entries are not the table's leading ones")
            if num_freed and self.sliding_window is None:
                raise KVInvariantError("blocks freed out of a window without a window")
        if any(self.device.ref_counts[block] == 0 for block in self.shadow_of):
            raise KVInvariantError("a free device block still has a shadow")
        self._check_refs(self.device, device_refs)
        self._check_refs(self.host, host_refs)
        self._check_inflight()
        for request in requests:
            self._check_request(request)

    @staticmethod
    def _check_refs(pool: BlockPool, refs: Counter[int]) -> None:
        for block in range(pool.num_blocks):
            if pool.ref_counts[block] != refs.get(block, 0):
                raise KVInvariantError(
                    f"{pool.name} block {block}: ref count {pool.ref_counts[block]}, "
                    f"owned {refs.get(block, 0)} times"
                )

    def _check_inflight(self) -> None:
        device_inflight: Counter[int] = Counter(d for d, _ in self._writeback)
        device_inflight.update(self._fenced)
        host_inflight: Counter[int] = Counter(h for _, h in self._writeback)
        for device, host in self._inflight.values():
            device_inflight.update(device)
            host_inflight.update(host)
        for pool, inflight in ((self.device, device_inflight), (self.host, host_inflight)):
            for block in range(pool.num_blocks):
                if pool.num_inflight[block] != inflight.get(block, 0):
                    raise KVInvariantError(f"{pool.name} block {block}: in-flight count off")

    def _check_request(self, request: Request) -> None:
        table = self.tables.get(request.request_id)
        num_device = len(table.device) if table else 0
        num_host = len(table.host) if table else 0
        status = request.status
        if status.is_finished and table is not None:
            raise KVInvariantError(f"finished request {request.request_id} still has blocks")
        if status is RequestStatus.WAITING and (num_device or num_host):
            raise KVInvariantError(f"waiting request {request.request_id} holds blocks")
        if status is RequestStatus.RUNNING and (
            num_host or num_device < self._num_computed_blocks(request)
        ):
            raise KVInvariantError(f"running request {request.request_id}: bad tables")
        if status is RequestStatus.SWAPPED and (
            num_device or num_host != self._num_computed_blocks(request)
        ):
            raise KVInvariantError(f"swapped request {request.request_id}: bad tables")
