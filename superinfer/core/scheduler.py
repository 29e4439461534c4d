"""The token-budget scheduler: one loop for prefill chunks, decodes and resumptions.

Each step, running requests get tokens first (in the policy's order), preempting the
policy's victims when device memory runs short; then, if nobody was preempted, queued
requests (waiting and swapped) are admitted in class order, then the policy's, until the
token budget, `max_num_seqs` or memory runs out. The caller passes the time. With the
first-token or TBT guard (and a ready step-time model), a step carries only as much of
the other prompts as keeps the first tokens it produces within their TTFT deadlines, or
the decodes' mean gaps within their TBT targets (`token_guard.py`).

Steps shaped by TBT promises (with a ready step-time model): the step may take as long as
the tightest next-token deadline among the running decodes allows (`_step_limit`).
Requests of the most important class running whose next token is due within two such
steps are always in it; the others (due ones of lower classes included: the tighter the
class, the surer its promise), and prefill chunks, join only while the predicted step time
stays within the limit, so a request with a loose target (bronze: a token a second) sits
out steps instead of slowing every one of them. A decode of any class whose next token is
overdue is in regardless, running or rotated out (then it is swapped back in ahead of the
queue's prompts): it costs the step one row, and an admitted promise is never starved by
more important work, only served at the latest moment its target allows.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.config import SchedulerConfig
from superinfer.core.kv.errors import KVInvariantError
from superinfer.core.kv.manager import TwoTierKVManager
from superinfer.core.outputs import ModelOutput, RequestUpdate, ScheduledSequence, SchedulerOutput
from superinfer.core.policies import MemoryState, SchedulingPolicy
from superinfer.core.request import PLACEHOLDER, Request, RequestStatus
from superinfer.core.reservations import ClassReservations
from superinfer.core.step_time import (
    BatchShape,
    ShapeBuilder,
    StepTimePredictor,
    largest_that_fits,
    step_seconds,
)
from superinfer.core.token_guard import GUARD_HEADROOM, TokenGuard

_MAX_GAP_TBTS = 2.0  # the longest gap a shaped step plans for a request, in its TBT targets
_MIN_GAP_TBTS = 0.5  # the shortest, when it makes up for a long gap


@dataclass
class SchedulerStats:
    num_steps: int = 0
    num_preemptions: int = 0  # recompute preemptions
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    num_proactive_rotations: int = 0  # swap-outs decided before memory ran short
    num_released_blocks: int = 0  # device blocks freed by requests that ended
    num_finished: int = 0  # requests that ended (each gave back its seat of max_num_seqs)


class _StepPlan:
    """Requests scheduled in the step being built, with their token counts."""

    def __init__(
        self,
        token_budget: int,
        reservations: ClassReservations,
        step_model: StepTimePredictor | None = None,
        limit_s: float | None = None,
    ) -> None:
        self.num_tokens: dict[str, int] = {}
        self.token_budget = token_budget
        self.reservations = reservations
        self.step_model = step_model
        self.limit_s = limit_s  # the most the step may take; None: no time limit
        self.limit_rank = 0  # the most important class among the decodes that set the limit
        self.token_guard: TokenGuard | None = None
        self.waiting_that_fit: list[Request] | None = None  # Scheduler._fitting's memo
        self.shape = ShapeBuilder()
        self._shape_of: dict[str, tuple[int, int, bool]] = {}
        self.swap_in_ids: list[int] = []
        self.preempted: list[str] = []
        self.swapped_out: list[str] = []
        self.num_reactive_preemptions = 0  # forced by memory while serving running requests

    def add(self, request: Request, num_tokens: int) -> None:
        self.num_tokens[request.request_id] = num_tokens
        if self.token_guard is not None:
            self.token_guard.on_added(request.request_id)
        self.token_budget -= num_tokens
        entry = _shape_entry(request, num_tokens)
        self._shape_of[request.request_id] = entry
        self.shape.add(*entry)
        if self.reservations.is_enabled:
            self.reservations.on_scheduled(request, num_tokens)

    def num_tokens_for(self, request: Request) -> int:
        """Tokens `request` may get now: what it lacks, within its share of the budget."""
        budget = self.token_budget
        if self.reservations.is_enabled:
            budget -= self.reservations.num_tokens_kept(request)
        return max(0, min(request.num_uncomputed_tokens, budget))

    def remove(self, request: Request) -> None:
        self.token_budget += self.num_tokens.pop(request.request_id, 0)
        entry = self._shape_of.pop(request.request_id, None)
        if entry is not None:
            self.shape.remove(*entry)

    def fits(self, request: Request, num_tokens: int) -> bool:
        """The predicted step time stays within the limit with `request`'s tokens in (the
        first sequence of a step always fits: a step is never empty while there is work)."""
        if self.limit_s is None or self.step_model is None or not self.shape.num_seqs:
            return True
        shape = self.shape.shape(*_shape_entry(request, num_tokens))
        return step_seconds(self.step_model, shape) <= self.limit_s

    def num_fill_tokens(self, request: Request, rank: int, num_tokens: int) -> int:
        """What the token guard leaves a prompt chunk (all of it when it holds none back)."""
        guard = self.token_guard
        if guard is None or not num_tokens or not guard.is_filler(request, rank):
            return num_tokens
        return guard.num_tokens(request, rank, num_tokens, self.shape, self.token_budget)

    def num_tokens_that_fit(self, request: Request, num_tokens: int) -> int:
        """The largest chunk of at most `num_tokens` that keeps the step within the limit
        (step time grows with tokens: bisection)."""
        return largest_that_fits(num_tokens, lambda n: self.fits(request, n))

    @property
    def has_prefill(self) -> bool:
        return self.shape.num_prefill_tokens > 0


def _shape_entry(request: Request, num_tokens: int) -> tuple[int, int, bool]:
    start = request.num_computed_tokens
    return num_tokens, start, start + num_tokens == request.num_tokens


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: TwoTierKVManager,
        policy: SchedulingPolicy,
        step_model: StepTimePredictor | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.policy = policy
        # what steps are shaped by: the engine's online model or the simulator's predictor
        self.step_model = step_model
        kv.is_eager_writeback = policy.is_eager_writeback
        self.requests: dict[str, Request] = {}  # unfinished requests
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.stats = SchedulerStats()
        self.reservations = ClassReservations(
            config.class_reservations,
            kv.device.num_blocks,
            config.max_num_batched_tokens,
            config.class_order,
        )
        self._num_admissions = 0
        self._finished_ids: list[str] = []

    # --- requests in and out --------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.num_prompt_tokens >= self.config.max_model_len:
            raise ValueError(
                f"prompt of {request.num_prompt_tokens} tokens leaves no room to generate "
                f"within max_model_len={self.config.max_model_len}"
            )
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str, now: float) -> Request | None:
        """Abort an unfinished request; its blocks in both tiers are released."""
        request = self.requests.get(request_id)
        if request is not None:
            self._finish(request, RequestStatus.FINISHED_ABORTED, now)
        return request

    def finish_request(self, request_id: str, status: RequestStatus, now: float) -> None:
        """Finish a request from outside (the engine's stop-string check)."""
        request = self.requests.get(request_id)
        if request is not None:
            self._finish(request, status, now)

    def _finish(self, request: Request, status: RequestStatus, now: float) -> None:
        self._queue_of(request).remove(request)
        del self.requests[request.request_id]
        self.stats.num_released_blocks += self.kv.num_device_blocks_of(request)
        self.stats.num_finished += 1
        self.kv.free(request)
        request.status = status
        request.finished_time = now
        self._finished_ids.append(request.request_id)

    def _queue_of(self, request: Request) -> list[Request]:
        return {
            RequestStatus.WAITING: self.waiting,
            RequestStatus.RUNNING: self.running,
            RequestStatus.SWAPPED: self.swapped,
        }[request.status]

    @property
    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.requests)

    # --- transfers ------------------------------------------------------------------------
    def complete_transfers(self, transfer_ids: list[int]) -> None:
        self.kv.complete_transfers(transfer_ids)

    # --- one step -------------------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        self.stats.num_steps += 1
        plan = _StepPlan(self.config.max_num_batched_tokens, self.reservations,
                         self.step_model, self._step_limit(now))  # fmt: skip
        if plan.limit_s is not None:
            plan.limit_rank = min(self.reservations.rank(r) for r in self.running
                                  if r.last_token_time is not None)  # fmt: skip
        if self.reservations.is_enabled:
            self.reservations.begin_step(
                self.running, self.requests.values(), self.kv.num_device_blocks_of
            )
        self._rotate_proactively(plan, now)
        plan.token_guard = self._token_guard(plan, now)
        self._schedule_running(plan, now)
        if not plan.num_reactive_preemptions:
            self._schedule_queue(plan, now)
        return self._build_output(plan)

    def _token_guard(self, plan: _StepPlan, now: float) -> TokenGuard | None:
        """The limits this step's fillers are held to (`token_guard.py`): the prompts
        get the budget class first, running ones before queued ones that fit memory."""
        model = self.step_model
        is_ttft_guarded, is_tbt_guarded = self.config.first_token_guard, self.config.tbt_guard
        if model is None or not model.is_ready or not (is_ttft_guarded or is_tbt_guarded):
            return None  # checked first: built every step
        decodes = [r for r in self.running if r.is_prefill_done]
        prompts = [r for r in self.running if not r.is_prefill_done] + self._fitting(plan)
        prompts.sort(key=self.reservations.rank)  # stable: running first within a class
        return TokenGuard.build(model, now, decodes, prompts, self.config.max_num_batched_tokens,
                                self.reservations.rank, is_ttft_guarded, is_tbt_guarded)  # fmt: skip

    def first_token_headroom(self) -> float:
        """The share of the time to a first token's deadline a step that produces it may
        take when other prompts' chunks fill it (`token_guard.py`); 0: no guard (not
        configured, or no ready step-time model)."""
        model = self.step_model
        is_on = self.config.first_token_guard and model is not None and model.is_ready
        return GUARD_HEADROOM if is_on else 0.0

    # --- steps shaped by TBT promises --------------------------------------------------------
    def _step_limit(self, now: float) -> float | None:
        """The most this step may take: until the tightest next-token deadline among the
        running decodes, but never less than a step of the decodes already overdue (late
        requests are served, not starved by ever shorter steps). None: no shaping."""
        if not self.is_shaping_steps:
            return None
        decodes = [r for r in self.running if r.last_token_time is not None]
        if not decodes:
            return None
        deadlines = [self._token_deadline(r) for r in decodes]
        overdue = [r for r, deadline in zip(decodes, deadlines) if deadline <= now]
        return max(min(deadlines) - now, self._decode_step_s(overdue or decodes[:1]))

    @property
    def is_shaping_steps(self) -> bool:
        """Steps are shaped by TBT promises (configured, and the step model is ready)."""
        model = self.step_model
        return self.config.tbt_shaped_steps and model is not None and model.is_ready

    def shaping_class(self) -> str | None:
        """The most important class among the running decodes: a prompt of it or above
        gets its whole prefill in a shaped step when only that keeps its TTFT; the prompts
        below it get what `num_prefill_tokens_per_step` says. None when steps are not
        shaped (no class slows another's prompts then)."""
        if not self.is_shaping_steps:
            return None
        decodes = [r for r in self.running if r.last_token_time is not None]
        senior = min(decodes, key=self.reservations.rank, default=None)
        return senior.slo.slo_class if senior is not None else None

    def num_prefill_tokens_per_step(self) -> int:
        """The prompt tokens a shaped step carries beside the running decodes for a prompt
        below `shaping_class`: those that fit under the tightest TBT promise among them, a
        decode with a looser target counted in the share of steps it must join (at least
        a block's worth; the configured budget when steps are not shaped). Admission
        prices such a prompt's queue at this rate: a gold request decoding slows every
        bronze prompt behind it, and the estimate must know."""
        budget, model = self.config.max_num_batched_tokens, self.step_model
        if not self.is_shaping_steps or model is None:  # checked first: built every step
            return budget
        decodes = [r for r in self.running if r.last_token_time is not None]
        if not decodes:
            return budget
        tightest_s = min(r.slo.tbt_s for r in decodes)
        limit_s = self.config.tbt_headroom * tightest_s
        num_rows = max(1, round(sum(tightest_s / r.slo.tbt_s for r in decodes)))
        context = sum(r.num_computed_tokens + 1 for r in decodes) * num_rows // len(decodes)

        def step_s(num_tokens: int) -> float:
            pairs = num_tokens * (num_tokens + 1) / 2
            shape = BatchShape(num_rows + 1, num_tokens, num_rows, num_rows + 1, pairs, context, 0)
            return step_seconds(model, shape)

        return max(largest_that_fits(budget, lambda n: step_s(n) <= limit_s), self.kv.block_size)

    def _decode_step_s(self, requests: list[Request]) -> float:
        """The predicted time of a step of one decode token for each of `requests`."""
        assert self.step_model is not None
        num = len(requests)
        context = sum(r.num_computed_tokens + 1 for r in requests)
        return step_seconds(self.step_model, BatchShape(num, 0, num, num, 0.0, context, 0))

    def _token_deadline(self, request: Request) -> float:
        """When `request`'s next token is due. TPOT is judged on the mean, so the deadline
        keeps the mean gap within the TBT target (with the configured headroom): slack
        banked by short steps lets a step stretch to fit a larger prefill chunk, and a long
        gap (a prefill, a rotation) is made up by shorter steps. Bounded to half a TBT and
        `_MAX_GAP_TBTS` TBTs after its last token: one that cannot catch up does not
        starve the rest, and banked slack never becomes a stall."""
        assert request.last_token_time is not None and request.first_token_time is not None
        tbt_s = self.config.tbt_headroom * request.slo.tbt_s
        last = request.last_token_time
        on_mean = request.first_token_time + tbt_s * len(request.output_token_times)
        return min(max(on_mean, last + _MIN_GAP_TBTS * tbt_s), last + _MAX_GAP_TBTS * tbt_s)

    def _shaped_order(self, request: Request, plan: _StepPlan, now: float) -> int:
        """Due decodes take a shaped step first (the limit was set to fit them), then
        prompt chunks, then decodes that may sit the step out."""
        if not request.is_prefill_done:
            return 1
        return 0 if self._is_due(request, plan, now) else 2

    def _is_due(self, request: Request, plan: _StepPlan, now: float) -> bool:
        """Its next token cannot wait for the step after this one."""
        if plan.limit_s is None or request.last_token_time is None:
            return True
        return self._token_deadline(request) <= now + 2 * plan.limit_s

    def _shaped_tokens(self, request: Request, num_tokens: int, plan: _StepPlan, now: float) -> int:
        """Tokens `request` gets in a shaped step: all of them if it is due or fits; for a
        prefill chunk, what fits (at least a block, for the step's first chunk, so prompts
        always progress; all of it when only that keeps its TTFT and its class is not below
        those whose TBT it stretches); else 0: it sits out."""
        if plan.limit_s is None or not num_tokens or plan.fits(request, num_tokens):
            return num_tokens
        if request.is_prefill_done:  # due and of the class that set the limit, or overdue
            is_senior = self.reservations.rank(request) <= plan.limit_rank
            is_in = self._is_due(request, plan, now) and (
                is_senior or self._is_overdue(request, plan, now)
            )
            return num_tokens if is_in else 0
        num_fit = plan.num_tokens_that_fit(request, num_tokens)
        if not plan.has_prefill:
            num_fit = max(num_fit, min(num_tokens, self.kv.block_size))
        is_senior = self.reservations.rank(request) <= plan.limit_rank
        if is_senior and self._is_ttft_at_risk(request, num_fit, plan.limit_s, now):
            return num_tokens
        return num_fit

    def _is_overdue(self, request: Request, plan: _StepPlan, now: float) -> bool:
        """A decode whose next token cannot wait for the step after this one: its TBT
        promise is kept only if it is in this step."""
        if request.last_token_time is None:
            return False
        return self._token_deadline(request) <= now + (plan.limit_s or 0.0)

    @staticmethod
    def _is_ttft_at_risk(request: Request, num_chunk: int, limit_s: float, now: float) -> bool:
        """Chunks of `num_chunk` tokens, a limited step each, would bring the first token
        after its TTFT deadline."""
        if request.first_token_time is not None:
            return False
        num_steps = -(-request.num_uncomputed_tokens // max(1, num_chunk))
        return now + num_steps * limit_s > request.arrival_time + request.slo.ttft_s

    def memory_state(self) -> MemoryState:
        device = self.kv.device
        return MemoryState(
            num_device_blocks=device.num_blocks,
            num_free_device_blocks=device.num_free_blocks + device.num_quarantined_blocks,
            num_demand_blocks=sum(
                self.kv.num_blocks_held_for(r.num_tokens) for r in self.requests.values()
            ),
            host_usage=self.kv.host_usage_pinned(self.policy.host_admission_guard),
            num_swapped_requests=len(self.swapped),
        )

    def _rotate_proactively(self, plan: _StepPlan, now: float) -> None:
        memory = self.memory_state()
        target = self.policy.rotation_target(memory)
        num_free = memory.num_free_device_blocks
        while num_free < target:
            victim = self._pick_rotation_victim(now)
            if victim is None or not self.kv.can_swap_out(victim):
                return
            num_free += self.kv.num_blocks_freed_by_swap_out(victim)
            self._preempt(victim, plan, now)
            self.stats.num_proactive_rotations += 1

    def _pick_rotation_victim(self, now: float) -> Request | None:
        """The policy's victim among the lowest class that has one, so higher classes are
        rotated out last."""
        if not self.reservations.is_ranked:
            return self.policy.pick_victim(self.running, now)
        by_rank: dict[int, list[Request]] = {}
        for request in self.running:
            by_rank.setdefault(self.reservations.rank(request), []).append(request)
        for rank in sorted(by_rank, reverse=True):
            victim = self.policy.pick_victim(by_rank[rank], now)
            if victim is not None:
                return victim
        return None

    def _schedule_running(self, plan: _StepPlan, now: float) -> None:
        ordered = list(self.policy.order_running(self.running, now))
        if plan.limit_s is not None:  # due decodes, prefills, the rest; the policy's order within
            ordered.sort(key=lambda r: self._shaped_order(r, plan, now))
        is_prefilling = any(not r.is_prefill_done for r in ordered)
        queued_prompts = self._queued_prompt_tokens_by_rank(plan) if is_prefilling else {}
        for request in ordered:
            if request.status is not RequestStatus.RUNNING or plan.token_budget <= 0:
                continue
            if self._is_at_length_limit(request):
                continue  # its last token is still being sampled; it finishes then
            num_tokens = plan.num_tokens_for(request)
            if not request.is_prefill_done:  # a prompt leaves the budget to higher ones queued
                rank = self.reservations.rank(request)
                num_kept = sum(n for r, n in queued_prompts.items() if r < rank)
                num_tokens = min(num_tokens, max(0, plan.token_budget - num_kept))
                num_tokens = plan.num_fill_tokens(request, rank, num_tokens)
            num_tokens = self._shaped_tokens(request, num_tokens, plan, now)
            if num_tokens and self._make_room(request, num_tokens, plan, now):
                self.kv.allocate_slots(request, num_tokens)
                plan.add(request, num_tokens)

    def _queued_prompt_tokens_by_rank(self, plan: _StepPlan) -> dict[int, int]:
        """Prompt tokens of the waiting requests that fit the device pool, by class rank: the
        step budget a running prompt of a lower class leaves them (it started first, but a
        gold prompt does not wait behind a bronze one's chunks)."""
        if not self.reservations.is_ranked:
            return {}
        tokens: dict[int, int] = {}
        for request in self._fitting(plan):
            rank = self.reservations.rank(request)
            tokens[rank] = tokens.get(rank, 0) + request.num_uncomputed_tokens
        return tokens

    def _fitting(self, plan: _StepPlan) -> list[Request]:
        """`_waiting_that_fit()` as it was when this step's running requests started to be
        scheduled (computed once: the token guard and the running prompts both ask)."""
        if plan.waiting_that_fit is None:
            plan.waiting_that_fit = self._waiting_that_fit()
        return plan.waiting_that_fit

    def _waiting_that_fit(self) -> list[Request]:
        """The waiting requests that fit the device pool, class first: what is free plus what
        the lower classes' running decodes hold (admission displaces those to make room for
        it, `_admit_displacing`, so a full pool does not send a gold prompt behind a silver
        one's chunks)."""
        num_free = self.kv.device.num_free_blocks
        displaceable: dict[int, int] = {}  # rank -> device blocks of its running decodes
        for request in filter(lambda r: r.is_prefill_done, self.running):
            rank = self.reservations.rank(request)
            displaceable[rank] = displaceable.get(rank, 0) + self.kv.num_device_blocks_of(request)
        fitting = []
        for request in sorted(self.waiting, key=self.reservations.rank):  # stable: queue order
            rank = self.reservations.rank(request)
            num_blocks = self.kv.num_blocks_for(request.num_tokens)
            lower = sorted(r for r in displaceable if r > rank)
            if num_blocks > num_free + sum(displaceable[r] for r in lower):
                continue
            num_taken = min(num_blocks, num_free)
            num_free -= num_taken
            for other in reversed(lower):  # the lowest class is displaced first
                num_from = min(num_blocks - num_taken, displaceable[other])
                displaceable[other] -= num_from
                num_taken += num_from
            fitting.append(request)
        return fitting

    def _make_room(self, request: Request, num_tokens: int, plan: _StepPlan, now: float) -> bool:
        """Preempt the policy's victims until `request` fits; False if it cannot run now."""
        num_keep_free = self._num_blocks_kept_free(request)
        while not self.kv.can_allocate(request, num_tokens, num_keep_free):
            if self._is_room_coming(request, num_tokens, num_keep_free):
                return False  # blocks of earlier victims free up once their copies land
            victim = self.policy.pick_victim(self._displaceable_by(request), now) or request
            self._preempt(victim, plan, now)
            plan.num_reactive_preemptions += 1
            if victim is request:
                return False
        return True

    def _num_blocks_kept_free(self, request: Request) -> int:
        if not self.reservations.is_enabled:
            return 0
        return self.reservations.num_blocks_kept_free(request)

    def _displaceable_by(self, request: Request) -> list[Request]:
        if not self.reservations.is_ranked:
            return self.running
        return [r for r in self.running if self.reservations.may_displace(request, r)]

    def _lower_class_victim(self, request: Request, now: float) -> Request | None:
        """The policy's victim among running decodes of a lower class than `request`: a
        higher class displaces a lower one when it does not fit (by rotation)."""
        rank = self.reservations.rank(request)
        lower = [r for r in self.running if self.reservations.rank(r) > rank]
        return self.policy.pick_victim(lower, now) if lower else None

    def _is_room_coming(self, request: Request, num_tokens: int, num_keep_free: int) -> bool:
        device = self.kv.device
        num_needed = self.kv.num_blocks_needed(request, num_tokens) + num_keep_free
        return device.num_quarantined_blocks > 0 and num_needed <= (
            device.num_free_blocks + device.num_quarantined_blocks
        )

    def _schedule_queue(self, plan: _StepPlan, now: float) -> None:
        memory = self.memory_state()
        blocked_rank = None  # a request that does not fit blocks those of its class and below
        queue = list(self.policy.order_queue(self.waiting, self.swapped, now))
        queue.sort(key=self.reservations.rank)  # class first, the policy's order within
        if self.is_shaping_steps:  # overdue rotated-out decodes first: a row each, not a chunk
            queue.sort(key=lambda r: not self._is_overdue(r, plan, now))
        for request in queue:
            if plan.token_budget <= 0:
                break
            rank = self.reservations.rank(request)
            if blocked_rank is not None and rank >= blocked_rank:
                continue
            if self._is_held_back(request, plan) or not self._may_admit(request, memory):
                continue
            if self._is_sitting_out(request, plan, now):
                continue
            if not self._admit_displacing(request, plan, now):
                if rank == 0:
                    break
                blocked_rank = rank
                continue
            self._queue_of(request).remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._num_admissions += 1
            request.admission_seq = self._num_admissions
            request.num_output_tokens_at_admission = request.num_output_tokens
            request.running_since = now
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now

    def _may_admit(self, request: Request, memory: MemoryState) -> bool:
        """The policy's guard (rotasched: no brand-new admission while the host tier is
        nearly full), which a request passes when a lower class runs: it makes room by
        displacing that class, not by parking more in the host tier."""
        if self.policy.may_admit(request, memory):
            return True
        rank = self.reservations.rank(request)
        return any(self.reservations.rank(r) > rank for r in self.running)

    def _is_held_back(self, request: Request, plan: _StepPlan) -> bool:
        """Swapped out in this very step, or its copies to the host not landed yet."""
        if request.status is not RequestStatus.SWAPPED:
            return False
        return request.request_id in plan.swapped_out or not self.kv.is_swap_in_ready(request)

    def _is_sitting_out(self, request: Request, plan: _StepPlan, now: float) -> bool:
        """A shaped step has no time for this queued request now (a rotated-out decode
        that is not due, or a prefill when the step is full)."""
        if plan.limit_s is None:
            return False
        num_tokens = plan.num_tokens_for(request)
        if request.status is RequestStatus.WAITING and request.num_computed_tokens == 0:
            num_tokens = min(num_tokens, request.num_prompt_tokens)  # before prefix hits
        return num_tokens > 0 and self._shaped_tokens(request, num_tokens, plan, now) == 0

    def _admit_displacing(self, request: Request, plan: _StepPlan, now: float) -> bool:
        """Admit `request`, displacing the policy's admission victims (or, failing those, a
        lower class's) while it does not fit."""
        while not self._try_admit(request, plan, now):
            victim = self.policy.pick_admission_victim(request, self._displaceable_by(request), now)
            is_class_victim = victim is None
            if is_class_victim:
                victim = self._lower_class_victim(request, now)
            if victim is None:
                return False
            self._preempt(victim, plan, now, prefer_swap=is_class_victim)
        return True

    def _try_admit(self, request: Request, plan: _StepPlan, now: float) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        if request.status is RequestStatus.SWAPPED:
            return self._try_swap_in(request, plan, now)
        if request.num_computed_tokens == 0:
            request.num_computed_tokens = self.kv.match_prefix(request)
            if request.num_output_tokens == 0 and request.num_preemptions == 0:
                request.num_cached_prompt_tokens = request.num_computed_tokens
        num_tokens = plan.num_fill_tokens(request, self.reservations.rank(request),
                                          plan.num_tokens_for(request))  # fmt: skip
        num_tokens = self._shaped_tokens(request, num_tokens, plan, now)
        num_keep_free = self._num_blocks_kept_free(request)
        if not num_tokens or not self.kv.can_allocate(request, num_tokens, num_keep_free):
            self.kv.free(request)  # give back prefix hits; it stays waiting
            request.num_computed_tokens = 0
            return False
        self.kv.allocate_slots(request, num_tokens)
        plan.add(request, num_tokens)
        return True

    def _try_swap_in(self, request: Request, plan: _StepPlan, now: float) -> bool:
        num_tokens = self._shaped_tokens(request, plan.num_tokens_for(request), plan, now)
        num_keep_free = self._num_blocks_kept_free(request)
        if not num_tokens or not self.kv.can_swap_in(request, num_tokens, num_keep_free):
            return False
        spec = self.kv.swap_in(request)
        if spec is not None:
            plan.swap_in_ids.append(spec.transfer_id)
        self.kv.allocate_slots(request, num_tokens)
        plan.add(request, num_tokens)
        self.stats.num_swap_ins += 1
        return True

    def _preempt(
        self, victim: Request, plan: _StepPlan, now: float, prefer_swap: bool = False
    ) -> None:
        plan.remove(victim)
        self.running.remove(victim)
        victim.running_since = None
        is_by_swap = self.policy.is_preempt_by_swap or prefer_swap
        if is_by_swap and self.kv.can_swap_out(victim):
            self._swap_out(victim)
            plan.swapped_out.append(victim.request_id)
        else:  # recompute: drop the KV (also the fallback when the host tier is full)
            self.kv.free(victim, forget=False)
            victim.num_computed_tokens = 0
            victim.status = RequestStatus.WAITING
            victim.num_preemptions += 1
            self.waiting.append(victim)
            plan.preempted.append(victim.request_id)
            self.stats.num_preemptions += 1

    def _swap_out(self, request: Request) -> None:
        self.kv.swap_out(request)
        request.status = RequestStatus.SWAPPED
        request.num_swap_outs += 1
        self.swapped.append(request)
        self.stats.num_swap_outs += 1

    def rotate_out(self, request_id: str) -> bool:
        """Rotate a running request to the host tier now (warm-up, tests); False if it is
        not running or the host tier has no room."""
        request = self.requests.get(request_id)
        if request is None or request.status is not RequestStatus.RUNNING:
            return False
        if not self.kv.can_swap_out(request):
            return False
        self.running.remove(request)
        request.running_since = None
        self._swap_out(request)
        return True

    def _build_output(self, plan: _StepPlan) -> SchedulerOutput:
        sequences = [
            self._scheduled_sequence(self.requests[request_id], num_tokens)
            for request_id, num_tokens in plan.num_tokens.items()
        ]
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(
            step_id=self.stats.num_steps,
            sequences=sequences,
            transfers=self.kv.take_planned_transfers(),
            swap_in_transfer_ids=plan.swap_in_ids,
            finished_request_ids=finished,
            preempted_request_ids=plan.preempted,
            swapped_out_request_ids=plan.swapped_out,
        )

    def _scheduled_sequence(self, request: Request, num_tokens: int) -> ScheduledSequence:
        start = request.num_computed_tokens
        return ScheduledSequence(
            request_id=request.request_id,
            token_ids=request.token_ids_slice(start, start + num_tokens),
            num_context_tokens=start,
            block_table=list(self.kv.block_table(request)),
            is_sampling=start + num_tokens == request.num_tokens,
            sampling_params=request.sampling_params,
            num_output_tokens=request.num_output_tokens,
        )

    # --- after the forward ----------------------------------------------------------------
    # A step is launched, then `advance` counts its tokens as computed and appends a
    # PLACEHOLDER for each token being sampled; `fill` later writes the sampled values and
    # applies the stop rules. Run back to back (`update_from_output`) that is one plain
    # step; with the pipeline, the next step is scheduled between the two.

    def update_from_output(
        self, output: SchedulerOutput, model_output: ModelOutput, now: float
    ) -> list[RequestUpdate]:
        """Advance each scheduled request by its computed tokens and sampled token."""
        self.advance(output)
        return self.fill(output, model_output, now)

    def advance(self, output: SchedulerOutput) -> None:
        """The step's forward is launched: count its tokens computed, hold sampled slots."""
        self.kv.begin_step_fence()
        for seq in output.sequences:
            request = self.requests[seq.request_id]
            request.num_computed_tokens += seq.num_query_tokens
            self.kv.on_tokens_computed(request)
            if seq.is_sampling:
                request.output_token_ids.append(PLACEHOLDER)

    def fill(
        self, output: SchedulerOutput, model_output: ModelOutput, now: float
    ) -> list[RequestUpdate]:
        """The step's forward is done: write the sampled tokens and apply the stop rules."""
        self.kv.end_step_fence()
        updates = []
        for seq in output.sequences:
            request = self.requests.get(seq.request_id)
            if request is None or not seq.is_sampling:
                continue  # finished or aborted while the step ran
            index = seq.num_context_tokens + seq.num_query_tokens - request.num_prompt_tokens
            token = model_output.sampled_token_ids[request.request_id]
            request.output_token_ids[index] = token
            request.output_token_times.append(now)
            status = self._stop_status(request, token)
            if status is not None:
                self._finish(request, status, now)
            updates.append(
                RequestUpdate(request.request_id, [token], status and status.finish_reason,
                              request.stop_reason)
            )  # fmt: skip
        return updates

    def abandon_step(self) -> None:
        """A launched step will never be filled in (shutdown): release the blocks freed
        while its forward ran."""
        self.kv.end_step_fence()

    def prune(self, output: SchedulerOutput) -> SchedulerOutput:
        """Before launching a step scheduled ahead: drop requests that finished meanwhile
        and put the sampled values in place of placeholders."""
        kept = []
        for seq in output.sequences:
            request = self.requests.get(seq.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue
            if seq.token_ids[-1] == PLACEHOLDER:
                seq.token_ids[-1] = request.token_id_at(
                    seq.num_context_tokens + seq.num_query_tokens - 1
                )
            kept.append(seq)
        output.sequences = kept
        return output

    def _is_at_length_limit(self, request: Request) -> bool:
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None and request.num_output_tokens >= max_tokens:
            return True
        return request.num_tokens >= self.config.max_model_len

    def _stop_status(self, request: Request, token: int) -> RequestStatus | None:
        params = request.sampling_params
        if token == PLACEHOLDER:
            raise KVInvariantError(f"request {request.request_id}: no sampled token")
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token in params.stop_token_ids:
                request.stop_reason = token
                return RequestStatus.FINISHED_STOPPED
        if self._is_at_length_limit(request):
            return RequestStatus.FINISHED_LENGTH
        return None

    # --- checks ---------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Each request in exactly one queue matching its status; KV tables consistent."""
        queues = {
            RequestStatus.WAITING: self.waiting,
            RequestStatus.RUNNING: self.running,
            RequestStatus.SWAPPED: self.swapped,
        }
        num_queued = sum(len(q) for q in queues.values())
        if num_queued != len(self.requests):
            raise KVInvariantError(f"{num_queued} queued but {len(self.requests)} unfinished")
        for status, queue in queues.items():
            for request in queue:
                if (
                    request.status is not status
                    or self.requests.get(request.request_id) is not request
                ):
                    raise KVInvariantError(f"request {request.request_id} in the wrong queue")
        if len(self.running) > self.config.max_num_seqs:
            raise KVInvariantError("more running requests than max_num_seqs")
        self.kv.check_invariants(self.requests.values())
