"""The engine replica: a Ray Serve deployment that owns one engine and its KV tiers.

Each replica runs the single-process server's `ServerState` (a front over an engine host)
without HTTP: the same warm-up, admission (its own queue bounds and deadline estimate), SLO
records (into a log tagged with the replica id) and metrics.
The ingress calls `generate` as a streaming call; the first item is the admission
`Verdict`, then the SSE events (stream) or one `(status, body)` (non-stream). A cancelled
call (the client left) aborts the request, freeing its KV blocks in both tiers.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from superinfer.cluster.calls import ReplicaCall, Verdict
from superinfer.cluster.load import replica_load
from superinfer.cluster.router import Refusal, ReplicaLoad
from superinfer.config import EngineConfig
from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError
from superinfer.server.front import DRAINING, READY
from superinfer.server.generation import abort_all, admit_choices, collect_choices, stream_choices
from superinfer.server.state import ServerState
from superinfer.slo.classes import SLOConfig
from superinfer.slo.record_log import TaggedSLOLog


class EngineReplica:
    """One engine behind the ingress (deployed with `SlackRequestRouter`)."""

    async def __init__(
        self,
        server_config: ServerConfig,
        engine_config: EngineConfig,
        slo_config: SLOConfig,
        model_name: str,
    ) -> None:
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        slo_log = TaggedSLOLog(server_config.slo_log, self.replica_id)
        self.state = ServerState(server_config, engine_config, slo_config, model_name,
                                 slo_log=slo_log)  # fmt: skip
        await self.state.boot()  # Ray Serve routes to the replica once this returns
        phase = self.state.front.phase
        if phase != READY:
            raise RuntimeError(f"replica {self.replica_id} failed to start ({phase})")

    async def generate(self, call: ReplicaCall) -> AsyncIterator[Any]:
        """Admit `call` here or refuse it; then stream its answer."""
        prepared = call.prepared
        # the arrival on this process's clock: skew-free (only the ingress's elapsed time)
        arrival = Arrival(time.monotonic() - call.elapsed_s, call.arrival_wall)
        try:
            self.state.front.check_ready()
            # every sequence of n / best_of is admitted here, sharing the prompt's KV
            choices = admit_choices(self.state.host, prepared, arrival, call.expected_tokens)
        except APIError as error:
            refusal = Refusal(error.status, error.message, error.code, error.headers,
                              error.reason, error.estimated_ttft_ms)  # fmt: skip
            yield Verdict(self.replica_id, refusal)
            return
        yield Verdict(self.replica_id, estimated_ttft_ms=choices[0].inflight.estimated_ttft_ms)
        try:
            if prepared.stream:
                async for event in stream_choices(self.state, choices, prepared, call.is_chat):
                    yield event
            else:
                yield await collect_choices(self.state, choices, prepared, call.is_chat)
        finally:  # a no-op once the request ended; else the caller went away
            abort_all(self.state, choices, "client_disconnected")

    def record_routing_stats(self) -> dict[str, Any]:
        """The load the router ranks by (Ray Serve polls it)."""
        return self.load().to_stats()

    def load(self) -> ReplicaLoad:
        """What this replica's admission estimates from (the router estimates with it)."""
        return replica_load(self.state.host, self.replica_id)

    def preparer_parts(self) -> tuple[Any, int, int]:
        """(tokenizer, vocab size, max model length): what the ingress validates against."""
        preparer = self.state.front.preparer
        assert preparer is not None
        return preparer.tokenizer, preparer.vocab_size, preparer.max_model_len

    async def metrics_text(self) -> tuple[str, bytes]:
        """(replica id, this replica's Prometheus exposition)."""
        return self.replica_id, await self.state.metrics_text()

    async def debug(self) -> dict[str, Any]:
        """Engine report for tests: KV ownership and the invariant check."""
        report = await self.state.host.debug_report()
        assert report is not None
        return {"replica": self.replica_id, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                **report}  # fmt: skip

    def check_health(self) -> None:
        """Ray Serve restarts a replica whose engine thread died."""
        front = self.state.front
        if not front.health[0] and front.phase != DRAINING:
            raise RuntimeError(f"replica {self.replica_id} is {front.phase}")

    async def __del__(self) -> None:
        await self.state.drain(self.state.config.shutdown_timeout)
        await self.state.close()
