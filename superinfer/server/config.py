"""Options of `superinfer serve` beyond the engine's (flags are derived from the fields)."""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.config import opt
from superinfer.logs import LEVELS


@dataclass
class ServerConfig:
    host: str = opt("127.0.0.1", "Address to bind (0.0.0.0 serves every interface).")
    port: int = opt(8000, "Port to bind.")
    api_key: str | None = opt(
        None,
        "Require 'Authorization: Bearer KEY' on the /v1 routes (the SUPERINFER_API_KEY "
        "environment variable sets it too).",
    )
    served_model_name: list[str] | None = opt(
        None,
        "Model names in the API, as vLLM's flag: requests may name any of them, responses "
        "carry the first (default: the model file or directory name).",
    )
    chat_template: str | None = opt(
        None,
        "Chat template for /v1/chat/completions, a Jinja file or the template itself "
        "(default: the tokenizer's own).",
    )
    generation_config: str = opt(
        "auto",
        "Default sampling parameters (temperature, top_p, top_k, min_p, repetition_penalty, "
        "max_new_tokens) for the fields "
        "a request does not set, as vLLM's flag: auto reads the model directory's "
        "generation_config.json, vllm uses none, or a directory holding that file.",
    )
    tool_call_parser: str = opt(
        "hermes",
        "How tool calls are written and parsed on /v1/chat/completions (vLLM's flag): hermes, "
        '<tool_call>{"name": ..., "arguments": ...}</tool_call>, the default model '
        "family's format. A chat template that ignores tools gets them in this format's "
        "system prompt. See docs/openai-api.md.",
        choices=["hermes"],
    )
    enable_auto_tool_choice: bool = opt(
        False,
        "vLLM's flag, accepted: tool_choice auto (the default with tools) is always on, "
        "parsed with --tool-call-parser.",
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
    reject_infeasible_tbt: bool = opt(
        True,
        "Answer 425 slo_infeasible (reason tbt_infeasible) when a request that set a TBT "
        "target (or whose class rejects infeasible requests) cannot get a token every TBT "
        "on average by the server's estimate, or its prompt would make running requests of "
        "its class or above miss the TBT they were admitted with. Requests on the default "
        "targets are never rejected for TBT. On by default since 12-07: two one-thread "
        "replicas overloaded with multi-turn chat kept 63-74%% of the promises they made "
        "without it and 96-98%% with it, and the single server's class mix was unchanged "
        "(docs/slo.md).",
    )
    admission_quantile: float = opt(
        0.9,
        "How surely an admitted request's first token comes in time: admission scales its "
        "TTFT estimate by this quantile of the recent measured/estimated ratios (in [0.5, 1); "
        "higher refuses more and misses fewer). See docs/slo.md.",
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
    log_level: str = opt(
        "info",
        "Log level: info tells what was loaded, warm-up, the ready line and the stats line.",
        choices=list(LEVELS),
    )
    disable_log_stats: bool = opt(
        False, "Do not log the periodic stats line (throughput, requests, KV usage, SLOs)."
    )
    log_stats_interval: float = opt(60.0, "Seconds between two stats lines.")
    enable_log_requests: bool = opt(
        False,
        "Log each admitted request (id, prompt length, sampling params, SLO targets) at info.",
    )
    replica_id: str | None = opt(
        None,
        "Set by `--replicas N` on the servers it starts behind its router: tags their SLO "
        "log lines and leaves the record of a refusal (425/429/503), which the router may "
        "retry on another replica, to the router.",
    )
    uvicorn_log_level: str | None = opt(
        None,
        "Log level of the HTTP server (default: --log-level; its access log stays off).",
        choices=list(LEVELS),
    )

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must lie in [0, 65535], got {self.port}")
        if self.max_num_queued_reqs < 1 or self.max_num_queued_tokens < 1:
            raise ValueError("max_num_queued_reqs and max_num_queued_tokens must be >= 1")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")
        if not self.log_stats_interval > 0:
            raise ValueError(f"log_stats_interval must be > 0, got {self.log_stats_interval}")
        if not 0.5 <= self.admission_quantile < 1:
            raise ValueError(
                f"admission_quantile must lie in [0.5, 1), got {self.admission_quantile}"
            )
