"""Start the server: bind at once (/health answers 503 while the model loads and warms
up), serve until SIGTERM/SIGINT, then drain: stop admitting (503), let in-flight requests
finish within `--shutdown-timeout`, abort the rest, flush and close the SLO log, exit 0.
A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

import uvicorn

from superinfer.config import EngineConfig
from superinfer.server.app import build_app, generate_here
from superinfer.server.config import ServerConfig
from superinfer.server.state import ServerState
from superinfer.slo.classes import SLOConfig

logger = logging.getLogger(__name__)


class Drainable(Protocol):
    """What `DrainingServer` drains: the single server's state, or the router's."""

    config: ServerConfig
    on_fatal: Callable[[], None]

    async def drain(self, timeout_s: float) -> None: ...


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain between the first signal and the exit."""

    def __init__(self, config: uvicorn.Config, state: Drainable) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        self.state.on_fatal = self._exit_now
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (main thread): first signal drains, a second one exits now."""
        if self._drain_task is None and not self.should_exit and self._loop is not None:
            logger.warning("signal %d: draining (a second signal exits at once)", sig)
            self._loop.call_soon_threadsafe(self._start_drain)
        else:
            self.should_exit = self.force_exit = True

    def _start_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            await self.state.drain(self.state.config.shutdown_timeout)
        finally:
            self.should_exit = True

    def _exit_now(self) -> None:
        self.should_exit = True


def model_name_of(engine_config: EngineConfig, server_config: ServerConfig) -> str:
    if server_config.served_model_name:
        return server_config.served_model_name[0]
    path = engine_config.model.model
    if path is None:
        return "SmolLM2-135M-Instruct"
    name = os.path.basename(os.path.normpath(path))
    return name.removesuffix(".gguf")


def run_server(
    server_config: ServerConfig, engine_config: EngineConfig, slo_config: SLOConfig
) -> int:
    """Serve until a signal; returns the process exit code."""
    state = ServerState(server_config, engine_config, slo_config,
                        model_name_of(engine_config, server_config))  # fmt: skip
    return serve_app(build_app(state, generate_here), state, server_config)


def serve_app(app: Any, state: Any, server_config: ServerConfig) -> int:
    """Serve `app` (over `state`, a `Drainable` with an `exit_code`) until a signal."""
    # log_config=None: uvicorn's lines go through the root logger (superinfer.logs's format)
    config = uvicorn.Config(
        app, host=server_config.host, port=server_config.port,
        log_level=server_config.uvicorn_log_level or server_config.log_level, log_config=None,
        access_log=False, lifespan="on", timeout_graceful_shutdown=5, timeout_keep_alive=30,
    )  # fmt: skip
    server = DrainingServer(config, state)
    asyncio.run(server.serve())
    if not server.started and state.exit_code == 0:
        return 1  # could not bind
    return state.exit_code
