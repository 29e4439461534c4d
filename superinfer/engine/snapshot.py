"""Plain data an engine hands out: its load picture (`EngineSnapshot`, published by the
async engine after each step for admission, metrics and the stats line), the record of
each step for step observers (`StepRecord`: warm-up, calibration, the step-time metric),
and the debug route's report. Built here from the scheduler and the KV manager, so
nothing outside `engine/` reads them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from superinfer.core.kv.errors import KVInvariantError
from superinfer.core.kv.transfer import TransferStats
from superinfer.core.outputs import SchedulerOutput
from superinfer.core.request import Request
from superinfer.core.scheduler import Scheduler
from superinfer.core.step_time import decode_row_seconds
from superinfer.slo.estimate import Decoding, Queued


@dataclass(frozen=True)
class EngineSnapshot:
    """Load and counters published by the engine thread after each step."""

    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    # each waiting request: its next deadline (engine clock), tokens to prefill and class
    # (admission's queue ahead, slo/estimate.py)
    waiting: tuple[Queued, ...] = ()
    device_kv_usage: float = 0.0
    host_kv_usage: float = 0.0
    step_time_s: float = 0.0  # moving average of steps that produced tokens
    decode_step_s: float = 0.0  # moving average of those without prefill tokens
    # prefill's cost learned from served steps (`slo.estimate.PrefillCost`; 0: not yet)
    prefill_s_per_token: float = 0.0
    prefill_s_per_pair: float = 0.0
    decode_row_s: float = 0.0  # one more decoding sequence's cost, by the step-time model
    # prompt tokens a shaped step carries for a prompt below `shaping_class` (0: no engine)
    num_prefill_tokens_per_step: int = 0
    shaping_class: str | None = None  # the most important class decoding
    first_token_headroom: float = 0.0  # the first-token guard's (core/token_guard.py)
    # running and rotated-out requests with their TPOT budgets (admission's TBT check)
    decoding: tuple[Decoding, ...] = ()
    num_steps: int = 0
    num_preemptions: int = 0  # recompute preemptions
    num_swap_outs: int = 0  # rotations to the host tier
    num_swap_ins: int = 0
    transfer_bytes: Mapping[str, int] = field(default_factory=dict)  # "d2h"/"h2d" -> bytes
    transfer_seconds: Mapping[str, float] = field(default_factory=dict)
    num_device_blocks: int = 0  # the pool sizes (0: no engine built yet)
    num_host_blocks: int = 0
    prefix_cache_queries: int = 0  # tokens looked up in the prefix cache (vLLM's meaning)
    prefix_cache_hits: int = 0  # of those, tokens found cached
    # tokens of the requests added here (not the warm-up's), since the engine started
    num_prompt_tokens: int = 0  # prompt tokens computed (not cached), at each first token
    num_generation_tokens: int = 0
    num_inflight_transfers: int = 0  # KV copies planned or running, not yet landed
    is_queue_by_deadline: bool = False  # the policy admits by deadline (admission's queue)
    is_preempt_by_swap: bool = False  # the policy makes room by rotating to the host tier
    host_admission_guard: float = 1.0  # host usage past which the policy admits no newcomer
    block_size: int = 16
    num_free_device_blocks: int = 0  # free now or once in-flight copies land
    num_free_host_blocks: int = 0
    num_reclaimable_host_blocks: int = 0  # shadows the host tier may drop (not in use)
    running_blocks_by_class: Mapping[str | None, int] = field(default_factory=dict)
    # the blocks each rotated-out request needs back on the device, summed by class
    swapped_blocks_by_class: Mapping[str | None, int] = field(default_factory=dict)
    num_released_blocks: int = 0  # device blocks freed by requests that ended, in all
    release_blocks_per_s: float = 0.0  # of those, recently (the async engine's to add)
    max_num_seqs: int = 0  # the running batch's seats (0: no engine built yet)
    running_by_class: Mapping[str | None, int] = field(default_factory=dict)  # requests
    swapped_by_class: Mapping[str | None, int] = field(default_factory=dict)
    num_finished: int = 0  # requests that ended, in all
    finished_per_s: float = 0.0  # of those, recently (the async engine's to add)
    host_drain_blocks_per_s: float = 0.0  # how fast the pinned host blocks fall (likewise)


def build_snapshot(scheduler: Scheduler, transfer: TransferStats) -> EngineSnapshot:
    """The engine's part of a snapshot (the async engine adds step time and token counts)."""
    kv, stats = scheduler.kv, scheduler.stats
    return EngineSnapshot(
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_swapped=len(scheduler.swapped),
        waiting=tuple(queued_request(r, scheduler.config.max_model_len) for r in scheduler.waiting),
        device_kv_usage=kv.device.usage,
        host_kv_usage=kv.host.usage,
        num_steps=stats.num_steps,
        num_preemptions=stats.num_preemptions,
        num_swap_outs=stats.num_swap_outs,
        num_swap_ins=stats.num_swap_ins,
        transfer_bytes={"d2h": transfer.d2h.num_bytes, "h2d": transfer.h2d.num_bytes},
        transfer_seconds={"d2h": transfer.d2h.seconds, "h2d": transfer.h2d.seconds},
        num_device_blocks=kv.device.num_blocks,
        num_host_blocks=kv.host.num_blocks,
        prefix_cache_queries=kv.stats.num_prefix_query_tokens,
        prefix_cache_hits=kv.stats.num_prefix_hit_tokens,
        num_inflight_transfers=kv.num_inflight_transfers,
        is_queue_by_deadline=scheduler.policy.is_queue_by_deadline,
        is_preempt_by_swap=scheduler.policy.is_preempt_by_swap,
        host_admission_guard=scheduler.policy.host_admission_guard,
        block_size=kv.block_size,
        num_free_device_blocks=kv.device.num_free_blocks + kv.device.num_quarantined_blocks,
        num_free_host_blocks=kv.host.num_free_blocks,
        num_reclaimable_host_blocks=kv.num_reclaimable_host_blocks(
            scheduler.policy.host_admission_guard
        ),
        running_blocks_by_class=_blocks_by_class(scheduler),
        swapped_blocks_by_class=swapped_blocks_by_class(scheduler),
        num_released_blocks=stats.num_released_blocks,
        max_num_seqs=scheduler.config.max_num_seqs,
        running_by_class=requests_by_class(scheduler.running),
        swapped_by_class=requests_by_class(scheduler.swapped),
        num_finished=stats.num_finished,
        decoding=decoding_requests(scheduler),
        decode_row_s=decode_row_cost(scheduler),
        num_prefill_tokens_per_step=scheduler.num_prefill_tokens_per_step(),
        shaping_class=scheduler.shaping_class(),
        first_token_headroom=scheduler.first_token_headroom(),
    )


