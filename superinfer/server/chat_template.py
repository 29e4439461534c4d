"""Chat messages -> the prompt text, through the model's chat template (or `--chat-template`).

The template gets what vLLM gives it: the messages (a developer message as a system one;
an assistant's earlier calls as `tool_calls` whose `arguments` are dicts, as Hugging Face's
templates expect; a tool's result with its `tool_call_id`), `tools=` (OpenAI's tool
objects), `add_generation_prompt`, and the request's `chat_template_kwargs` (e.g.
`enable_thinking`), which may also override `add_generation_prompt`.

A template that does not render tools (it never mentions `tools` and `tool_calls`, as
SmolLM2's) gets them through the tool-call format instead: the format's system prompt
describing the tools (before the conversation's own system message, if any), each earlier
call written as the model would write it, each tool result as a user message in the
format's result tags.
"""

from __future__ import annotations

import json
from typing import Any

from superinfer.server.errors import bad_request
from superinfer.server.protocol import ChatMessage
from superinfer.server.tools import ToolParser

# chat_template_kwargs that would replace what the request itself renders
RESERVED_KWARGS = frozenset({"conversation", "messages", "tools", "tokenize", "documents"})


def conversation_of(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as the template reads them (400 for content it cannot hold)."""
    return [_message(m, i) for i, m in enumerate(messages)]


def _message(message: ChatMessage, index: int) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    result: dict[str, Any] = {"role": role, "content": _text_of(message, index)}
    if message.name is not None:
        result["name"] = message.name
    if message.tool_calls:
        if role != "assistant":
            raise bad_request(f"messages.{index}.tool_calls: only an assistant message has calls",
                              "invalid_value", f"messages.{index}.tool_calls")  # fmt: skip
        result["tool_calls"] = [_call(c, index) for c in message.tool_calls]
    if message.tool_call_id is not None:
        result["tool_call_id"] = message.tool_call_id
    return result


def _call(call: Any, index: int) -> dict[str, Any]:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        raise bad_request(
            f"messages.{index}.tool_calls: arguments must be JSON text",
            "invalid_value", f"messages.{index}.tool_calls",
        ) from None  # fmt: skip
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": arguments}}  # fmt: skip


def _text_of(message: ChatMessage, index: int) -> str:
    content = message.content
    if content is None and message.role != "assistant":  # as OpenAI answers it
        raise bad_request(
            f"messages.{index}.content: a {message.role} message needs content",
            "missing_field", f"messages.{index}.content",
        )  # fmt: skip
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"content parts of type {part.type[:32]!r} are not supported",
                "unsupported_parameter", f"messages.{index}.content",
            )  # fmt: skip
        parts.append(part.text)
    return "".join(parts)


def renders_tools(template: str) -> bool:
    """Whether a chat template renders tools and earlier calls itself."""
    return "tools" in template and "tool_calls" in template


def with_tools_in_format(
    conversation: list[dict[str, Any]], tools: list[dict[str, Any]] | None, parser: ToolParser
) -> list[dict[str, Any]]:
    """The conversation with the tools and the calls written in the tool-call format, for
    a template that does not render them."""
    result = [_in_format(m, parser) for m in conversation]
    if tools:
        prompt = parser.system_prompt(tools)
        if result and result[0]["role"] == "system":
            result[0] = {**result[0], "content": prompt + "\n\n" + result[0]["content"]}
        else:
            result.insert(0, {"role": "system", "content": prompt})
    return result


def _in_format(message: dict[str, Any], parser: ToolParser) -> dict[str, Any]:
    if message["role"] == "tool":
        return {"role": "user", "content": parser.render_result(message["content"])}
    calls = message.get("tool_calls")
    if not calls:
        return message
    written = [parser.render_call(c["function"]["name"], c["function"]["arguments"]) for c in calls]
    content = "\n".join(([message["content"]] if message["content"] else []) + written)
    return {"role": message["role"], "content": content}


def render_chat(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    parser: ToolParser | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text (400 if the template rejects the messages or has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template or not isinstance(template, str):
        raise bad_request("this model has no chat template; use /v1/completions",
                          "unsupported_parameter", "messages")  # fmt: skip
    kwargs = dict(template_kwargs or {})
    reserved = sorted(RESERVED_KWARGS & set(kwargs))
    if reserved:
        raise bad_request(
            f"chat_template_kwargs.{reserved[0]} is set by the request itself",
            "invalid_value", "chat_template_kwargs",
        )  # fmt: skip
    kwargs.setdefault("add_generation_prompt", add_generation_prompt)
    has_calls = any(m["role"] == "tool" or m.get("tool_calls") for m in conversation)
    if renders_tools(template):
        if tools:
            kwargs["tools"] = tools
    elif (tools or has_calls) and parser is not None:
        conversation = with_tools_in_format(conversation, tools, parser)
    try:
        return tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
    except Exception as error:  # noqa: BLE001 - any template error: the messages do not fit
        raise bad_request(
            f"the chat template rejected the messages: {error}", "invalid_value", "messages"
        ) from None
