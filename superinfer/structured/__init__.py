"""Structured output: constrain a request's tokens to a JSON schema, a regular expression,
a list of choices or a grammar, through llguidance (a grammar library made for it).

    request fields -> StructuredOutput (what to match; plain data, parsed at ingress)
                   -> GrammarCompiler.compile (off the engine thread: the server runs it
                      in a worker thread, so a large schema never stalls a step)
                   -> a matcher per request, which the sampler asks for each step's token
                      bitmask (applied to the batch's logits in one pass) and advances
                      with each sampled token

An invalid schema or grammar is a ValueError at compile time (the server answers 400).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

KINDS = ("json", "regex", "choice", "grammar")


@dataclass
class StructuredOutput:
    """What the output must match: exactly one of a JSON schema (`json`; `{"type":
    "object"}` for any JSON object), a regular expression, a list of choices, or a grammar
    (Lark, or GBNF as vLLM's xgrammar backend reads it)."""

    json: dict[str, Any] | bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    matcher: Any = field(default=None, repr=False, compare=False)  # set by compile

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)}, got {given or 'none'}")
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) for c in self.choice)
        ):
            raise ValueError("choice must be a non-empty list of strings")

    def source(self) -> str:
        """The grammar in llguidance's terms."""
        from llguidance import LLMatcher, gbnf_to_lark

        if self.json is not None:
            schema = {"type": "object"} if self.json is True else self.json
            return LLMatcher.grammar_from_json_schema(schema)
        if self.regex is not None:
            return LLMatcher.grammar_from_regex(self.regex)
        if self.choice is not None:
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(json.dumps(c) for c in self.choice)
            )
        assert self.grammar is not None
        lark = gbnf_to_lark(self.grammar) if "::=" in self.grammar else self.grammar
        return LLMatcher.grammar_from_lark(lark)

    def fork(self) -> StructuredOutput:
        """The same constraint for another sequence, with a matcher of its own."""
        copy = StructuredOutput(self.json, self.regex, self.choice, self.grammar)
        if self.matcher is not None:
            copy.matcher = self.matcher.deep_copy()
        return copy

    def __getstate__(self) -> dict[str, Any]:  # a matcher does not travel between processes
        return {**self.__dict__, "matcher": None}


class GrammarCompiler:
    """Compiles constraints against one tokenizer (its llguidance view is built once)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                import llguidance.hf

                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size
                )
            return self._ll_tokenizer

    def compile(self, output: StructuredOutput) -> None:
        """Give `output` its matcher; ValueError if the schema or grammar is invalid."""
        from llguidance import LLMatcher

        tokenizer = self._tokenizer()
        try:
            source = output.source()
        except Exception as error:  # noqa: BLE001 - any failure: the schema is not valid
            raise ValueError(f"invalid {_kind(output)}: {error}") from None
        problem = LLMatcher.validate_grammar(source, tokenizer)
        if problem:
            raise ValueError(f"invalid {_kind(output)}: {problem}")
        matcher = LLMatcher(tokenizer, source)
        if matcher.is_error():
            raise ValueError(f"invalid {_kind(output)}: {matcher.get_error()}")
        output.matcher = matcher


def _kind(output: StructuredOutput) -> str:
    return {"json": "JSON schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}[
        next(k for k in KINDS if getattr(output, k) is not None)
    ]