def decode_row_cost(scheduler: Scheduler) -> float:
    """What one more decoding sequence adds to a step, at the running ones' mean context."""
    running = scheduler.running
    num_context = sum(r.num_tokens for r in running) // len(running) if running else 256
    return decode_row_seconds(scheduler.step_model, num_context)


def decoding_requests(scheduler: Scheduler) -> tuple[Decoding, ...]:
    """The running and rotated-out requests as admission's TBT check reads them."""
    decoding = []
    max_model_len = scheduler.config.max_model_len
    for request in (*scheduler.running, *scheduler.swapped):
        num_expected = expected_output_tokens(request, max_model_len)
        decoding.append(Decoding(
            request.slo.tbt_s, num_expected - 1, num_expected - request.num_output_tokens,
            request.first_token_time,
            max(0, request.num_prompt_tokens - request.num_computed_tokens),
            request.slo.slo_class, request.num_prompt_tokens + num_expected,
        ))  # fmt: skip
    return tuple(decoding)


def queued_request(request: Request, max_model_len: int) -> Queued:
    """A waiting request as admission reads it."""
    num_final = request.num_prompt_tokens + expected_output_tokens(request, max_model_len)
    return Queued(request.next_deadline(), request.num_uncomputed_tokens, request.slo.slo_class,
                  num_final, request.slo.tbt_s)  # fmt: skip


