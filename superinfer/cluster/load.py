"""A replica's report of its load: what its own admission estimates from, for the router.

Read from the engine host's published snapshot and admission state (no engine call), so
reporting costs the replica next to nothing. Both routers read it: Ray Serve's through
`record_routing_stats` (deployment.py), superinfer's own through `GET /superinfer/load`
(the single server's route, `ServerState.routing_report`).
"""

from __future__ import annotations

import time

from superinfer.cluster.router import ReplicaLoad, learned_factors, on_wall_clock
from superinfer.server.engine_host import EngineHost


def replica_load(host: EngineHost, replica_id: str) -> ReplicaLoad:
    """`host`'s load now (an idle replica's before its engine published a snapshot)."""
    snapshot = host.snapshot
    if snapshot is None:
        return ReplicaLoad(replica_id, reported_at=time.time())
    admission, wall = host.admission, time.time()
    return ReplicaLoad(
        replica_id, on_wall_clock(host.load(), time.monotonic(), wall),
        admission.class_order, learned_factors(admission.correction, admission.class_order),
        admission.correction.floor_s, snapshot.num_running, snapshot.num_swapped,
        snapshot.device_kv_usage, snapshot.host_kv_usage, host.config.max_num_queued_reqs,
        host.config.max_num_queued_tokens, wall,
    )  # fmt: skip
