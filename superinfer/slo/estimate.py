"""When will a request's first token come? The one estimate behind every admission answer
(the server's `Admission`, the Ray router's ranking of replicas) and the estimated-TTFT
figures a refusal reports.

Pure Python over plain data: `EngineLoad` is built from the engine's published snapshot
(never the live engine), times are seconds from now, deadlines are on the engine's clock.

    first token = (compute + memory) / (1 - higher), times the learned correction
    compute     = the rest of the step in flight (nothing new starts before it ends)
                  + (prompt tokens ahead + this prompt) x prefill cost per token
                  + their attention pairs x prefill cost per pair (a long prompt's last
                    chunks attend to all of its first ones)
                  + one decode step per step's worth of those tokens (with steps shaped by
                    TBT, the tokens a shaped step carries for a class below the one
                    decoding: a gold request decoding slows the bronze queue)
                  + the prompt work behind it (lower classes' running prompts, the queue
                    behind it, and the prompts of this class and below arriving meanwhile:
                    their recent rate x the above), up to what its last step has left of
                    the budget: the first token comes when that whole step ends; with a
                    ready step-time model, up to what keeps the step within its deadline's
                    headroom (the scheduler's first-token guard holds them to that)
    memory      = blocks the queue ahead, the rotated-out requests of this class and
                  those above (they come back first) and this request need beyond what is
                  free or can be taken from lower classes, over the rate at which finishing
                  requests free device blocks; or, when no lower class runs to be displaced,
                  the host blocks to be freed before the policy's host guard lets a
                  newcomer in (rotasched: 90% used), over the rate the host tier drains
                  (rotation refills it: a full host tier that holds steady admits no
                  newcomer, however fast device blocks free up); or the wait for a seat
                  in the running batch (`max_num_seqs`): the requests of this class and
                  above running or rotated out and the queue ahead beyond the seats, over
                  the rate requests finish; whichever is longest
    higher      = the share of the engine's time that prefilling more important classes'
                  new arrivals takes (their recent prompt tokens per second x the prefill
                  cost per token): they will be served ahead of this request while it
                  waits, the classic stretch of a preemptive-priority queue

"Ahead" is class order, then the policy's: the rest of the prompts of running requests
of this class and above (the scheduler serves running requests first), then the queued
requests of a more important class, and those of the same class the policy serves first
(due earlier, when it admits by deadline; all of them otherwise). A bronze backlog is not
ahead of a gold request. The prefill costs are learned from the served steps
(`PrefillCost`), so they include what the machine's other work costs the engine.

Between tokens (`Estimator.tpot`), judged as the SLO report judges TPOT, on the mean gap
over a request's whole output:

    a request's decode time = time since its first token
                              + its remaining tokens x a decode step (of the batch
                                once the queued requests join it, by the per-row cost)
                              + the prefill that will run in its steps (all pending
                                prompts' tokens and attention pairs x their prefill
                                costs, at most one step's token budget in each of its
                                remaining steps)

A new request is refused when its own mean gap would exceed its TBT target, or when its
prompt would push a decoding request of its class or above past its TPOT budget (the TBT
target times its gaps, times the headroom admission plans with): a promise already made
is not broken to make a new one. Lower classes are not counted (they make room by
rotation). A request already estimated past its whole budget refuses no one (its promise
is lost wherever the newcomer goes); one within its budget but past the headroom refuses
every newcomer that would slow it further.

The correction (`Correction`) learns from every admitted request how its measured TTFT
compares with its estimate, per class, and scales later estimates by a high quantile of
that ratio: a drifting machine or a new model needs no retuning, and the estimate errs on
the side of the promise.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from superinfer.core.step_time import BatchShape
from superinfer.slo.kv_peak import KvHold, peak_kv_blocks, promised_finish_s

# No device-memory release seen recently while memory is short: the wait is unknown, and
# long. The estimate uses this instead of infinity so that it stays a number.
UNKNOWN_MEMORY_WAIT_S = 60.0
MAX_HIGHER_SHARE = 0.9
# The share of the KV capacity a class leaves uncommitted for each class above it
KV_HEADROOM_PER_CLASS = 0.1
# The share of the host tier (up to the policy's guard) admission commits to admitted
# requests' KV. The rest is rotation's working room: with the tier committed to the guard,
# parked KV filled it, the guard held newcomers in the queue for seconds and rotation
# stalled (docs/results/slo_promise/gold_1205/, uniform load at 3x, 3 interleaved pairs:
# precision 94.7% -> 99.3%, goodput +20%). 0.75 lowered refusal cost but brought the
# stalls back under heavier load (docs/results/slo_promise/host_commit_1206/, uniform 3x:
# precision 95-98%, goodput -19%).
HOST_COMMIT_SHARE = 0.5


@dataclass(frozen=True)
class Queued:
    """A request waiting for its first admission to the running batch."""

    deadline: float  # its TTFT deadline, engine clock
    num_tokens: int  # prompt tokens it still has to prefill
    slo_class: str | None = None
    num_final_tokens: int = 0  # its KV when done (prompt + expected outputs); 0: num_tokens
    tbt_s: float = 0.0  # its TBT target (0: none promised)


@dataclass(frozen=True)
class Decoding:
    """A running or rotated-out request whose TPOT is promised (plain data)."""

    tbt_s: float  # its TBT target
    num_gaps: int  # inter-token gaps its TPOT is judged over: its expected outputs - 1
    num_remaining: int  # output tokens still to come
    first_token_time: float | None = None  # engine clock; None while it prefills
    num_prefill_tokens: int = 0  # prompt tokens it still has to prefill
    slo_class: str | None = None
    num_final_tokens: int = 0  # its KV when done (prompt + expected outputs)


@dataclass(frozen=True)
class EngineLoad:
    """What admission reads about the engine at this moment (from its snapshot, plus the
    requests the event loop handed over that no published snapshot includes yet)."""

    queued: tuple[Queued, ...] = ()
    step_time_s: float = 0.0  # current time of one step
    prefill_s_per_token: float = 0.0  # measured prefill cost per prompt token
    prefill_s_per_pair: float = 0.0  # and per attention (query, key) pair (`PrefillCost`)
    num_batched_tokens: int = 512  # token budget of one step
    # with steps shaped by TBT: the prompt tokens a step carries for a class below
    # `shaping_class`, the most important one decoding (0: as num_batched_tokens)
    num_shaped_batched_tokens: int = 0
    shaping_class: str | None = None
    # the share of the time to a first token's deadline that the step producing it may
    # take when other prompts' chunks fill it (core/token_guard.py; 0: no guard)
    first_token_headroom: float = 0.0
    is_queue_by_deadline: bool = False  # the policy admits earliest deadline first
    is_preempt_by_swap: bool = False  # the policy makes room by rotating to the host tier
    block_size: int = 16
    num_free_device_blocks: int = 1 << 30
    num_free_host_blocks: int = 0
    num_host_blocks: int = 0  # the host pool's size (0: not known, not checked)
    num_reclaimable_host_blocks: int = 0  # host blocks that only cache device blocks
    host_admission_guard: float = 1.0  # host usage past which the policy admits no newcomer
    running_blocks_by_class: Mapping[str | None, int] = field(default_factory=dict)
    swapped_blocks_by_class: Mapping[str | None, int] = field(default_factory=dict)
    release_blocks_per_s: float = 0.0  # device blocks freed by finishing requests, recently
    host_drain_blocks_per_s: float = 0.0  # how fast the host tier's pinned blocks fall, recently
    prompt_tokens_per_s_by_class: Mapping[str | None, float] = field(default_factory=dict)
    requests_per_s_by_class: Mapping[str | None, float] = field(default_factory=dict)  # admitted
    decoding: tuple[Decoding, ...] = ()  # running and rotated-out requests
    decode_step_s: float = 0.0  # one step without prefill tokens (0: as step_time_s)
    now: float = 0.0  # the engine clock when this load was read
    num_device_blocks: int = 0  # the device pool's size (0: not known, not checked)
    decode_row_s: float = 0.0  # what one more decoding sequence adds to a step (0: unknown)
    step_left_s: float = 0.0  # until the step in flight ends (0: none, or not known)
    max_num_seqs: int = 0  # the running batch's seats (0: not known, not checked)
    running_by_class: Mapping[str | None, int] = field(default_factory=dict)  # requests
    swapped_by_class: Mapping[str | None, int] = field(default_factory=dict)
    finished_per_s: float = 0.0  # requests that ended per second, recently (seats freed)

    @property
    def decode_only_step_s(self) -> float:
        """One step without prompt tokens (the mean step while that is not measured): the
        pace of decoding, and the fastest a request's KV grows."""
        return self.decode_step_s or self.step_time_s

    @property
    def num_queued(self) -> int:
        return len(self.queued)

    @property
    def num_queued_tokens(self) -> int:
        return sum(q.num_tokens for q in self.queued)


