"""The Ray Serve request router of the engine replicas: Ray Serve keeps the replica set,
probes and retries; this class only orders the replicas, by `router.rank_replicas`.

Loads come from each replica's `record_routing_stats` (polled by Ray Serve every
`request_routing_stats_period_s`): what its own admission estimates from, so the ranking is
by the replicas' own TTFT estimates. Requests this router chose a replica for after its
last report, and that have not completed, join that replica's queue in the estimate, so a
burst between two reports spreads out (a request counts from its choice, before Ray Serve
has sent it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from superinfer.cluster import registry
from superinfer.cluster.calls import ReplicaCall
from superinfer.cluster.router import ReplicaLoad, rank_replicas
from superinfer.slo.estimate import Queued

_MAX_OPEN, _OPEN_TTL_S = 10_000, 600.0


@dataclass(frozen=True)
class _Chosen:
    replica_id: str
    queued: Queued  # the request as it waits there (deadline on the Unix clock)
    chosen_at: float  # Unix time


class SlackRequestRouter(RequestRouter):
    """Ranks replicas by the pending request's slack on their own estimates (`router.py`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._open: dict[str, _Chosen] = {}  # internal request id -> its first choice

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        call = pending_request.args[0] if pending_request and pending_request.args else None
        if not isinstance(call, ReplicaCall):
            return [[r] for r in candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        loads = [ReplicaLoad.from_stats(replica_id, r.routing_stats or {})
                 for replica_id, r in by_id.items() if replica_id not in call.exclude]  # fmt: skip
        order = rank_replicas(loads, call.demand, self._unreported(loads))
        if order:  # counted against its replica until it completes (or a report covers it)
            request_id = pending_request.metadata.internal_request_id
            self._open[request_id] = _Chosen(order[0], call.demand.as_queued(), time.time())
        return [[by_id[replica_id]] for replica_id in order]

    def _unreported(self, loads: list[ReplicaLoad]) -> dict[str, list[Queued]]:
        """Open requests chosen for each replica after its last report."""
        reported_at = {load.replica_id: load.reported_at for load in loads}
        sent: dict[str, list[Queued]] = {}
        for chosen in self._open.values():
            if chosen.chosen_at > reported_at.get(chosen.replica_id, float("inf")):
                sent.setdefault(chosen.replica_id, []).append(chosen.queued)
        return sent

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self._open.pop(internal_request_id, None)
        if len(self._open) > _MAX_OPEN:  # requests cancelled before they were sent
            horizon = time.time() - _OPEN_TTL_S
            self._open = {k: v for k, v in self._open.items() if v.chosen_at > horizon}

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish()

    def _publish(self) -> None:
        ids = tuple(sorted(r.replica_id.unique_id for r in self.curr_replicas.values()))
        registry.LIVE[self._deployment_id.name] = ids  # through the module: see registry.py
