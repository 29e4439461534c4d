"""Options of `superinfer serve` beyond the engine's (flags are derived from the fields)."""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.config import opt


@dataclass
class ServerConfig:
    host: str = opt("127.0.0.1", "Address to bind (0.0.0.0 serves every interface).")
    port: int = opt(8000, "Port to bind.")
    api_key: str | None = opt(
        None,
        "Require 'Authorization: Bearer KEY' on the /v1 routes (the SUPERINFER_API_KEY "
        "environment variable sets it too).",
    )
    served_model_name: str | None = opt(
        None, "Model name in the API (default: the model file or directory name)."
    )
    max_num_queued_reqs: int = opt(
        1024, "Most requests waiting for admission at once; more get 429 with Retry-After."
    )
    max_num_queued_tokens: int = opt(
        1 << 20, "Most prompt tokens waiting for admission at once; more get 429."
    )
    reject_infeasible_ttft: bool = opt(
        True,
        "Answer 425 slo_infeasible when a request that set a TTFT target (or whose class "
        "rejects infeasible requests) cannot get its first token in time by the server's "
        "estimate. Requests on the default targets are never rejected for TTFT.",
    )
    slo_config: str | None = opt(
        None,
        "YAML or JSON file with the SLO classes (default targets, reserved KV and token "
        "shares, rejection rule) and the default targets. See docs/slo.md.",
    )
    slo_log: str | None = opt(
        None, "Append one JSON line per request (finished, aborted, rejected) to this file."
    )
    shutdown_timeout: float = opt(
        30.0, "On SIGTERM/SIGINT, seconds to let in-flight requests finish before aborting them."
    )
    enable_debug_routes: bool = opt(
        False, "Serve GET /debug/engine (KV ownership, invariants): for tests, never in production."
    )
    uvicorn_log_level: str = opt(
        "warning",
        "Log level of the HTTP server.",
        choices=["critical", "error", "warning", "info", "debug"],
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must lie in [0, 65535], got {self.port}")
        if self.max_num_queued_reqs < 1 or self.max_num_queued_tokens < 1:
            raise ValueError("max_num_queued_reqs and max_num_queued_tokens must be >= 1")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")