@dataclass(frozen=True)
class FirstTokenEstimate:
    """Seconds from now to the first token, by part (raw: before the correction)."""

    compute_s: float
    memory_s: float  # the wait for device KV memory or a seat, whichever is longer
    stretch: float = 1.0  # 1 / (1 - the share of time higher classes' arrivals take)
    # with the first-token guard holding back the other prompts' chunks in the step that
    # produces this token: the part of `compute_s` they may still take, and the time the
    # guard holds that step to (inf: the guard is off or has no room to give)
    filler_s: float = 0.0
    guard_bound_s: float = math.inf

    @property
    def raw_s(self) -> float:
        return (self.compute_s + self.memory_s) * self.stretch

    def expected_s(self, corrected: Callable[[float], float]) -> float:
        """The first token as `corrected` (the learned correction of a raw estimate)
        expects it. A step the first-token guard holds to its bound ends by that bound, so
        the correction's margin applies only to the work before it and in it that the
        guard cannot hold back (the step in flight, the prompts ahead, this prompt): the
        correction, learned over every admitted request, would count the guard's own margin
        a second time on the fillers it already bounds."""
        expected_s = corrected(self.raw_s)
        # the guard holds back no higher class's prompts, nor the wait for memory
        if self.memory_s > 0 or self.stretch > 1.0 or not math.isfinite(self.guard_bound_s):
            return expected_s
        unheld_s = corrected(self.compute_s - self.filler_s)
        return max(unheld_s, min(expected_s, self.guard_bound_s))


