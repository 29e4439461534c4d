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

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from superinfer.cluster import registry
from superinfer.cluster.calls import ReplicaCall
from superinfer.cluster.router import ReplicaLoad, RoutedSince, rank_replicas


class SlackRequestRouter(RequestRouter):
    """Ranks replicas by the pending request's slack on their own estimates (`router.py`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._routed = RoutedSince()  # by Ray Serve's internal request id

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
        order = rank_replicas(loads, call.demand, self._routed.unreported(loads),
                              self._routed.prefixes)  # fmt: skip
        if order:  # counted against its replica until it completes (or a report covers it)
            request_id = pending_request.metadata.internal_request_id
            chosen = next(load for load in loads if load.replica_id == order[0])
            self._routed.add(request_id, order[0], call.demand, time.time(), chosen)
        return [[by_id[replica_id]] for replica_id in order]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self._routed.remove(internal_request_id, time.time())

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish()

    def _publish(self) -> None:
        ids = tuple(sorted(r.replica_id.unique_id for r in self.curr_replicas.values()))
        registry.LIVE[self._deployment_id.name] = ids  # through the module: see registry.py
