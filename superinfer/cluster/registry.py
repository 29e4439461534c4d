"""Which engine replicas the router in this process routes to, for the ingress (health,
per-replica metrics, when to stop trying replicas).

Kept in its own module and read through the module object: Ray Serve ships the router
class to the ingress process by value, so a global defined next to it would be a copy.
"""

from __future__ import annotations

LIVE: dict[str, tuple[str, ...]] = {}  # deployment name -> replica ids


def live_replicas(deployment_name: str) -> tuple[str, ...]:
    """Replica ids the router of `deployment_name` in this process currently knows."""
    return LIVE.get(deployment_name, ())
