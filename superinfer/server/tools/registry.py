"""The tool-call parsers by name (`superinfer serve --tool-call-parser NAME`, vLLM's flag)
and the interface each provides: how its format's calls are parsed (whole and streamed),
forced (a grammar) and written into a prompt whose chat template does not render tools."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from superinfer.server.tools.streaming import ParsedMessage, TaggedCallStream


class ToolParser(ABC):
    """One model family's tool-call format."""

    name: ClassVar[str]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @abstractmethod
    def stream(self) -> TaggedCallStream:
        """A fresh parse state for one output."""

    def parse(self, text: str) -> ParsedMessage:
        """A whole output's content and calls (the stream's parse, in one delta)."""
        state = self.stream()
        delta = state.feed(text)
        delta.extend(state.finish())
        return ParsedMessage(delta.content or None, list(state.calls))

    @abstractmethod
    def forced_grammar(self, call_schema: dict[str, Any]) -> str:
        """A Lark grammar (llguidance's) for exactly one call whose JSON matches
        `call_schema` (`{"name": ..., "arguments": ...}`)."""

    @abstractmethod
    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        """The tools, described for a model whose chat template does not render them."""

    @abstractmethod
    def render_call(self, name: str, arguments: Any) -> str:
        """An assistant's earlier call, as the model writes it (for the history)."""

    @abstractmethod
    def render_result(self, content: str) -> str:
        """A tool's result, as the format passes it back (for the history)."""


def _parsers() -> dict[str, type[ToolParser]]:
    from superinfer.server.tools.hermes import HermesToolParser

    return {HermesToolParser.name: HermesToolParser}


PARSERS: dict[str, type[ToolParser]] = _parsers()


def parser_named(name: str) -> ToolParser:
    """The parser `--tool-call-parser` names; ValueError naming the known ones."""
    parser = PARSERS.get(name)
    if parser is None:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))}")
    return parser()
