"""Incremental detokenization with stop strings.

Decoding only a short window of recent tokens keeps the cost per token constant; a
window that ends in an incomplete UTF-8 sequence (U+FFFD) waits for the next token.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

_WINDOW = 6  # tokens of left context, so merges across token boundaries decode right


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        include_stop_str: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.skip_special_tokens = skip_special_tokens
        self.include_stop_str = include_stop_str  # the text keeps the stop string found
        self.token_ids: list[int] = []
        self.text = ""
        self.stop_string: str | None = None  # the stop string that ended the text, if any
        self._prefix_offset = 0  # start of the decode window
        self._read_offset = 0  # tokens already turned into text

    def add_tokens(self, token_ids: Sequence[int]) -> str:
        """Append tokens; returns the new text (empty once a stop string was found)."""
        if self.stop_string is not None:
            return ""
        self.token_ids.extend(token_ids)
        start = len(self.text)
        self.text += self._decode_new()
        self._cut_at_stop_string(start)
        return self.text[start:]

    def _decode_new(self) -> str:
        decode = self.tokenizer.decode
        window = self.token_ids[self._prefix_offset :]
        num_old = self._read_offset - self._prefix_offset
        old_text = decode(window[:num_old], skip_special_tokens=self.skip_special_tokens)
        new_text = decode(window, skip_special_tokens=self.skip_special_tokens)
        if len(new_text) <= len(old_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix_offset = max(0, len(self.token_ids) - _WINDOW)
        self._read_offset = len(self.token_ids)
        return new_text[len(old_text) :]

    def _cut_at_stop_string(self, start: int) -> None:
        if not self.stop:
            return
        longest = max(len(s) for s in self.stop)
        search_from = max(0, start - longest + 1)
        hits = [(self.text.find(s, search_from), s) for s in self.stop]
        hits = [(index, s) for index, s in hits if index >= 0]
        if hits:
            index, stop = min(hits)
            self.text = self.text[: index + (len(stop) if self.include_stop_str else 0)]
            self.stop_string = stop

    @property
    def num_stable_chars(self) -> int:
        """Characters safe to stream: the tail that could still start a stop string is held."""
        if not self.stop or self.stop_string is not None:
            return len(self.text)
        return max(0, len(self.text) - max(len(s) for s in self.stop) + 1)
