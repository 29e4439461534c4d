"""Build and run the Ray Serve application: the ingress in front of N engine replicas.

`superinfer serve --replicas N` calls `run_cluster` (a local Ray, or the cluster in
RAY_ADDRESS); a Ray Serve config file names `app_builder` as its import path
(deploy/ray/serve_config.yaml).
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass
from typing import Any

from superinfer.config import EngineConfig, opt
from superinfer.server.config import ServerConfig
from superinfer.slo.classes import SLOConfig

APP_NAME = "superinfer"


@dataclass
class ClusterConfig:
    """Options of the scale-out (`superinfer serve --replicas N`)."""

    replicas: int = opt(1, "Engine replicas behind one endpoint; 1 (without --router ray): "
                        "the single-process server (see docs/scale-out.md).")  # fmt: skip
    router: str = opt("superinfer", "What routes to the replicas: `superinfer`, its own router "
                      "over N local server processes (one HTTP hop), or `ray`, a Ray Serve "
                      "application (a local Ray, or the cluster in RAY_ADDRESS; the `ray` "
                      "extra).", choices=["superinfer", "ray"])  # fmt: skip
    routing: str = opt("slo", "How the router picks a replica: `slo`, by the request's slack "
                       "on each replica's own TTFT estimate, or `power-of-two`, Ray Serve's "
                       "default (the less busy of two drawn at random).",
                       choices=["slo", "power-of-two"])  # fmt: skip
    routing_attempts: int = opt(0, "How many replicas a request may be refused by before the "
                                "client gets the refusal: a replica's 425 or 429 moves the "
                                "request to the next in its order. 0: every live replica; 1: "
                                "none more, as Ray Serve's own router (which passes a "
                                "replica's answer through) does.")  # fmt: skip
    replica_cpus: float = opt(1.0, "Threads of each replica (OMP_NUM_THREADS; Ray also reserves "
                              "that many CPUs), so replicas on one machine do not "
                              "oversubscribe the cores.")  # fmt: skip
    replica_gpus: float | None = opt(
        None, "GPUs per replica (default: 1 with a CUDA device, else 0)."
    )
    routing_stats_period_s: float = opt(
        0.1, "How often each replica reports its load to the router, in seconds."
    )

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.routing_attempts < 0:
            raise ValueError(f"routing_attempts must be >= 0, got {self.routing_attempts}")


def build_application(
    server: ServerConfig, engine: EngineConfig, slo: SLOConfig, cluster: ClusterConfig
) -> Any:
    """The Ray Serve application (bound ingress and replica deployments)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from superinfer.cluster.deployment import EngineReplica
    from superinfer.cluster.ingress import ClusterIngress
    from superinfer.cluster.ray_router import SlackRequestRouter
    from superinfer.server.launcher import model_name_of

    model_name = model_name_of(engine, server)
    gpus = cluster.replica_gpus
    if gpus is None:
        gpus = 1.0 if engine.model.device.startswith("cuda") else 0.0
    router = RequestRouterConfig(  # power-of-two: Ray Serve's own default router
        request_router_class=SlackRequestRouter if cluster.routing == "slo"
        else "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter",
        request_routing_stats_period_s=cluster.routing_stats_period_s,
    )  # fmt: skip
    # superinfer's admission bounds the queue: Ray Serve must not queue or cap before it
    max_ongoing = server.max_num_queued_reqs + engine.scheduler.max_num_seqs
    replica = serve.deployment(
        EngineReplica, name="EngineReplica", num_replicas=cluster.replicas,
        max_ongoing_requests=max_ongoing, request_router_config=router,
        ray_actor_options={"num_cpus": cluster.replica_cpus, "num_gpus": gpus},
        health_check_period_s=2.0, graceful_shutdown_timeout_s=server.shutdown_timeout,
    )  # fmt: skip
    ingress = serve.deployment(
        ClusterIngress, name="Ingress", num_replicas=1,
        max_ongoing_requests=max_ongoing * cluster.replicas, ray_actor_options={"num_cpus": 0},
    )  # fmt: skip
    engines = replica.bind(server, engine, slo, model_name)
    return ingress.bind(engines, server, engine, slo, model_name, cluster.routing_attempts)


def app_builder(args: dict[str, Any]) -> Any:
    """For Ray Serve config files: `args` are `superinfer serve` flags, underscored
    (`{"replicas": 2, "slo_log": "/tmp/slo.jsonl", "enable_prefix_caching": false}`)."""
    from superinfer.cli import build_parser, serve_configs_from_args

    argv = ["serve"]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    server, engine, slo, cluster = serve_configs_from_args(build_parser().parse_args(argv))
    return build_application(server, engine, slo, cluster)


def run_cluster(
    server: ServerConfig, engine: EngineConfig, slo: SLOConfig, cluster: ClusterConfig
) -> int:
    """Start (or join, with RAY_ADDRESS) Ray, serve on host:port until SIGTERM/SIGINT,
    then shut the application down (replicas drain within --shutdown-timeout)."""
    import ray
    from ray import serve

    ray.init(ignore_reinit_error=True, include_dashboard=False)
    serve.start(http_options={"host": server.host, "port": server.port})
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.run(build_application(server, engine, slo, cluster), name=APP_NAME,
                  route_prefix="/")  # fmt: skip
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
