"""Tool calling on /v1/chat/completions: the model's tool-call format, parsed from its
output, streamed as OpenAI's `tool_calls` deltas, and forced by a grammar when the request
says a tool must be called.

    registry.py   the parsers by name (`--tool-call-parser`), the interface they share
    hermes.py     Hermes' `<tool_call>{"name": ..., "arguments": ...}</tool_call>` format
    streaming.py  text deltas in, content and tool-call deltas out (one state per choice)
    choice.py     `tools` + `tool_choice` -> what the request renders, parses and forces
"""

from superinfer.server.tools.choice import ToolUse, tool_use_of
from superinfer.server.tools.registry import PARSERS, ToolParser, parser_named
from superinfer.server.tools.streaming import DeltaMessage, ParsedMessage, ToolCall, ToolCallDelta

__all__ = [
    "PARSERS", "DeltaMessage", "ParsedMessage", "ToolCall", "ToolCallDelta", "ToolParser",
    "ToolUse", "parser_named", "tool_use_of",
]  # fmt: skip
