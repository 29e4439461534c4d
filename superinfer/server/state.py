"""The server's state across requests: lifecycle phase, the engine, admission, and the
bookkeeping that writes exactly one SLO record (and its metrics) per request.

Phases: loading -> warming_up -> ready -> draining (-> stopped); `dead` when loading,
warm-up or the engine thread failed. Only `ready` admits requests.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import generate_latest

from superinfer.config import EngineConfig
from superinfer.engine.async_engine import AsyncEngine, EngineSnapshot, RequestStream
from superinfer.engine.native_memory import release_free_memory
from superinfer.outputs import RequestOutput
from superinfer.server.admission import Admission, Load
from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError, log_level_of
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.prepare import PreparedRequest, RequestPreparer
from superinfer.server.prometheus import ServerMetrics
from superinfer.server.serving_defaults import serving_defaults_of
from superinfer.server.stats_log import StatsLogger
from superinfer.server.warmup import warm_up
from superinfer.slo import SLOTargets
from superinfer.slo.classes import SLOConfig
from superinfer.slo.metrics import (
    ABORTED,
    FINISHED,
    REJECTED,
    RequestRecord,
    SLOReport,
    slo_report,
    tbt_gaps,
)
from superinfer.slo.record_log import SLOLog, log_line

if TYPE_CHECKING:
    from superinfer.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

LOADING, WARMING_UP, READY, DRAINING, STOPPED, DEAD = (
    "loading", "warming_up", "ready", "draining", "stopped", "dead"
)  # fmt: skip


@dataclass
class Inflight:
    """An admitted request, until the engine reports it done."""

    prepared: PreparedRequest
    arrival: Arrival
    abort_reason: str | None = None
    report: SLOReport | None = None  # set when it ends (before its stream reads the end)


@dataclass
class Rejection:
    """What is known about a request rejected at ingress."""

    arrival: Arrival
    request_id: str | None = None
    targets: SLOTargets = field(default_factory=SLOTargets)
    num_prompt_tokens: int = 0
    priority: int | None = None


def default_engine_factory(config: EngineConfig) -> LLMEngine:
    from superinfer.engine.llm_engine import LLMEngine

    return LLMEngine(config)


class ServerState:
    def __init__(
        self,
        server_config: ServerConfig,
        engine_config: EngineConfig,
        slo_config: SLOConfig,
        model_name: str,
        engine_factory: Callable[[EngineConfig], LLMEngine] = default_engine_factory,
    ) -> None:
        self.config = server_config
        self.engine_config = engine_config
        self.slo_config = slo_config
        self.model_name = model_name
        self.engine_factory = engine_factory
        self.phase = LOADING
        self.engine: AsyncEngine | None = None
        self.preparer: RequestPreparer | None = None
        self.admission = Admission(
            server_config.max_num_queued_reqs, server_config.max_num_queued_tokens
        )
        self.metrics = ServerMetrics(
            model_name, self._snapshot, slo_config.class_names, engine_config
        )
        self.slo_log = SLOLog(server_config.slo_log)
        self.inflight: dict[str, Inflight] = {}
        self.warmup_step_time_s = 0.0
        self.on_fatal: Callable[[], None] = lambda: None
        self.exit_code = 0
        self.error_log = RateLimitedLog(logger)  # refusals and failures, a few per reason
        self._ended_reports: list[SLOReport] = []  # since the last stats line
        self._log_task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------
    async def boot(self) -> None:
        """Load the engine off the loop, warm it up, then admit requests."""
        start = time.monotonic()
        model = self.engine_config.model.model or "SmolLM2-135M-Instruct, the default"
        logger.info("Loading the model (%s) and warming up; /health answers 503 meanwhile", model)
        try:
            # built on the engine thread, where all its torch work runs (see AsyncEngine)
            async_engine = AsyncEngine(
                lambda: self.engine_factory(self.engine_config), on_done=self._on_done
            )
            await async_engine.start()
            release_free_memory()
            self.engine = async_engine
            engine = async_engine.engine
            self.phase = WARMING_UP
            report = await self.engine.call(warm_up)
        except Exception:
            logger.exception("the server could not start")
            self.phase, self.exit_code = DEAD, 1
            self.on_fatal()
            return
        self.engine.prefill_s_per_token = report.prefill_s_per_token
        self.warmup_step_time_s = report.step_time_s
        self.preparer = RequestPreparer(
            engine.tokenizer, engine.model_config.vocab_size,
            self.engine_config.scheduler.max_model_len, self.slo_config,
            serving_defaults_of(self.config, self.engine_config),
        )  # fmt: skip
        if self.phase == WARMING_UP:  # not if a signal began the drain meanwhile
            self.phase = READY
            logger.info("%s", self._ready_line(time.monotonic() - start))
            self._log_task = asyncio.create_task(self._log_periodically())

    def _ready_line(self, seconds: float) -> str:
        snapshot = self._snapshot() or EngineSnapshot()
        num_device, num_host = snapshot.num_device_blocks, snapshot.num_host_blocks
        block_size = self.engine_config.cache.block_size
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return (
            f"Ready in {seconds:.1f} s: serving {self.model_name} on http://{host}:"
            f"{self.config.port} (KV capacity: device {num_device} blocks = "
            f"{num_device * block_size} tokens, host {num_host} blocks = {num_host * block_size} "
            f"tokens; policy {self.engine_config.scheduler.policy})"
        )

    async def _log_periodically(self) -> None:
        """The stats line (unless --disable-log-stats) and the refusal summaries, each
        --log-stats-interval."""
        stats = None
        if not self.config.disable_log_stats:
            stats = StatsLogger(self._snapshot, self._take_ended_reports)
        while True:
            await asyncio.sleep(self.config.log_stats_interval)
            if stats is not None:
                stats.log_once()
            self.error_log.flush()

    def _take_ended_reports(self) -> list[SLOReport]:
        reports, self._ended_reports = self._ended_reports, []
        return reports

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; let in-flight requests finish for `timeout_s`, abort the rest."""
        if self.phase != DEAD:
            self.phase = DRAINING
        if self.engine is None:
            return
        if not await self.engine.wait_idle(timeout_s):
            logger.warning("aborting %d requests still running at shutdown", len(self.inflight))
            for request_id, inflight in list(self.inflight.items()):
                inflight.abort_reason = inflight.abort_reason or "shutdown"
                self.engine.abort(request_id)
            await self.engine.wait_idle(10.0)

    async def close(self) -> None:
        if self._log_task is not None:
            self._log_task.cancel()
        self.error_log.flush(is_final=True)
        if self.engine is not None and self.engine.is_alive:
            await self.engine.shutdown()
        self.phase = STOPPED if self.phase != DEAD else DEAD
        self.slo_log.close()

    @property
    def health(self) -> tuple[bool, str]:
        if self.phase == READY and self.engine is not None and not self.engine.is_alive:
            self.phase = DEAD
        return self.phase == READY, self.phase

    def _snapshot(self) -> EngineSnapshot | None:
        return self.engine.snapshot if self.engine is not None else None

    async def metrics_text(self) -> bytes:
        """The Prometheus exposition of this server's series."""
        return generate_latest(self.metrics.registry)

    # --- ingress checks -------------------------------------------------------------------
    def check_auth(self, headers: Mapping[str, str]) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise APIError(
                401, "missing or wrong API key (Authorization: Bearer KEY)", "invalid_api_key"
            )

    def check_ready(self) -> None:
        is_ready, phase = self.health
        if not is_ready:
            code = "draining" if phase in (DRAINING, STOPPED) else "not_ready"
            raise APIError(503, f"the server is {phase.replace('_', ' ')}", code,
                           headers={"Retry-After": "1"})  # fmt: skip

    @property
    def model_names(self) -> list[str]:
        """The names requests may use (--served-model-name), the one responses carry first."""
        return self.config.served_model_name or [self.model_name]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise APIError(404, f"the model {model[:128]!r} does not exist; this server serves "
                           f"{', '.join(map(repr, self.model_names))}", "model_not_found",
                           "model")  # fmt: skip

    def load(self, deadline: float | None = None) -> Load:
        """The engine's load for admission; with `deadline` (engine clock), the queue counts
        only requests due by then, where the policy admits by deadline."""
        assert self.engine is not None
        snapshot = self.engine.snapshot
        if not self.engine.engine.scheduler.policy.is_queue_by_deadline:
            deadline = None
        num_queued, num_queued_tokens = self.engine.queue_load(deadline)
        is_busy = snapshot.num_running > 0
        step_time = (
            snapshot.step_time_s if is_busy and snapshot.step_time_s else self.warmup_step_time_s
        )
        return Load(
            num_queued, num_queued_tokens, step_time, self.engine.prefill_s_per_token,
            self.engine_config.scheduler.max_num_batched_tokens,
        )  # fmt: skip

    # --- admitted requests ----------------------------------------------------------------
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
        elapsed_s = time.monotonic() - arrival.monotonic
        self.admission.check(
            self.load(), len(prepared.prompt_token_ids), expected_tokens,
            slo.targets.max_latency_ms, elapsed_s, slo.is_reject_infeasible,
        )  # fmt: skip
        ttft_ms = slo.binding_ttft_ms if self.config.reject_infeasible_ttft else None
        if ttft_ms is not None and slo.is_reject_infeasible:
            # the queue ahead of this request: all of it, or what is due before its TTFT
            load = self.load(deadline=arrival.monotonic + ttft_ms / 1000.0)
            self.admission.check_first_token(
                load, len(prepared.prompt_token_ids), ttft_ms, elapsed_s
            )
        inflight = self.inflight[prepared.request_id] = Inflight(prepared, arrival)
        stream = self.engine.add_request(
            prepared.request_id, prepared.prompt_token_ids, prepared.params,
            arrival.monotonic, prepared.priority, slo.targets, prepared.prompt,
        )  # fmt: skip
        if self.config.enable_log_requests:
            logger.info("Received request %s: prompt: %d tokens, params: %s, slo: %s, priority: %d",
                        prepared.request_id, len(prepared.prompt_token_ids), prepared.params,
                        slo.targets, prepared.priority)  # fmt: skip
        return stream, inflight

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
        inflight = self.inflight.pop(request_id, None)
        if inflight is None:
            return
        prepared = inflight.prepared
        record = _record_of(prepared, inflight.arrival, output)
        report = slo_report(record)
        inflight.report = report
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
        self._keep_for_stats(report)
        self.metrics.on_ended(report, record.num_prompt_tokens, record.num_tokens_out,
                              finish_reason, gaps)  # fmt: skip

    # --- rejected requests ----------------------------------------------------------------
    def reject(self, error: APIError, rejection: Rejection) -> None:
        """Count and log a request that never entered the queue."""
        now = time.monotonic()
        request_id = rejection.request_id or f"rejected-{uuid.uuid4().hex}"
        self.log_refusal(error, request_id)
        record = RequestRecord(
            request_id=request_id,
            targets=rejection.targets,
            arrival_time=rejection.arrival.monotonic,
            finished_time=now,
            outcome=REJECTED,
            num_prompt_tokens=rejection.num_prompt_tokens,
            num_output_tokens=0,
            rejection_reason=error.code,
        )
        report = slo_report(record)
        self.slo_log.write(log_line(record, report, rejection.arrival.wall, error.status,
                                    error.code, rejection.priority))  # fmt: skip
        self.metrics.on_rejected(rejection.targets.slo_class, error.code, report.is_slo_request)
        self._keep_for_stats(report)

    def log_refusal(self, error: APIError, request_id: str | None) -> None:
        """Log a refusal once, rate-limited per error code."""
        self.error_log.log(log_level_of(error.status), error.code, "Rejected request %s: %d %s: %s",
                           request_id or "-", error.status, error.code, error.message)  # fmt: skip

    def _keep_for_stats(self, report: SLOReport) -> None:
        if not self.config.disable_log_stats and self._log_task is not None:
            self._ended_reports.append(report)


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