def expected_output_tokens(request: Request, max_model_len: int) -> int:
    return expected_outputs(request.sampling_params.max_tokens, request.num_prompt_tokens,
                            request.num_output_tokens, max_model_len)  # fmt: skip


def expected_outputs(
    max_tokens: int | None, num_prompt_tokens: int, num_output_tokens: int, max_model_len: int
) -> int:
    """The outputs a request is expected to end with: its max_tokens when the client
    bounded it below what the model's length leaves (the server's default when it gave
    none); otherwise unknown, and what it has so far plus one."""
    if max_tokens is not None and num_prompt_tokens + max_tokens < max_model_len:
        return max_tokens
    return num_output_tokens + 1


def _blocks_by_class(scheduler: Scheduler) -> dict[str | None, int]:
    blocks: Counter[str | None] = Counter()
    for request in scheduler.running:
        blocks[request.slo.slo_class] += scheduler.kv.num_device_blocks_of(request)
    return dict(blocks)


def requests_by_class(requests: Iterable[Request]) -> dict[str | None, int]:
    """How many of `requests` each class has."""
    return dict(Counter(request.slo.slo_class for request in requests))


def swapped_blocks_by_class(scheduler: Scheduler) -> dict[str | None, int]:
    """The device blocks the rotated-out requests need to come back, by class."""
    blocks: Counter[str | None] = Counter()
    for request in scheduler.swapped:
        blocks[request.slo.slo_class] += scheduler.kv.num_blocks_for(request.num_tokens)
    return dict(blocks)


@dataclass(frozen=True)
class ForwardRecord:
    """One forward of a non-empty batch, timed."""

    batch: SchedulerOutput  # the batch as launched (read it, never change it)
    forward_s: float  # without the pipeline: `execute`; with it: launch until the result
    # was ready, on the runner's thread, overlapping the next step's scheduling
    host_s: float  # the step that ran (or launched) it, less the time it blocked on forwards

    @property
    def num_sequences(self) -> int:
        return len(self.batch.sequences)

    @property
    def num_decode_tokens(self) -> int:
        """Sequences with one query token after some context."""
        return sum(len(s.token_ids) == 1 and s.num_context_tokens > 0 for s in self.batch.sequences)

    @property
    def num_prefill_tokens(self) -> int:
        return self.batch.num_batched_tokens - self.num_decode_tokens


@dataclass(frozen=True)
class StepRecord:
    """One `LLMEngine.step()`, handed to the step observers after it returned."""

    step_index: int  # steps of this engine so far, this one included
    wall_s: float  # the whole step, output processing included
    num_outputs: int  # request outputs it returned
    forward: ForwardRecord | None  # the forward that ended in this step (with the pipeline,
    # the one launched by an earlier step); None if none did


def build_debug_report(scheduler: Scheduler) -> dict[str, Any]:
    """KV ownership per tier and per class, queue lengths and the invariant check."""
    kv = scheduler.kv
    blocks_by_class: Counter[str] = Counter()
    for request in scheduler.running:
        blocks_by_class[request.slo.slo_class or "none"] += kv.num_device_blocks_of(request)
    try:
        scheduler.check_invariants()
        invariants = "ok"
    except KVInvariantError as error:
        invariants = str(error)
    return {
        "num_unfinished": scheduler.num_unfinished_requests,
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting),
        "num_swapped": len(scheduler.swapped),
        "num_device_blocks": kv.device.num_blocks,
        "num_host_blocks": kv.host.num_blocks,
        "device_blocks_used": kv.device.num_used_blocks,
        "host_blocks_used": kv.host.num_used_blocks,
        "device_blocks_quarantined": kv.device.num_quarantined_blocks,
        "host_blocks_quarantined": kv.host.num_quarantined_blocks,
        "num_block_tables": len(kv.tables),
        "num_inflight_transfers": kv.num_inflight_transfers,
        "running_device_blocks_by_class": dict(blocks_by_class),
        "num_swap_outs": scheduler.stats.num_swap_outs,
        "num_preemptions": scheduler.stats.num_preemptions,
        "invariants": invariants,
    }
