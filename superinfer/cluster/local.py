"""`superinfer serve --replicas N` on one machine: N single-process servers on loopback
ports, each its own process with `--replica-cpus` threads (and with `--device cuda` one
GPU of those visible, in turn), behind superinfer's router (proxy.py) on the public host
and port.

The replicas run in their own sessions, so a Ctrl-C reaches the router alone; the router
then stops them in order: it stops admitting, sends each replica SIGTERM (each drains its
own requests within `--shutdown-timeout`, as a single server does), waits for the requests
it relays, and exits once the replicas have. A replica whose router died exits too.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from superinfer.cluster.app import ClusterConfig
    from superinfer.config import EngineConfig
    from superinfer.server.config import ServerConfig
    from superinfer.slo.classes import SLOConfig

logger = logging.getLogger(__name__)

REPLICA_HOST = "127.0.0.1"
KILL_GRACE_S = 5.0


def run_local_cluster(
    server: ServerConfig, engine: EngineConfig, slo: SLOConfig, cluster: ClusterConfig
) -> int:
    """Start the replicas, serve the router until SIGTERM/SIGINT, stop the replicas."""
    from superinfer.cluster.proxy import RouterState, generate_via_router
    from superinfer.server.app import build_app
    from superinfer.server.launcher import model_name_of, serve_app

    # the replicas inherit it: two engines on two cores must not each spawn two threads
    os.environ["OMP_NUM_THREADS"] = str(max(1, int(cluster.replica_cpus)))
    ports = [_free_port() for _ in range(cluster.replicas)]
    replicas = [_start_replica(server, engine, slo, i, port) for i, port in enumerate(ports)]
    logger.info("Started %d replicas on %s ports %s (OMP_NUM_THREADS=%s each)", len(replicas),
                REPLICA_HOST, ", ".join(map(str, ports)), os.environ["OMP_NUM_THREADS"])  # fmt: skip
    state = RouterState(
        server, engine, slo, model_name_of(engine, server),
        [f"http://{REPLICA_HOST}:{port}" for port in ports], cluster.routing,
        cluster.routing_stats_period_s, cluster.routing_attempts,
        on_drain=lambda: _signal_all(replicas),
        is_replica_alive=lambda i: replicas[i].is_alive(),
    )  # fmt: skip
    try:
        return serve_app(build_app(state, generate_via_router), state, server)
    finally:
        _stop_all(replicas, server.shutdown_timeout)


def replica_gpu(index: int, device: str, visible: str | None) -> str | None:
    """The CUDA_VISIBLE_DEVICES of replica `index`: one GPU each, in turn from those this
    process sees (`visible`; all, by index, when unset); None off CUDA (left as it is)."""
    if not device.startswith("cuda"):
        return None
    gpus = [gpu.strip() for gpu in visible.split(",") if gpu.strip()] if visible else []
    return gpus[index % len(gpus)] if gpus else str(index)


def _start_replica(
    server: ServerConfig, engine: EngineConfig, slo: SLOConfig, index: int, port: int
) -> BaseProcess:
    config = dataclasses.replace(
        server, host=REPLICA_HOST, port=port, replica_id=f"replica-{index}"
    )
    gpu = replica_gpu(index, _device(engine), os.environ.get("CUDA_VISIBLE_DEVICES"))
    process = multiprocessing.get_context("spawn").Process(
        target=_replica_main, args=(config, engine, slo, os.getpid(), gpu),
        name=f"superinfer-replica-{index}",
    )  # fmt: skip
    process.start()
    return process


def _device(engine: EngineConfig) -> str:
    """--device, with auto resolved as the engine resolves it (no CUDA context is made)."""
    if engine.model.device != "auto":
        return engine.model.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _replica_main(
    server: ServerConfig, engine: EngineConfig, slo: SLOConfig, parent: int, gpu: str | None
) -> None:
    """A replica's process: the single server, in its own session, tied to its router."""
    if gpu is not None:  # before anything initialises CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    from superinfer.logs import configure_logging
    from superinfer.server.launcher import run_server

    os.setsid()
    configure_logging(server.log_level)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    sys.exit(run_server(server, engine, slo))


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)  # drains, as on any SIGTERM


def _signal_all(replicas: list[BaseProcess]) -> None:
    for process in replicas:
        if process.is_alive() and process.pid is not None:
            os.kill(process.pid, signal.SIGTERM)


def _stop_all(replicas: list[BaseProcess], shutdown_timeout_s: float) -> None:
    """SIGTERM every replica still up, wait for their drain, kill what is left."""
    _signal_all(replicas)
    deadline = time.monotonic() + shutdown_timeout_s + KILL_GRACE_S
    for process in replicas:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            logger.warning("replica %s did not stop in time: killed", process.name)
            process.kill()
            process.join()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((REPLICA_HOST, 0))
        return sock.getsockname()[1]
