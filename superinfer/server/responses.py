"""OpenAI response bodies and stream chunks for completions and chat completions.

Streams follow OpenAI: one `data: {json}` event per chunk, `data: [DONE]` at the end; with
`stream_options.include_usage` every chunk has `"usage": null` and a last chunk with no
choices carries the usage. The last chunk of a stream, like a whole non-stream response,
also carries the `slo` report (slo-contract.md); with several choices (`n`), each
choice's last chunk carries its own.

A chat stream's first chunk of each choice carries the role with the first token's text
(as vLLM sends it): no chunk goes out before a token exists, so a client's time to the
first chunk is the real time to the first token. With tools, a chunk's delta carries the
content and the `tool_calls` pieces the tool parser made of its text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

DONE = b"data: [DONE]\n\n"


@dataclass
class ResponseShape:
    """Fixed parts of one response: which route, id, model, creation time."""

    is_chat: bool
    response_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.is_chat else "text_completion"

    @property
    def chunk_object_name(self) -> str:
        return "chat.completion.chunk" if self.is_chat else "text_completion"

    def _head(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
        }

    # --- whole responses ------------------------------------------------------------------
    def choice(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One choice; a chat message with `tool_calls` has `content` null without text."""
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs,
                                  "finish_reason": finish_reason, "stop_reason": stop_reason}  # fmt: skip
        if self.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message.update(content=text or None, tool_calls=tool_calls)
            choice["message"] = message
        else:
            choice["text"] = text
        return choice

    def full(
        self,
        choices: list[dict[str, Any]],
        usage: dict[str, int],
        slo: dict[str, Any] | None,
        **extra: Any,
    ) -> dict[str, Any]:
        head = self._head(self.object_name)
        return {**head, "choices": choices, "usage": usage, "slo": slo, **extra}

    # --- stream chunks --------------------------------------------------------------------
    def chunk(
        self,
        delta: str | None,
        finish_reason: str | None = None,
        stop_reason: int | str | None = None,
        is_first: bool = False,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": index,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        if self.is_chat:
            message: dict[str, Any] = {"role": "assistant"} if is_first else {}
            if delta is not None:
                message["content"] = delta
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice["delta"] = message
        else:
            choice["text"] = delta or ""
        return {**self._head(self.chunk_object_name), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self._head(self.chunk_object_name), "choices": [], "usage": usage}


def usage_of(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, int]:
    """OpenAI's usage: the prompt counted once, the output tokens of every sequence."""
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
    }


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def stable_end(text: str, stop: list[str], is_finished: bool) -> int:
    """Characters of `text` safe to stream: the tail that could still start a stop string
    is held back until the next step (or the end) decides it."""
    if is_finished or not stop:
        return len(text)
    return max(0, len(text) - max(len(s) for s in stop) + 1)
