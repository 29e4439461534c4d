"""The Ray Serve request router of the engine replicas: Ray Serve keeps the replica set,
probes and retries; this class only orders the replicas, by `router.rank_replicas`.

Loads come from each replica's `record_routing_stats` (polled by Ray Serve every
`request_routing_stats_period_s`); requests this router sent after a replica's last report
and that have not completed are added to it, so a burst between two reports spreads out.
Calls carrying a `Target` go to that replica only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from superinfer.cluster import registry
from superinfer.cluster.calls import ReplicaCall, Target
from superinfer.cluster.router import ReplicaLoad, Unreported, rank_replicas


@dataclass(frozen=True)
class _Sent:
    replica_id: str
    num_prompt_tokens: int
    sent_at: float  # Unix time


class SlackRequestRouter(RequestRouter):
    """Ranks replicas by predicted slack of the pending request (see `router.py`)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._sent: dict[str, _Sent] = {}  # internal request id -> where it went

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        call = pending_request.args[0] if pending_request and pending_request.args else None
        if isinstance(call, Target):
            return [[by_id[call.replica_id]]] if call.replica_id in by_id else []
        if not isinstance(call, ReplicaCall):
            return [[r] for r in candidate_replicas]
        allowed = [r for r in candidate_replicas if r.replica_id.unique_id not in call.exclude]
        loads = [ReplicaLoad.from_stats(r.replica_id.unique_id, r.routing_stats or {})
                 for r in allowed]  # fmt: skip
        order = rank_replicas(loads, call.demand, self._unreported(loads))
        return [[by_id[replica_id]] for replica_id in order]

    def _unreported(self, loads: list[ReplicaLoad]) -> dict[str, Unreported]:
        reported_at = {load.replica_id: load.reported_at for load in loads}
        counts: dict[str, list[int]] = {}
        for sent in self._sent.values():
            if sent.sent_at > reported_at.get(sent.replica_id, float("inf")):
                count = counts.setdefault(sent.replica_id, [0, 0])
                count[0] += 1
                count[1] += sent.num_prompt_tokens
        return {replica_id: Unreported(n, tokens) for replica_id, (n, tokens) in counts.items()}

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: object
    ) -> None:
        call = pending_request.args[0] if pending_request.args else None
        if isinstance(call, ReplicaCall):
            self._sent[pending_request.metadata.internal_request_id] = _Sent(
                replica_id.unique_id, call.demand.num_prompt_tokens, time.time()
            )

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._sent.pop(internal_request_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish()

    def _publish(self) -> None:
        ids = tuple(sorted(r.replica_id.unique_id for r in self.curr_replicas.values()))
        registry.LIVE[self._deployment_id.name] = ids  # through the module: see registry.py
