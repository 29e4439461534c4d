"""The engine host: one `AsyncEngine` in this process and the requests it runs.

It builds the engine on its thread and warms it up, admits requests against the engine's
published snapshot (admission.py), submits and aborts them, and writes exactly one SLO
record (and its metrics) for each request it admitted, when the engine reports it done.
On shutdown it drains: in-flight requests finish within a timeout, the rest are aborted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from superinfer.config import EngineConfig
from superinfer.engine.async_engine import AsyncEngine, RequestStream
from superinfer.engine.native_memory import release_free_memory
from superinfer.engine.snapshot import EngineSnapshot
from superinfer.outputs import RequestOutput
from superinfer.server.admission import Admission, Demand, Load, estimated_ttft_ms
from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.debug import engine_report
from superinfer.server.errors import APIError
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.prepare import PreparedRequest
from superinfer.server.prometheus import ServerMetrics
from superinfer.server.warmup import warm_up
from superinfer.slo.estimate import Correction, FirstTokenEstimate, TokenRate
from superinfer.slo.metrics import ABORTED, FINISHED, RequestRecord, SLOReport, slo_report, tbt_gaps
from superinfer.slo.record_log import SLOLog, log_line

if TYPE_CHECKING:
    from superinfer.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


@dataclass
class Inflight:
    """An admitted request, until the engine reports it done."""

    prepared: PreparedRequest
    arrival: Arrival
    abort_reason: str | None = None
    report: SLOReport | None = None  # set when it ends (before its stream reads the end)
    estimate: FirstTokenEstimate | None = None  # its first token, as estimated at admission
    estimated_ttft_ms: float | None = None  # that estimate, corrected, ms from arrival
    admitted_at: float = 0.0  # engine clock


def default_engine_factory(config: EngineConfig) -> LLMEngine:
    from superinfer.engine.llm_engine import LLMEngine

    return LLMEngine(config)


def _ignore(report: SLOReport) -> None:
    pass


class EngineHost:
    """The engine of this process: boot, admission, requests, drain.

    `error_log` is shared with the front (its summaries are flushed together); `on_report`
    receives the SLO report of each request that ended (the periodic stats line).
    """

    def __init__(
        self,
        config: ServerConfig,
        engine_config: EngineConfig,
        slo_log: SLOLog,
        metrics: ServerMetrics,
        error_log: RateLimitedLog,
        engine_factory: Callable[[EngineConfig], LLMEngine] = default_engine_factory,
        on_report: Callable[[SLOReport], None] = _ignore,
    ) -> None:
        self.config = config
        self.engine_config = engine_config
        self.slo_log = slo_log
        self.metrics = metrics
        self.error_log = error_log
        self.engine_factory = engine_factory
        self.admission = Admission(
            config.max_num_queued_reqs, config.max_num_queued_tokens,
            engine_config.scheduler.class_order, Correction(config.admission_quantile),
        )  # fmt: skip
        self.engine: AsyncEngine | None = None  # set once built
        self.inflight: dict[str, Inflight] = {}
        self.admitted_tokens = TokenRate()  # what higher classes' arrivals will take
        self.admitted_requests = TokenRate()  # and the seats they will take (one each)
        self.warmup_step_time_s = 0.0
        self.warmup_prefill_s_per_token = 0.0
        self._on_report = on_report

    # --- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Build the engine on its own thread, where all its torch work runs (AsyncEngine)."""
        engine = AsyncEngine(lambda: self.engine_factory(self.engine_config), on_done=self._on_done)
        await engine.start()
        release_free_memory()
        self.engine = engine

    async def warm_up(self) -> None:
        """Warm the engine up (raises what the warm-up raised); admission estimates start
        from its measurements."""
        assert self.engine is not None
        report = await self.engine.call(warm_up)
        self.engine.learn_prefill_cost(report.prefill_s_per_token, report.prefill_samples)
        self.warmup_prefill_s_per_token = report.prefill_s_per_token
        self.warmup_step_time_s = report.step_time_s

    @property
    def snapshot(self) -> EngineSnapshot | None:
        """The engine's latest published state; None before it is built."""
        return self.engine.snapshot if self.engine is not None else None

    @property
    def is_dead(self) -> bool:
        """The engine was built and its thread is gone."""
        return self.engine is not None and not self.engine.is_alive

    async def drain(self, timeout_s: float) -> None:
        """Let in-flight requests finish for `timeout_s`, then abort the rest."""
        if self.engine is None:
            return
        if not await self.engine.wait_idle(timeout_s):
            logger.warning("aborting %d requests still running at shutdown", len(self.inflight))
            for request_id, inflight in list(self.inflight.items()):
                inflight.abort_reason = inflight.abort_reason or "shutdown"
                self.engine.abort(request_id)
            await self.engine.wait_idle(10.0)

    async def shutdown(self) -> None:
        """Stop the engine thread (aborting what is left) unless it already stopped."""
        if self.engine is not None and self.engine.is_alive:
            await self.engine.shutdown()

    async def debug_report(self) -> dict[str, Any] | None:
        """KV ownership, queues and the invariant check (/debug/engine); None before the
        engine is built."""
        if self.engine is None:
            return None
        report = await self.engine.call(engine_report)
        return {"num_inflight": len(self.inflight), **report}

    # --- admission ------------------------------------------------------------------------
    def load(self) -> Load:
        """The engine's load for admission, from its published snapshot and the requests
        handed to it that no published snapshot includes yet."""
        assert self.engine is not None
        snapshot = self.engine.snapshot
        is_busy = snapshot.num_running > 0
        now = time.monotonic()  # one reading for the rates and the load's clock
        step_time = (
            snapshot.step_time_s if is_busy and snapshot.step_time_s else self.warmup_step_time_s
        )
        # the warm-up's cost per token until the engine has learned its costs; a learned fit
        # may put everything on pairs, and its 0 per token must stay 0
        is_learned = bool(snapshot.prefill_s_per_token or snapshot.prefill_s_per_pair)
        return Load(
            queued=self.engine.queued(), step_time_s=step_time,
            prefill_s_per_token=(snapshot.prefill_s_per_token if is_learned
                                 else self.warmup_prefill_s_per_token),
            prefill_s_per_pair=snapshot.prefill_s_per_pair,
            num_batched_tokens=self.engine_config.scheduler.max_num_batched_tokens,
            num_shaped_batched_tokens=snapshot.num_prefill_tokens_per_step,
            shaping_class=snapshot.shaping_class,
            first_token_headroom=snapshot.first_token_headroom,
            is_queue_by_deadline=snapshot.is_queue_by_deadline,
            is_preempt_by_swap=snapshot.is_preempt_by_swap, block_size=snapshot.block_size,
            num_free_device_blocks=snapshot.num_free_device_blocks,
            num_free_host_blocks=snapshot.num_free_host_blocks,
            num_host_blocks=snapshot.num_host_blocks,
            num_reclaimable_host_blocks=snapshot.num_reclaimable_host_blocks,
            host_admission_guard=snapshot.host_admission_guard,
            running_blocks_by_class=snapshot.running_blocks_by_class,
            swapped_blocks_by_class=snapshot.swapped_blocks_by_class,
            release_blocks_per_s=snapshot.release_blocks_per_s,
            max_num_seqs=snapshot.max_num_seqs, running_by_class=snapshot.running_by_class,
            swapped_by_class=snapshot.swapped_by_class, finished_per_s=snapshot.finished_per_s,
            host_drain_blocks_per_s=snapshot.host_drain_blocks_per_s,
            prompt_tokens_per_s_by_class=self.admitted_tokens.rates(now),
            requests_per_s_by_class=self.admitted_requests.rates(now),
            decoding=snapshot.decoding,
            decode_step_s=snapshot.decode_step_s if is_busy else self.warmup_step_time_s,
            now=now, num_device_blocks=snapshot.num_device_blocks,
            decode_row_s=snapshot.decode_row_s,
            step_left_s=self.engine.step_left_s() if is_busy else 0.0,
        )  # fmt: skip

    def admit(
        self, prepared: PreparedRequest, arrival: Arrival, expected_tokens: int
    ) -> tuple[RequestStream, Inflight]:
        """Admission checks, then the request enters the engine (raises APIError). The
        `Inflight` receives the SLO report when the request ends."""
        assert self.engine is not None
        if prepared.request_id in self.inflight:
            raise APIError(400, f"request_id {prepared.request_id!r} is already in use",
                           "duplicate_request_id", "request_id")  # fmt: skip
        slo = prepared.slo
        now = time.monotonic()
        tbt_ms = slo.binding_tbt_ms if self.config.reject_infeasible_tbt else None
        demand = Demand(
            len(prepared.prompt_token_ids), expected_tokens, slo.targets.slo_class,
            arrival.monotonic + slo.targets.ttft_s, now - arrival.monotonic,
            tbt_s=None if tbt_ms is None else tbt_ms / 1000.0, promised_tbt_s=slo.targets.tbt_s,
            num_cached_tokens=self._num_cached_tokens(prepared),
        )  # fmt: skip
        ttft_ms = slo.binding_ttft_ms if self.config.reject_infeasible_ttft else None
        estimate = self.admission.check(
            self.load(), demand, slo.targets.max_latency_ms, slo.is_reject_infeasible, ttft_ms
        )
        self.admitted_tokens.add(now, slo.targets.slo_class, demand.num_prompt_tokens)
        self.admitted_requests.add(now, slo.targets.slo_class, 1)
        inflight = Inflight(prepared, arrival, estimate=estimate, admitted_at=now)
        inflight.estimated_ttft_ms = estimated_ttft_ms(
            demand, self.admission.expected_ttft_s(demand, estimate)
        )
        self.inflight[prepared.request_id] = inflight
        stream = self.engine.add_request(
            prepared.request_id, prepared.prompt_token_ids, prepared.params,
            arrival.monotonic, prepared.priority, slo.targets, prepared.prompt,
        )  # fmt: skip
        if self.config.enable_log_requests:
            logger.info("Received request %s: prompt: %d tokens, params: %s, slo: %s, priority: %d",
                        prepared.request_id, len(prepared.prompt_token_ids), prepared.params,
                        slo.targets, prepared.priority)  # fmt: skip
        return stream, inflight

    def _num_cached_tokens(self, prepared: PreparedRequest) -> int:
        """The prompt's prefix the prefix cache holds now (none for a request that asks for
        its prompt's log-probabilities: every position runs through the model then)."""
        assert self.engine is not None
        if prepared.params.prompt_logprobs is not None:
            return 0
        return self.engine.num_cached_tokens(prepared.prompt_token_ids)

    # --- admitted requests ----------------------------------------------------------------
    def abort(self, inflight: Inflight, reason: str) -> None:
        """Abort an admitted request unless it already ended (no-op then)."""
        request_id = inflight.prepared.request_id
        if self.inflight.get(request_id) is not inflight or self.engine is None:
            return
        inflight.abort_reason = inflight.abort_reason or reason
        self.engine.abort(request_id)

    def _on_done(
        self, request_id: str, output: RequestOutput | None, error: BaseException | None
    ) -> None:
        """The engine is done with `request_id`: its one SLO record, metrics and report."""
        inflight = self.inflight.pop(request_id, None)
        if inflight is None:
            return
        prepared = inflight.prepared
        record = _record_of(prepared, inflight.arrival, output)
        report = slo_report(record)
        inflight.report = report
        self._learn(inflight, record)
        reason = inflight.abort_reason if record.outcome == ABORTED else None
        if error is not None:
            reason = "engine_error"
            self.error_log.log(logging.ERROR, reason, "Request %s failed: 500 engine_error: %r",
                               request_id, error)  # fmt: skip
        line = log_line(record, report, inflight.arrival.wall, 200 if error is None else 500,
                        reason, prepared.priority)  # fmt: skip
        self.slo_log.write(line)
        finish_reason = record.finish_reason or "abort"
        gaps = tbt_gaps(record.token_times)
        self._on_report(report)
        self.metrics.on_ended(report, record.num_prompt_tokens, record.num_tokens_out,
                              finish_reason, gaps)  # fmt: skip

    def _learn(self, inflight: Inflight, record: RequestRecord) -> None:
        """Teach admission how this request's first token compared with its estimate."""
        first_token_time = record.token_times[0] if record.token_times else None
        if inflight.estimate is None or first_token_time is None:
            return
        measured_s = first_token_time - inflight.admitted_at
        self.admission.observe(record.targets.slo_class, inflight.estimate.raw_s, measured_s)


def _record_of(
    prepared: PreparedRequest, arrival: Arrival, output: RequestOutput | None
) -> RequestRecord:
    if output is None:  # the engine failed the request
        return RequestRecord(
            prepared.request_id, prepared.slo.targets, arrival.monotonic,
            finished_time=time.monotonic(), outcome=ABORTED,
            num_prompt_tokens=len(prepared.prompt_token_ids), finish_reason="abort",
        )  # fmt: skip
    metrics, completion = output.metrics, output.outputs[0]
    outcome = ABORTED if completion.finish_reason == "abort" else FINISHED
    return RequestRecord(
        request_id=prepared.request_id,
        targets=prepared.slo.targets,
        arrival_time=metrics.arrival_time,
        token_times=tuple(metrics.token_times),
        finished_time=metrics.finished_time,
        first_scheduled_time=metrics.first_scheduled_time,
        outcome=outcome,
        num_prompt_tokens=len(output.prompt_token_ids),
        num_output_tokens=len(completion.token_ids),
        finish_reason=completion.finish_reason,
        num_preemptions=metrics.num_preemptions,
        num_rotations=metrics.num_swap_outs,
    )