@dataclass(frozen=True)
class TpotEstimate:
    """A new request's mean gap between tokens, and the promises its prefill would break."""

    tpot_s: float
    num_broken: int = 0  # decoding requests of its class or above it would push past budget
    num_committed_blocks: float = 0.0  # device KV promised with it (see `Estimator.tpot`)
    # the least room, as a share of its TPOT budget, that any promise still kept (every
    # class) has once this request joins: what a router weighs as the harm of placing it
    min_promise_slack: float = math.inf


class Estimator:
    """Estimates over an `EngineLoad`, in the class order of the server's SLO config."""

    def __init__(self, class_order: Sequence[str] = ()) -> None:
        self.ranks = {name: rank for rank, name in enumerate(class_order)}

    def rank(self, slo_class: str | None) -> int:
        """0 for the most important class; classless requests rank below all."""
        return self.ranks.get(slo_class or "", len(self.ranks))

    def queue_ahead(self, load: EngineLoad, slo_class: str | None, deadline: float) -> list[Queued]:
        """The queued requests the scheduler will admit before this one."""
        rank = self.rank(slo_class)
        ahead = []
        for queued in load.queued:
            other = self.rank(queued.slo_class)
            if other < rank or (other == rank and (not load.is_queue_by_deadline
                                                   or queued.deadline <= deadline)):  # fmt: skip
                ahead.append(queued)
        return ahead

    def step_budget(self, load: EngineLoad, slo_class: str | None) -> int:
        """The prompt tokens a step carries for a request of `slo_class`: the shaped budget
        below the class decoding that shapes the steps, the whole budget at or above it
        (the scheduler gives such a prompt its whole prefill when its TTFT is at risk)."""
        is_junior = self.rank(slo_class) > self.rank(load.shaping_class)
        if load.num_shaped_batched_tokens and is_junior:
            return min(load.num_batched_tokens, load.num_shaped_batched_tokens)
        return load.num_batched_tokens

    def first_token(
        self,
        load: EngineLoad,
        num_prompt_tokens: int,
        slo_class: str | None,
        deadline: float,
        num_cached_tokens: int = 0,
    ) -> FirstTokenEstimate:
        """`num_cached_tokens`: the prompt's prefix the device's prefix cache holds, whose
        keys its prefill reads but does not compute."""
        ahead = self.queue_ahead(load, slo_class, deadline)
        rank = self.rank(slo_class)
        prompts = [q.num_tokens for q in ahead]
        prompts += [d.num_prefill_tokens for d in load.decoding
                    if d.num_prefill_tokens and self.rank(d.slo_class) <= rank]  # fmt: skip
        num_prefill = sum(prompts) + num_prompt_tokens - num_cached_tokens
        budget = max(1, self.step_budget(load, slo_class))
        num_steps = -(-num_prefill // budget)
        # the prefill costs are a step's time beyond its decodes' (`PrefillCost`)
        step_s = load.decode_only_step_s
        # The load predates the step in flight, so its prompt chunks are in `step_left_s`
        # and still in `prompts`: counted twice, knowingly. Counted once, the estimates were
        # right at the median and precision fell under 98% at three of seven points
        # (docs/results/slo_promise/final_inflight_1207/): the margin is the promise's.
        compute_s = (load.step_left_s + sum(_prefill_s(load, n) for n in prompts)
                     + _prefill_s(load, num_prompt_tokens, num_cached_tokens)
                     + num_steps * step_s)  # fmt: skip
        # prompt work behind it fills what its last step has left of the budget: lower
        # classes' running prompts, the queue behind it, and arrivals meanwhile
        num_behind = sum(d.num_prefill_tokens for d in load.decoding
                         if self.rank(d.slo_class) > rank)  # fmt: skip
        num_behind += load.num_queued_tokens - sum(q.num_tokens for q in ahead)
        num_joining = min(num_steps * budget - num_prefill,
                          num_behind + self._not_higher_rate(load, slo_class) * compute_s)  # fmt: skip
        bound_s = load.first_token_headroom * (deadline - load.now)
        room_s = bound_s - compute_s
        is_guarded = load.first_token_headroom > 0 and room_s >= 0 and load.prefill_s_per_token > 0
        if is_guarded:  # the scheduler holds them to what keeps its deadline (`TokenGuard`)
            num_joining = min(num_joining, room_s / load.prefill_s_per_token)
        filler_s = num_joining * load.prefill_s_per_token
        compute_s += filler_s
        num_needed = sum(_blocks(q.num_tokens, load.block_size) for q in ahead)
        num_needed += _blocks(num_prompt_tokens, load.block_size)
        num_needed += self._split_by_rank(load.swapped_blocks_by_class, slo_class)[0]
        deficit = num_needed - self._num_available_blocks(load, slo_class)
        memory_s = _memory_wait_s(deficit, load.release_blocks_per_s)
        if not self._split_by_rank(load.running_blocks_by_class, slo_class)[1]:
            # the policy's host guard holds it back (a lower class running lets it pass)
            host_wait_s = _memory_wait_s(_host_guard_deficit(load), load.host_drain_blocks_per_s)
            memory_s = max(memory_s, host_wait_s)
        memory_s = max(memory_s, self._seat_wait_s(load, slo_class, len(ahead)))
        stretch = 1.0 / (1.0 - self._higher_share(load, slo_class))
        return FirstTokenEstimate(compute_s, memory_s, stretch, filler_s,
                                  bound_s if is_guarded else math.inf)  # fmt: skip

    def tpot(
        self,
        load: EngineLoad,
        num_prompt_tokens: int,
        max_tokens: int,
        slo_class: str | None,
        deadline: float,
        tbt_s: float = 0.0,
        headroom: float = 1.0,
        num_cached_tokens: int = 0,
    ) -> TpotEstimate:
        """The mean gap between `max_tokens` tokens of a new request, and how many decoding
        requests its prompt (less the `num_cached_tokens` the prefix cache holds) would push
        past `headroom` times their TPOT budget."""
        # the step once the queued requests and this one join the batch, by the per-row cost
        step_s = load.decode_only_step_s + load.num_queued * load.decode_row_s
        step_after_s = step_s + load.decode_row_s
        chunk_s = load.num_batched_tokens * load.prefill_s_per_token  # the most one step carries
        queued_s = sum(_prefill_s(load, q.num_tokens) for q in load.queued)
        pending_s = queued_s + sum(_prefill_s(load, d.num_prefill_tokens) for d in load.decoding)
        new_s = _prefill_s(load, num_prompt_tokens, num_cached_tokens)
        rank = self.rank(slo_class)
        num_broken, min_slack = 0, math.inf
        for d in load.decoding:
            if d.num_remaining <= 0:
                continue
            spent_s = load.now - d.first_token_time if d.first_token_time is not None else 0.0
            cap_s = d.num_remaining * chunk_s
            whole_s = d.tbt_s * max(1, d.num_gaps)
            budget_s = headroom * whole_s
            before_s = spent_s + d.num_remaining * step_s + min(pending_s, cap_s)
            if before_s > whole_s:  # broken already, wherever this request goes
                continue
            after_s = spent_s + d.num_remaining * step_after_s + min(pending_s + new_s, cap_s)
            min_slack = min(min_slack, (budget_s - after_s) / budget_s)
            num_broken += after_s > budget_s and self.rank(d.slo_class) <= rank
        committed = self._committed_blocks(load, slo_class, step_after_s / headroom)
        committed += _duty(step_after_s / headroom, tbt_s) * _blocks(
            num_prompt_tokens + max_tokens - 1, load.block_size)  # fmt: skip
        if max_tokens <= 1:  # one token, or a length unknown: the gap is a step's
            return TpotEstimate(step_after_s, num_broken, committed, min_slack)
        num_gaps = max_tokens - 1
        ahead_s = sum(_prefill_s(load, q.num_tokens)
                      for q in self.queue_ahead(load, slo_class, deadline))  # fmt: skip
        behind_s = queued_s - ahead_s  # prefilled during its decode
        tpot_s = step_after_s + min(behind_s, num_gaps * chunk_s) / num_gaps
        return TpotEstimate(tpot_s, num_broken, committed, min_slack)

    def _committed_blocks(self, load: EngineLoad, slo_class: str | None, step_s: float) -> float:
        """Device blocks the admitted requests of this class and above hold when done,
        each weighted by the share of steps it must be resident for: a request that needs
        a token every `tbt_s` can sit out all but `step_s / tbt_s` of the steps in the
        host tier (RotaSched's rotation), so a loose TBT promises less device memory."""
        rank = self.rank(slo_class)
        finals = [(d.slo_class, d.tbt_s, d.num_final_tokens) for d in load.decoding]
        finals += [(q.slo_class, q.tbt_s, q.num_final_tokens or q.num_tokens) for q in load.queued]
        return sum(_duty(step_s, tbt_s) * _blocks(num_final - 1, load.block_size)
                   for name, tbt_s, num_final in finals if self.rank(name) <= rank)  # fmt: skip

    def _not_higher_rate(self, load: EngineLoad, slo_class: str | None) -> float:
        """Prompt tokens per second arriving of this class and those below (the classes
        above are the stretch's)."""
        rank = self.rank(slo_class)
        return sum(tokens_per_s for name, tokens_per_s in load.prompt_tokens_per_s_by_class.items()
                   if self.rank(name) >= rank)  # fmt: skip

    def _higher_share(self, load: EngineLoad, slo_class: str | None) -> float:
        """The share of time more important classes' new prompts take, at most
        `MAX_HIGHER_SHARE` (past it the wait is long, not infinite)."""
        rank = self.rank(slo_class)
        rate = sum(tokens_per_s for name, tokens_per_s in load.prompt_tokens_per_s_by_class.items()
                   if self.rank(name) < rank)  # fmt: skip
        return min(MAX_HIGHER_SHARE, rate * load.prefill_s_per_token)

    def kv_commitment(
        self,
        load: EngineLoad,
        num_prompt_tokens: int,
        max_tokens: int,
        slo_class: str | None,
        classes_offered: Collection[str | None] = (),
        tbt_s: float = 0.0,
        ttft_deadline: float = math.inf,
    ) -> tuple[int, int]:
        """(KV blocks the admitted requests, every class, and this one, with TBT target
        `tbt_s` and first token due at `ttft_deadline`, hold at once at most if every
        promise is kept (`kv_peak.py`); the blocks this request's class may commit: the
        device pool, and `HOST_COMMIT_SHARE` of the host tier up to the policy's guard when
        the policy rotates (the rest is room to rotate in, which only the most important
        class asking may commit, when lower classes are asking too), less
        `KV_HEADROOM_PER_CLASS` for each class above it among `classes_offered`, those
        arriving lately). Past the whole,
        some admitted request would have to be dropped and recomputed to make room: a
        promise broken. The headroom keeps room for the classes above that are asking for
        it: under overload bronze is refused before gold is."""
        new = Queued(ttft_deadline, num_prompt_tokens, slo_class,
                     num_prompt_tokens + max(1, max_tokens), tbt_s)  # fmt: skip
        num_committed = peak_kv_blocks(kv_holds(load, (*load.queued, new)), load.decode_only_step_s,
                                       load.block_size)  # fmt: skip
        rank = self.rank(slo_class)
        num_above = sum(1 for name in set(classes_offered) if self.rank(name) < rank)
        # the most important class asking, with lower ones asking too, may commit the
        # rotation room as well: it makes room for itself by rotating theirs out
        is_top = not num_above and any(self.rank(name) > rank for name in classes_offered)
        host_share = 1.0 if is_top else HOST_COMMIT_SHARE
        num_host = math.floor(host_share * load.host_admission_guard * load.num_host_blocks)
        num_capacity = load.num_device_blocks + (num_host if load.is_preempt_by_swap else 0)
        share = max(0.0, 1.0 - KV_HEADROOM_PER_CLASS * num_above)
        return num_committed, math.floor(share * num_capacity)

    def finish_s(self, load: EngineLoad, first_token_s: float, max_tokens: int) -> float:
        """Seconds from now to the last token: the first, then a step per token."""
        return first_token_s + max(0, max_tokens - 1) * load.step_time_s

    def _seat_wait_s(self, load: EngineLoad, slo_class: str | None, num_ahead: int) -> float:
        """The wait for a seat in the running batch (`max_num_seqs`): the running requests
        of this class and above, its rotated-out ones and the queue ahead (they are seated
        first) and this one, beyond the seats, over the rate requests finish less the rate
        more important classes are admitted (their newcomers take the seats that free up
        first). A lower class's seat is as good as free: the scheduler displaces it, as for
        memory. Where
        memory is large, the seats bind first (at GH200 scale with 256 seats, admitted
        bronze requests waited 54 s for one: docs/results/sim/classes_gh200_1207/)."""
        if not load.max_num_seqs:
            return 0.0
        num_seated = self._split_by_rank(load.running_by_class, slo_class)[0]
        num_returning = self._split_by_rank(load.swapped_by_class, slo_class)[0]
        num_deficit = num_seated + num_returning + num_ahead + 1 - load.max_num_seqs
        rank = self.rank(slo_class)
        higher_per_s = sum(rate for name, rate in load.requests_per_s_by_class.items()
                           if self.rank(name) < rank)  # fmt: skip
        return _memory_wait_s(num_deficit, load.finished_per_s - higher_per_s)

    def _num_available_blocks(self, load: EngineLoad, slo_class: str | None) -> int:
        """Free device blocks, plus all of a lower class's running ones: the scheduler
        rotates them to the host tier to make room, or drops them for recompute when it is
        full. A request of the same class is never displaced to admit a new one sure to be
        kept (ddps may, by urgency; the estimate does not count on it)."""
        return load.num_free_device_blocks + self._split_by_rank(
            load.running_blocks_by_class, slo_class)[1]  # fmt: skip

    def _split_by_rank(
        self, count_by_class: Mapping[str | None, int], slo_class: str | None
    ) -> tuple[int, int]:
        """A count by class (blocks, requests) split in two: (this class and those above,
        the classes below)."""
        rank = self.rank(slo_class)
        num_at_or_above = num_below = 0
        for name, count in count_by_class.items():
            if self.rank(name) > rank:
                num_below += count
            else:
                num_at_or_above += count
        return num_at_or_above, num_below


def kv_holds(load: EngineLoad, queued: Sequence[Queued]) -> list[KvHold]:
    """The KV of `load`'s decoding requests and of `queued` over the time ahead: what each
    holds now (a queued one, its prompt), its final size, and when its kept promise frees
    it (a request past its promise is freed no sooner than a step per remaining token)."""
    step_s = load.decode_only_step_s
    holds = []
    for d in load.decoding:
        if d.first_token_time is None:  # still prefilling: its prompt's rest, then a step
            start_s = d.num_prefill_tokens * load.prefill_s_per_token + step_s
        else:
            start_s = d.first_token_time - load.now
        finish_s = promised_finish_s(start_s, d.num_gaps + 1, d.tbt_s)
        holds.append(KvHold(d.num_final_tokens - d.num_remaining, d.num_final_tokens,
                            max(finish_s, d.num_remaining * step_s)))  # fmt: skip
    for q in queued:
        num_final = q.num_final_tokens or q.num_tokens
        finish_s = promised_finish_s(max(0.0, q.deadline - load.now), num_final - q.num_tokens,
                                     q.tbt_s)  # fmt: skip
        holds.append(KvHold(q.num_tokens, num_final, finish_s))
    return holds


def _pairs(num_tokens: int) -> float:
    """Attention (query, key) pairs of a causal prefill of the first `num_tokens` tokens."""
    return num_tokens * (num_tokens + 1) / 2


def _prefill_s(load: EngineLoad, num_tokens: int, num_cached_tokens: int = 0) -> float:
    """A prompt's prefill at `load`'s costs: its tokens past the cached prefix, and their
    attention pairs (a pending prompt whose prefix is not known: at least its own)."""
    num_pairs = _pairs(num_tokens) - _pairs(num_cached_tokens)
    return ((num_tokens - num_cached_tokens) * load.prefill_s_per_token
            + num_pairs * load.prefill_s_per_pair)  # fmt: skip


def _blocks(num_tokens: int, block_size: int) -> int:
    return -(-(num_tokens + 1) // max(1, block_size))  # and the first output token's slot


def _duty(step_s: float, tbt_s: float) -> float:
    """The share of steps a request with TBT target `tbt_s` must be on the device for."""
    return 1.0 if tbt_s <= 0 else min(1.0, step_s / tbt_s)


def _host_guard_deficit(load: EngineLoad) -> int:
    """Host blocks to be released before the policy admits a brand-new request again (its
    host guard: rotasched keeps the last 10% of the host tier for rotation)."""
    if load.host_admission_guard >= 1.0 or load.num_host_blocks <= 0:
        return 0
    num_used = num_pinned_host_blocks(
        load.num_host_blocks, load.num_free_host_blocks, load.num_reclaimable_host_blocks
    )
    return num_used - math.floor(load.host_admission_guard * load.num_host_blocks)


def _memory_wait_s(num_deficit_blocks: int, blocks_per_s: float) -> float:
    if num_deficit_blocks <= 0:
        return 0.0
    if blocks_per_s <= 0:
        return UNKNOWN_MEMORY_WAIT_S
    return num_deficit_blocks / blocks_per_s


class TokenRate:
    """Prompt tokens admitted per second, by class, over the last `window_s` seconds (over
    the time since the first admission while that is shorter, but at least a quarter of
    the window: a server that just started is not taken to have idled before)."""

    def __init__(self, window_s: float = 20.0) -> None:
        self.window_s = window_s
        self._admitted: deque[tuple[float, str | None, int]] = deque()
        self._start: float | None = None  # the first admission seen

    def add(self, now: float, slo_class: str | None, num_tokens: int) -> None:
        self._admitted.append((now, slo_class, num_tokens))
        if self._start is None:
            self._start = now
        self._forget(now)  # bounded whether or not anyone reads the rates

    def rates(self, now: float) -> dict[str | None, float]:
        self._forget(now)
        totals: dict[str | None, float] = {}
        for _, slo_class, num_tokens in self._admitted:
            totals[slo_class] = totals.get(slo_class, 0.0) + num_tokens
        span_s = self.window_s
        if self._start is not None:
            span_s = min(self.window_s, max(self.window_s / 4, now - self._start))
        return {name: total / span_s for name, total in totals.items()}

    def _forget(self, now: float) -> None:
        while self._admitted and self._admitted[0][0] < now - self.window_s:
            self._admitted.popleft()


class ReleaseRate:
    """Device blocks freed per second by requests that ended, over the last `window_s`
    seconds, from the engine's running count of released blocks."""

    def __init__(self, window_s: float = 20.0) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def update(self, now: float, num_released: int) -> float:
        samples = self._samples
        samples.append((now, num_released))
        while len(samples) > 2 and now - samples[0][0] > self.window_s:
            samples.popleft()
        elapsed = now - samples[0][0]
        return (num_released - samples[0][1]) / elapsed if elapsed > 0 else 0.0


class DrainRate(ReleaseRate):
    """How fast a level falls (the host tier's pinned blocks): its drop per second over the
    last `window_s` seconds, 0 while it held or rose."""

    def update(self, now: float, level: int) -> float:  # type: ignore[override]
        return max(0.0, -super().update(now, level))


def num_pinned_host_blocks(num_host_blocks: int, num_free: int, num_reclaimable: int) -> int:
    """Host blocks in use that the tier cannot drop: what the host guard counts."""
    return num_host_blocks - num_free - num_reclaimable


class PrefillCost:
    """What prefill costs in the steps the engine serves, learned as they run: seconds per
    prompt token and per attention (query, key) pair, the least-squares fit (no intercept,
    neither negative) of the last `window` steps that carried at least `min_tokens` prompt
    tokens, each step's time less a decode step's. Until `min_samples` such steps, the fit of
    the warm-up's `seeds` (num_tokens, num_pairs, seconds), else its `prior_s_per_token` (an
    idle engine's whole prompt; pairs not priced apart). The seeds stay in the window until
    served steps push them out: the first served prefills are mostly short, and a fit of
    short prompts alone cannot price a long prompt's attention pairs.

    Served steps share the machine with the HTTP front, tokenization and the clients, and
    carry decodes and long prompts' later chunks: an idle warm-up's one prompt says less
    about them than the steps themselves do.
    """

    def __init__(self, prior_s_per_token: float = 0.0, window: int = 128, min_samples: int = 8,
                 min_tokens: int = 32,
                 seeds: Sequence[tuple[float, float, float]] = ()) -> None:  # fmt: skip
        self.prior_s_per_token = prior_s_per_token
        self.min_samples, self.min_tokens = min_samples, min_tokens
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=window)
        self.per_token_s, self.per_pair_s = prior_s_per_token, 0.0
        for num_tokens, num_pairs, seconds in seeds:
            self._samples.append((float(num_tokens), float(num_pairs), max(0.0, seconds)))
        if self._samples:
            self.per_token_s, self.per_pair_s = _fit_two(self._samples)

    def observe(self, num_tokens: int, num_pairs: float, excess_s: float) -> None:
        """One served step with `num_tokens` prompt tokens making `num_pairs` attention
        pairs, which took `excess_s` longer than a step of its decodes alone."""
        if num_tokens < self.min_tokens or not math.isfinite(excess_s):
            return
        self._samples.append((float(num_tokens), float(num_pairs), max(0.0, excess_s)))
        if len(self._samples) >= self.min_samples:
            self.per_token_s, self.per_pair_s = _fit_two(self._samples)

    def observe_step(self, shape: BatchShape, step_s: float, decode_step_s: float) -> None:
        """One served step of `shape` that took `step_s`; `decode_step_s` is the recent
        decode-only step (its decodes' part: none when it had none)."""
        decode_s = decode_step_s if shape.num_decode_tokens else 0.0
        self.observe(shape.num_prefill_tokens, shape.num_prefill_pairs, step_s - decode_s)

    def step_s(self, shape: BatchShape, decode_step_s: float) -> float:
        """The time of a step of `shape` at these costs (`observe_step`'s inverse): its
        decodes' part, `decode_step_s` (none when it has none), and its prompt tokens' and
        attention pairs'."""
        decode_s = decode_step_s if shape.num_decode_tokens else 0.0
        return (decode_s + shape.num_prefill_tokens * self.per_token_s
                + shape.num_prefill_pairs * self.per_pair_s)  # fmt: skip


def _fit_two(samples: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(a, b) >= 0 minimizing the sum of (a x + b y - t)^2 over (x, y, t)."""
    sxx = sum(x * x for x, _, _ in samples)
    syy = sum(y * y for _, y, _ in samples)
    sxy = sum(x * y for x, y, _ in samples)
    sxt = sum(x * t for x, _, t in samples)
    syt = sum(y * t for _, y, t in samples)
    det = sxx * syy - sxy * sxy
    if det <= 1e-12 * sxx * syy:
        # steps of one shape (pairs proportional to tokens) cannot tell the two costs apart;
        # price the tokens, as the warm-up's prior does. Comparing the two one-feature fits
        # here would pick by rounding: their errors are equal.
        return (max(0.0, sxt / sxx) if sxx else 0.0), 0.0
    a, b = (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
    if a >= 0 and b >= 0:
        return a, b
    # one feature alone, the other at 0: whichever leaves the smaller squared error
    fits = [(max(0.0, sxt / sxx) if sxx else 0.0, 0.0), (0.0, max(0.0, syt / syy) if syy else 0.0)]
    return min(fits, key=lambda ab: sum((ab[0] * x + ab[1] * y - t) ** 2 for x, y, t in samples))


class Correction:
    """Learned ratios of measured to estimated TTFT, per class.

    `factor(cls)` is the `quantile` of the last `window` ratios of that class, clamped to
    [`low`, `high`]. Until the class has `min_samples` of its own it borrows the factor of
    the ratios of its class and the classes above it in `class_order` (a rare gold class
    learns from nothing below it: a lower class's first tokens also wait for the chunks
    the guards hold back for the classes above, which a gold request never does; a request
    without a class, or of a class not in the order, ranks below all), and 1 until those
    have `min_samples`. Estimates below `floor_s` are compared as `floor_s`: a near-idle
    engine's few milliseconds of estimate say little about its error, and must not blow
    the ratio up. A first token served within `floor_s` counts as a ratio of at least 1:
    its ratio to the floor is small only because the request was, and a near-idle engine's
    many short prompts would otherwise pull the factor down and make the estimate of a
    long prompt optimistic. It still counts as a sample, so a class keeps its own factor.
    """

    def __init__(
        self,
        quantile: float = 0.9,
        window: int = 200,
        min_samples: int = 20,
        floor_s: float = 0.1,
        low: float = 0.5,
        high: float = 10.0,
        class_order: Sequence[str] = (),
    ) -> None:
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
        self.quantile, self.window, self.min_samples = quantile, window, min_samples
        self.floor_s, self.low, self.high = floor_s, low, high
        self.class_order = tuple(class_order)
        self._ratios: dict[str | None, deque[float]] = {}
        self._factors: dict[str | None, float] = {}  # the classes with enough samples
        self._borrowed: dict[str | None, float | None] = {}  # the others', computed once

    def observe(self, slo_class: str | None, estimated_s: float, measured_s: float) -> None:
        """One admitted request's raw estimate and measured TTFT (both from admission)."""
        if not (math.isfinite(estimated_s) and math.isfinite(measured_s)) or measured_s < 0:
            return
        ratio = measured_s / max(estimated_s, self.floor_s)
        if measured_s < self.floor_s:
            ratio = max(ratio, 1.0)  # within the floor: no error seen at a target's scale
        ratios = self._ratios.setdefault(slo_class, deque(maxlen=self.window))
        ratios.append(ratio)
        if len(ratios) >= self.min_samples:
            self._factors[slo_class] = self._quantile(ratios)
        self._borrowed.clear()

    def _rank(self, slo_class: str | None) -> int:
        order = self.class_order
        return order.index(slo_class) if slo_class in order else len(order)

    def _quantile(self, ratios: Collection[float]) -> float:
        ordered = sorted(ratios)
        value = ordered[min(len(ordered) - 1, int(self.quantile * len(ordered)))]
        return min(self.high, max(self.low, value))

    def learned(self, slo_class: str | None) -> float | None:
        """The class's own factor, or the one it borrows; None: nothing learned for it."""
        if slo_class in self._factors:
            return self._factors[slo_class]
        if slo_class not in self._borrowed:
            rank = self._rank(slo_class)
            ratios = [r for name, rs in self._ratios.items() if self._rank(name) <= rank
                      for r in rs]  # fmt: skip
            is_enough = len(ratios) >= self.min_samples
            self._borrowed[slo_class] = self._quantile(ratios) if is_enough else None
        return self._borrowed[slo_class]

    def factor(self, slo_class: str | None) -> float:
        """The class's learned factor (its own, or the one it borrows; 1 until either)."""
        learned = self.learned(slo_class)
        return 1.0 if learned is None else learned

    def corrected_s(self, slo_class: str | None, raw_s: float) -> float:
        """The TTFT to expect for a raw estimate of `raw_s`: the learned quantile ratio
        times the estimate taken at the floor, as the ratios were; `raw_s` itself until
        the class has a factor."""
        learned = self.learned(slo_class)
        return raw_s if learned is None else learned * max(raw_s, self.floor_s)

    def applied(self, class_names: Sequence[str]) -> dict[str, float]:
        """The factor each of `class_names` and class-less requests ("none") have their
        estimates scaled by now: a class's own, or the one it borrows; empty until one is
        learned."""
        if not self._factors and self.learned(None) is None:
            return {}
        return {name or "none": self.factor(name) for name in (*class_names, None)}
