"""Per-request sampling parameters (pure Python; mirrors vLLM's `SamplingParams`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs, OpenAI's top_logprobs limit


@dataclass
class SamplingParams:
    """How to pick each next token, what to report about it, and when to stop.

    temperature 0 means greedy. `stop` strings end generation when they appear in the
    decoded text (the stop string itself is returned only with
    `include_stop_str_in_output`). `stop_token_ids` end it on those
    ids in addition to the model's end-of-sequence ids (unless `ignore_eos`).

    The logits are processed in vLLM's order: `allowed_token_ids`, `bad_words`,
    `min_tokens`, `logit_bias`, then the penalties (repetition over prompt and output,
    frequency and presence over the output); greedy picks the argmax of the result,
    sampling goes on with temperature, `min_p`, top-k and top-p. `logprobs` (the top N per
    output token, 0: only the sampled one's) and `prompt_logprobs` (the same for every
    prompt token after the first) are reported from the raw logits, before any of that
    (vLLM's default `raw_logprobs` mode).
    """

    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k cut
    min_p: float = 0.0
    min_tokens: int = 0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # what a grammar (superinfer.structured) constrains the output to; None: free text
    structured: Any = None
    # token sequences of `bad_words`, from `update_from_tokenizer`
    bad_words_token_ids: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1
        if self.logit_bias is not None:
            self.logit_bias = {int(t): float(b) for t, b in self.logit_bias.items()} or None
        self._validate()

    def _validate(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or positive, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens must not exceed max_tokens")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.logit_bias and any(not -100 <= b <= 100 for b in self.logit_bias.values()):
            raise ValueError("logit_bias values must be in [-100, 100]")
        if self.allowed_token_ids is not None and not self.allowed_token_ids:
            raise ValueError("allowed_token_ids must not be empty")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @property
    def needs_history(self) -> bool:
        """Whether the sampler keeps this request's tokens (penalties, multi-token bad
        words, prompt log-probabilities)."""
        return (
            self.has_penalties
            or any(len(ids) > 1 for ids in self.bad_words_token_ids)
            or self.prompt_logprobs is not None
        )

    def update_from_tokenizer(self, tokenizer: Any) -> None:
        """Tokenize `bad_words` (once): each word as it starts the text and, as vLLM does,
        with a leading space when that makes a different token of the same length."""
        if not self.bad_words or self.bad_words_token_ids:
            return
        sequences: list[list[int]] = []
        for word in self.bad_words:
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if not plain:
                raise ValueError(f"the bad word {word!r} has no tokens")
            sequences.append(plain)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                sequences.append(spaced)
        self.bad_words_token_ids = sequences
