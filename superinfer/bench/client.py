"""One streaming request to an OpenAI-compatible endpoint, timed on the client's clock.

The client stamps the moment it sends the request and the moment each streamed chunk that
carries text arrives (`time.perf_counter`), keeps the final `usage` and, from superinfer,
the server's own `slo` report. `to_record` turns the raw result into the metrics module's
`RequestRecord`: TTFT runs from the send, chunk times stand in for token times (TPOT uses
the `usage` token count, so several tokens in one chunk are counted right).

Outcomes: a 200 stream that ends with a finish reason is finished; 425, 429 and 503 are
capacity rejections (counted as not met); other 4xx are the client's own mistakes (left
out of attainment, reported as failed); a 5xx, a transport error or a stream cut short is
an aborted request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from superinfer.slo import SLOTargets
from superinfer.slo.metrics import ABORTED, CAPACITY_REJECTIONS, FINISHED, REJECTED, RequestRecord
from superinfer.slo.wire import HEADER_ESTIMATED_TTFT, slo_body, slo_headers

CAPACITY_STATUS = {425: "slo_infeasible", 429: "queue_full", 503: "not_ready"}


@dataclass(frozen=True)
class RequestSpec:
    """What to send: the prompt, how many tokens to generate, the targets, when."""

    request_id: str
    prompt: str
    num_prompt_tokens: int  # the dataset's count (the server's usage replaces it)
    max_tokens: int
    targets: SLOTargets
    arrival_s: float  # scheduled send time, seconds from the start of the run
    # a conversation's turn (multi-turn workloads): its texts so far, human turns and
    # reference replies alternating, and its (conversation, turn) numbers
    turns: tuple[str, ...] = ()
    turn: tuple[int, int] | None = None
    # a later turn is sent this long after the conversation's previous turn ended (a user
    # reads, then types), not at `arrival_s`, which is then when it would come at the earliest
    think_s: float | None = None


@dataclass(frozen=True)
class RequestOptions:
    """How to send: endpoint, model, sampling and where the SLO goes."""

    url: str  # base URL + endpoint
    model: str
    is_chat: bool = False
    temperature: float = 0.0
    ignore_eos: bool = True
    slo_transport: str = "both"  # both | headers | body | none
    send_priority: bool = False  # body `priority` = the class's rank in `class_ranks`
    class_ranks: dict[str, int] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # e.g. Authorization


@dataclass
class RequestResult:
    """What came back, on the client's clock (`time.perf_counter` seconds)."""

    spec: RequestSpec
    send_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    end_time: float | None = None
    status: int | None = None
    error_code: str | None = None
    error: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    server_slo: dict[str, Any] | None = None
    num_chars: int = 0
    estimated_ttft_ms: float | None = None  # the server's admission estimate, if it gave one
    text: list[str] = field(default_factory=list)  # the streamed text, chunk by chunk

    @property
    def outcome(self) -> str:
        if self.status == 200 and self.finish_reason is not None and not self.error:
            return FINISHED
        if self.status is not None and (400 <= self.status < 500 or self.status == 503):
            return REJECTED
        return ABORTED


Answers = dict[tuple[int, int], str]  # (conversation, turn) -> the reply the server gave


