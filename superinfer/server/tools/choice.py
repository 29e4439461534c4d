"""A request's `tools` and `tool_choice` -> what it renders, parses and forces.

- no tools, or `tool_choice` none: nothing is parsed (`none` still renders the tools, as
  vLLM does by default);
- `auto` (the default with tools): the output is parsed, the model decides;
- `required`: exactly one call to one of the tools, forced by a grammar (the format's call
  around a JSON schema of `{"name": one of them, "arguments": its parameters}`);
- a named function: exactly one call to it, forced the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from superinfer.server.errors import bad_request
from superinfer.server.protocol import NamedToolChoice, Tool
from superinfer.server.tools.registry import ToolParser
from superinfer.structured import StructuredOutput


@dataclass
class ToolUse:
    tools: list[dict[str, Any]]  # OpenAI's tool objects, for the chat template
    parses: bool  # whether the output's calls are parsed
    forced: StructuredOutput | None  # the grammar of the one call that must come


def tool_use_of(
    tools: list[Tool] | None, tool_choice: str | NamedToolChoice | None, parser: ToolParser
) -> ToolUse | None:
    """What the tools ask of this request (None: no tools); a 400 for a choice that does
    not fit them."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "invalid_value", "tool_choice")
        return None
    names = [tool.function.name for tool in tools]
    if len(set(names)) < len(names):
        raise bad_request("tool names must be unique", "invalid_value", "tools")
    listed = [tool.model_dump(exclude_none=True) for tool in tools]
    choice = tool_choice or "auto"
    if choice in ("none", "auto"):
        return ToolUse(listed, choice == "auto", None)
    chosen = tools
    if isinstance(choice, NamedToolChoice):
        chosen = [tool for tool in tools if tool.function.name == choice.function.name]
        if not chosen:
            raise bad_request(
                f"tool_choice names {choice.function.name[:64]!r}, which is not among the tools",
                "invalid_value", "tool_choice",
            )  # fmt: skip
    grammar = parser.forced_grammar(call_schema(chosen))
    return ToolUse(listed, True, StructuredOutput(grammar=grammar))


def call_schema(tools: list[Tool]) -> dict[str, Any]:
    """The JSON schema of one call to one of `tools`: name first, then its arguments."""
    schemas = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.function.name},
                "arguments": tool.function.parameters or {"type": "object", "properties": {}},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
