"""Log-probabilities in OpenAI's two shapes, from the engine's `TokenLogprobs`.

- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`, `bytes`
  the token's own UTF-8 bytes (exact for byte-level BPE vocabularies: a token that is half
  of a character has half of its bytes), `top_logprobs` the top N, best first;
- completions: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, each
  `top_logprobs` entry a dict of the top N and the chosen token (vLLM's shape); with
  `echo`, the prompt's tokens come first and the first of them has `null`s.

Log-probabilities below -9999 (a token the model rules out) are reported as -9999.0, as
vLLM does, so the JSON stays finite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from superinfer.core.outputs import TokenLogprobs

_FLOOR = -9999.0


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable bytes stand for themselves, the
    others for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in set(printable)]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + i): b for i, b in enumerate(others)})
    return table


class TokenTexts:
    """The text and bytes of single tokens (cached), as logprobs report them."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self._bytes_of = _byte_decoder() if type(decoder).__name__ == "ByteLevel" else None
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        cached = self._cache.get(token_id)
        if cached is None:
            text = self.tokenizer.decode([token_id])
            cached = self._cache[token_id] = (text, self._bytes(token_id, text))
        return cached

    def _bytes(self, token_id: int, text: str) -> list[int]:
        if self._bytes_of is not None:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if piece and all(c in self._bytes_of for c in piece):
                return [self._bytes_of[c] for c in piece]
        return list(text.encode("utf-8", errors="replace"))

    def text(self, token_id: int) -> str:
        return self(token_id)[0]


def _finite(logprob: float) -> float:
    return max(logprob, _FLOOR)


def chat_logprobs(
    entries: Sequence[TokenLogprobs], num_top: int, texts: TokenTexts
) -> dict[str, Any]:
    return {"content": [_chat_entry(e, num_top, texts) for e in entries]}


def _chat_entry(entry: TokenLogprobs, num_top: int, texts: TokenTexts) -> dict[str, Any]:
    text, raw = texts(entry.token_id)
    top = [
        {"token": texts.text(t), "logprob": _finite(lp), "bytes": texts(t)[1]}
        for t, lp in entry.top[:num_top]
    ]
    return {"token": text, "logprob": _finite(entry.logprob), "bytes": raw, "top_logprobs": top}


def completion_logprobs(
    entries: Sequence[TokenLogprobs | None],
    num_top: int,
    texts: TokenTexts,
    first_offset: int = 0,
    first_token_ids: Sequence[int] = (),
) -> dict[str, Any]:
    """`entries` in text order; a None entry (the first prompt token under echo) takes its
    token id from `first_token_ids`. Offsets count characters from `first_offset`."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = first_offset
    pending_ids = list(first_token_ids)
    for entry in entries:
        token_id = entry.token_id if entry is not None else pending_ids.pop(0)
        text = texts.text(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            top_logprobs.append(None)
            continue
        token_logprobs.append(_finite(entry.logprob))
        top = {texts.text(t): _finite(lp) for t, lp in entry.top[:num_top]}
        top.setdefault(text, _finite(entry.logprob))
        top_logprobs.append(top)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


def prompt_logprobs_json(
    entries: Sequence[TokenLogprobs | None], texts: TokenTexts
) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs` field: per prompt token, {token id: {logprob, rank,
    decoded_token}} for the token and the top N; None for the first."""
    result: list[dict[str, Any] | None] = []
    for entry in entries:
        if entry is None:
            result.append(None)
            continue
        ranked = {entry.token_id: (entry.logprob, entry.rank)}
        for rank, (token_id, logprob) in enumerate(entry.top, start=1):
            ranked.setdefault(token_id, (logprob, rank))
        result.append({
            str(t): {"logprob": _finite(lp), "rank": rank, "decoded_token": texts.text(t)}
            for t, (lp, rank) in ranked.items()
        })  # fmt: skip
    return result