def chat_messages(spec: RequestSpec, answers: Answers | None = None) -> list[dict[str, str]]:
    """The request as chat messages: one user message, or a conversation so far, where
    each earlier turn's reply is the one the server streamed for it if that ended before
    this turn is sent (as a chat client resends its history), else the reference reply."""
    if not spec.turns or spec.turn is None:
        return [{"role": "user", "content": spec.prompt}]
    answers = answers or {}
    conversation = spec.turn[0]
    return [{"role": "user", "content": text} if i % 2 == 0 else
             {"role": "assistant", "content": answers.get((conversation, i // 2), text)}
             for i, text in enumerate(spec.turns)]  # fmt: skip


def request_body(spec: RequestSpec, options: RequestOptions, answers: Answers | None = None
                 ) -> dict[str, Any]:  # fmt: skip
    """The JSON body: streaming with usage, `ignore_eos`, `max_tokens`, and the SLO."""
    body: dict[str, Any] = {
        "model": options.model,
        "max_tokens": spec.max_tokens,
        "temperature": options.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": options.ignore_eos,
    }
    if options.is_chat:
        body["messages"] = chat_messages(spec, answers)
    else:
        body["prompt"] = spec.prompt
    if options.slo_transport in ("both", "body"):
        body["slo"] = slo_body(spec.targets)
    if options.send_priority and spec.targets.slo_class in options.class_ranks:
        body["priority"] = options.class_ranks[spec.targets.slo_class]
    return body


def request_headers(spec: RequestSpec, options: RequestOptions) -> dict[str, str]:
    headers = dict(options.headers)
    if options.slo_transport in ("both", "headers"):
        headers.update(slo_headers(spec.targets))
    return headers


async def send(client: httpx.AsyncClient, spec: RequestSpec, options: RequestOptions,
               answers: Answers | None = None) -> RequestResult:  # fmt: skip
    """Send one streaming request and time its chunks; never raises for HTTP or transport
    errors (they are recorded in the result). A conversation's turn reads its earlier
    replies from `answers`, and leaves its own there once it finished."""
    result = RequestResult(spec)
    body, headers = request_body(spec, options, answers), request_headers(spec, options)
    result.send_time = time.perf_counter()
    try:
        async with client.stream("POST", options.url, json=body, headers=headers) as response:
            result.status = response.status_code
            result.estimated_ttft_ms = _float_or_none(response.headers.get(HEADER_ESTIMATED_TTFT))
            if response.status_code != 200:
                await _read_error(response, result)
            else:
                await _read_stream(response, result, options.is_chat)
    except httpx.HTTPError as error:
        result.error = result.error or f"{type(error).__name__}: {error}"
    result.end_time = time.perf_counter()
    if result.status == 200 and result.finish_reason is None and not result.error:
        result.error = "the stream ended without a finish reason"
    if answers is not None and spec.turn is not None and result.outcome == FINISHED:
        answers[spec.turn] = "".join(result.text)
    return result


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


async def _read_error(response: httpx.Response, result: RequestResult) -> None:
    text = (await response.aread()).decode("utf-8", errors="replace")
    code = None
    try:
        error = json.loads(text).get("error")
        code = error.get("code") if isinstance(error, dict) else None
    except (ValueError, AttributeError):
        pass
    if response.status_code in CAPACITY_STATUS and code not in CAPACITY_REJECTIONS:
        code = CAPACITY_STATUS[response.status_code]  # another server's name for the same
    result.error_code = code or f"http_{response.status_code}"
    result.error = f"HTTP {response.status_code}: {text[:500]}"


async def _read_stream(response: httpx.Response, result: RequestResult, is_chat: bool) -> None:
    async for line in response.aiter_lines():
        now = time.perf_counter()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        _read_chunk(chunk, now, result, is_chat)


def _read_chunk(chunk: dict[str, Any], now: float, result: RequestResult, is_chat: bool) -> None:
    if chunk.get("error"):
        result.error = json.dumps(chunk["error"])[:500]
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content") if is_chat else choice.get("text")
        if text:
            result.chunk_times.append(now)
            result.num_chars += len(text)
            result.text.append(text)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]
    usage = chunk.get("usage")
    if usage:
        result.prompt_tokens = usage.get("prompt_tokens")
        result.completion_tokens = usage.get("completion_tokens")
    if chunk.get("slo"):
        result.server_slo = chunk["slo"]


def to_record(result: RequestResult) -> RequestRecord:
    """The metrics module's record of one request (client clock, seconds)."""
    spec, outcome = result.spec, result.outcome
    slo = result.server_slo or {}
    num_output = result.completion_tokens
    if num_output is None and outcome == FINISHED:
        num_output = len(result.chunk_times)
    return RequestRecord(
        request_id=spec.request_id,
        targets=spec.targets,
        arrival_time=result.send_time,
        token_times=tuple(result.chunk_times),
        finished_time=result.end_time,
        outcome=outcome,
        num_prompt_tokens=result.prompt_tokens or spec.num_prompt_tokens,
        num_output_tokens=num_output,
        finish_reason=result.finish_reason,
        num_preemptions=slo.get("preemptions", 0),
        num_rotations=slo.get("rotations", 0),
        rejection_reason=result.error_code if outcome == REJECTED else None,
    )
