"""Hermes' tool-call format (NousResearch Hermes 2 Pro, Qwen 2.5 and 3, SmolLM3 and the
many models tuned on it): the tools in the system prompt between `<tools>` tags, each
call `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, each result
`<tool_response>\n...\n</tool_response>`."""

from __future__ import annotations

import json
from typing import Any

from superinfer.server.tools.registry import ToolParser
from superinfer.server.tools.streaming import TaggedCallStream

START, END = "<tool_call>", "</tool_call>"
# a forced call is written as json.dumps writes it: no whitespace to wander into
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Hermes 2 Pro's own system prompt for function calling (its chat template's wording)
_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures "
    "within <tools></tools> XML tags. You may call one or more functions to assist with "
    "the user query. Don't make assumptions about what values to plug into functions. "
    "Here are the available tools: <tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>'
)


class HermesToolParser(ToolParser):
    name = "hermes"

    def stream(self) -> TaggedCallStream:
        return TaggedCallStream(START, END)

    def forced_grammar(self, call_schema: dict[str, Any]) -> str:
        schema = {**call_schema, "x-guidance": _COMPACT}
        return f'start: "{START}\\n" call "\\n{END}"\ncall: %json {json.dumps(schema)}'

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return _SYSTEM.format(tools=listed)

    def render_call(self, name: str, arguments: Any) -> str:
        call = {"name": name, "arguments": arguments}
        return f"{START}\n{json.dumps(call, ensure_ascii=False)}\n{END}"

    def render_result(self, content: str) -> str:
        return f"<tool_response>\n{content}\n</tool_response>"
