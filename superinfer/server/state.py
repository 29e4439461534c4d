"""The single-process server: a `Front` (front.py) over an `EngineHost` (engine_host.py),
sharing one SLO log and one set of metrics, with the periodic log (periodic_log.py).

`ServerState` moves the front through the phases as the engine boots and drains:
loading -> warming_up -> ready -> draining (-> stopped); `dead` when loading, warm-up or
the engine thread failed. An engine replica of the scale-out runs the same composition
without HTTP (cluster/deployment.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest

from superinfer.config import EngineConfig
from superinfer.engine.native_memory import release_free_memory
from superinfer.engine.snapshot import EngineSnapshot
from superinfer.server.config import ServerConfig
from superinfer.server.engine_host import EngineHost, Inflight, default_engine_factory
from superinfer.server.front import DEAD, DRAINING, READY, STOPPED, WARMING_UP, Front
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.periodic_log import PeriodicLog
from superinfer.server.prepare import RequestPreparer, server_preparer
from superinfer.server.prometheus import ServerMetrics
from superinfer.slo.classes import SLOConfig
from superinfer.slo.record_log import SLOLog, TaggedSLOLog

if TYPE_CHECKING:
    from superinfer.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


class ServerState:
    """One engine in this process behind the front. `slo_log` (default: --slo-log) and
    `metrics` (default: this server's series over its engine) are shared by both parts."""

    def __init__(
        self,
        server_config: ServerConfig,
        engine_config: EngineConfig,
        slo_config: SLOConfig,
        model_name: str,
        engine_factory: Callable[[EngineConfig], LLMEngine] = default_engine_factory,
        slo_log: SLOLog | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.config = server_config
        self.engine_config = engine_config
        self.slo_config = slo_config
        self.model_name = model_name
        if slo_log is None:  # a replica behind superinfer's router tags its lines
            replica, path = server_config.replica_id, server_config.slo_log
            slo_log = TaggedSLOLog(path, replica) if replica else SLOLog(path)
        self.slo_log = slo_log
        if metrics is None:  # this server's series, the engine's read from its snapshot
            metrics = ServerMetrics(model_name, self._snapshot, slo_config.class_names,
                                    engine_config, self._ttft_factors)  # fmt: skip
        self.metrics = metrics
        error_log = RateLimitedLog(logger)  # refusals and failures, a few per reason
        self.periodic_log = PeriodicLog(server_config, self._snapshot, error_log)
        self.front = Front(
            server_config, model_name, self.slo_log, self.metrics, error_log,
            unavailable=self._unavailable, on_report=self.periodic_log.keep,
        )  # fmt: skip
        self.host = EngineHost(
            server_config, engine_config, self.slo_log, self.metrics, error_log,
            engine_factory, on_report=self.periodic_log.keep,
        )  # fmt: skip
        self.on_fatal: Callable[[], None] = lambda: None
        self.exit_code = 0

    def _ttft_factors(self) -> dict[str, float]:
        """The TTFT correction admission applies to each class (/metrics reads it)."""
        return self.host.admission.correction.applied(self.slo_config.class_names)

    # --- lifecycle ------------------------------------------------------------------------
    async def boot(self) -> None:
        """Load the engine off the loop, warm it up, then admit requests."""
        start = time.monotonic()
        model = self.engine_config.model.model or "SmolLM2-135M-Instruct, the default"
        logger.info("Loading the model (%s) and warming up; /health answers 503 meanwhile", model)
        try:
            await self.host.start()
            self.front.phase = WARMING_UP
            await self.host.warm_up()
        except Exception:
            logger.exception("the server could not start")
            self.front.phase, self.exit_code = DEAD, 1
            self.on_fatal()
            return
        self.front.preparer = self._preparer()
        release_free_memory()  # what loading, the warm-up and the preparer's tables left free
        if self.front.phase == WARMING_UP:  # not if a signal began the drain meanwhile
            self.front.phase = READY
            logger.info("%s", self._ready_line(time.monotonic() - start))
            self.periodic_log.start()

    def _preparer(self) -> RequestPreparer:
        assert self.host.engine is not None
        engine = self.host.engine.engine
        return server_preparer(engine.tokenizer, engine.model_config.vocab_size, self.config,
                               self.engine_config, self.slo_config)  # fmt: skip

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

    async def drain(self, timeout_s: float) -> None:
        """Stop admitting; let in-flight requests finish for `timeout_s`, abort the rest."""
        if self.front.phase != DEAD:
            self.front.phase = DRAINING
        await self.host.drain(timeout_s)

    async def close(self) -> None:
        self.periodic_log.close()
        await self.host.shutdown()
        self.front.phase = STOPPED if self.front.phase != DEAD else DEAD
        self.slo_log.close()

    def _unavailable(self) -> str | None:
        return DEAD if self.host.is_dead else None

    def _snapshot(self) -> EngineSnapshot | None:
        return self.host.snapshot

    # --- what the routes and the responses read -------------------------------------------
    async def metrics_text(self) -> bytes:
        """The Prometheus exposition of this server's series."""
        return generate_latest(self.metrics.registry)

    async def debug_report(self) -> dict[str, Any] | None:
        return await self.host.debug_report()

    def routing_report(self) -> dict[str, Any] | None:
        """What a router in front of this server routes on (`GET /superinfer/load`): the
        load its admission estimates from and the model's vocabulary size; None until
        ready."""
        from superinfer.cluster.load import replica_load  # the router's plain data

        if self.front.preparer is None:
            return None
        load = replica_load(self.host, self.config.replica_id or "")
        return {"load": load.to_stats(), "vocab_size": self.front.preparer.vocab_size}

    def abort(self, inflight: Inflight, reason: str) -> None:
        """Abort an admitted request unless it already ended (no-op then)."""
        self.host.abort(inflight, reason)
