"""Turn a validated request body into what the engine needs: token ids, sampling
parameters, the bound SLO, priority and id. Every check that can fail happens here, so
bad input is a 400 at ingress and never reaches the engine thread.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from superinfer.sampling_params import SamplingParams
from superinfer.server.arrival import Arrival
from superinfer.server.errors import APIError, bad_request
from superinfer.server.protocol import ChatCompletionRequest, CompletionRequest
from superinfer.server.serving_defaults import ServingDefaults
from superinfer.slo.binding import BoundSLO, bind_slo
from superinfer.slo.classes import SLOConfig

_MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy (avoids overflow in logits / t)
_REQUEST_ID_HEADER = "x-request-id"

# field -> its neutral value; anything else is refused rather than silently ignored
UNSUPPORTED: dict[str, Any] = {
    "best_of": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None,),
    "logprobs": (None, False),
    "echo": (False,),
    "suffix": (None, ""),
    "top_logprobs": (None, 0),
}


@dataclass
class PreparedRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    slo: BoundSLO
    priority: int
    stream: bool
    include_usage: bool
    continuous_usage: bool


class RequestPreparer:
    """Validates bodies against the model and the SLO configuration."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, max_model_len: int, slo_config: SLOConfig,
        defaults: ServingDefaults | None = None,
    ) -> None:  # fmt: skip
        self.tokenizer = copy.deepcopy(tokenizer)  # the engine thread decodes with its own
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.slo_config = slo_config
        self.defaults = defaults or ServingDefaults()
        if self.defaults.chat_template is not None:
            self.tokenizer.chat_template = self.defaults.chat_template

    def prepare(
        self,
        body: CompletionRequest | ChatCompletionRequest,
        headers: Mapping[str, str],
        arrival: Arrival,
    ) -> PreparedRequest:
        _check_supported(body)
        body = self._with_defaults(body)
        if isinstance(body, ChatCompletionRequest):
            prompt, token_ids = self._chat_prompt(body)
            max_tokens = body.max_completion_tokens or body.max_tokens
        else:
            prompt, token_ids = self._completion_prompt(body)
            max_tokens = body.max_tokens
        max_tokens = self._check_length(len(token_ids), max_tokens, body.min_tokens)
        slo = bind_slo(headers, body.slo, self.slo_config, arrival)
        options = body.stream_options
        return PreparedRequest(
            request_id=_request_id(body, headers),
            prompt=prompt,
            prompt_token_ids=token_ids,
            params=self._sampling_params(body, max_tokens),
            slo=slo,
            priority=self._priority(body, slo),
            stream=body.stream,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.continuous_usage_stats),
        )

    # --- prompts --------------------------------------------------------------------------
    def _completion_prompt(self, body: CompletionRequest) -> tuple[str | None, list[int]]:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise bad_request(
                    "batched prompts are not supported; send one request per prompt",
                    "unsupported_parameter", "prompt",
                )  # fmt: skip
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt, self._tokenize(prompt, "prompt")
        return None, self._check_token_ids(list(prompt), "prompt")

    def _chat_prompt(self, body: ChatCompletionRequest) -> tuple[str, list[int]]:
        if body.tools:
            raise bad_request("tools are not supported", "unsupported_parameter", "tools")
        if body.response_format and body.response_format.get("type", "text") != "text":
            raise bad_request(
                "only the text response format is supported", "unsupported_parameter",
                "response_format",
            )  # fmt: skip
        conversation = [
            {"role": "system" if m.role == "developer" else m.role, "content": _text_of(m, i)}
            for i, m in enumerate(body.messages)
        ]
        if not getattr(self.tokenizer, "chat_template", None):
            raise bad_request(
                "this model has no chat template; use /v1/completions",
                "unsupported_parameter",
                "messages",
            )
        try:
            text = self.tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=body.add_generation_prompt
            )
        except Exception as error:  # noqa: BLE001 - any template error: the messages do not fit
            raise bad_request(
                f"the chat template rejected the messages: {error}", "invalid_value", "messages"
            ) from None
        return text, self._tokenize(text, "messages")

    def _tokenize(self, text: str, param: str) -> list[int]:
        token_ids = self.tokenizer(text)["input_ids"]
        if not token_ids:
            raise bad_request("the prompt is empty", "invalid_value", param)
        return token_ids

    def _check_token_ids(self, token_ids: list[int], param: str) -> list[int]:
        if not token_ids:
            raise bad_request("the prompt is empty", "invalid_value", param)
        if any(not 0 <= t < self.vocab_size for t in token_ids):
            raise bad_request(
                f"token ids must lie in [0, {self.vocab_size})", "invalid_value", param
            )
        return token_ids

    def _check_length(self, num_prompt: int, max_tokens: int | None, min_tokens: int) -> int:
        limit = self.max_model_len
        if num_prompt >= limit:
            raise bad_request(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{num_prompt} and leaves no room to generate",
                "context_length_exceeded", "messages",
            )  # fmt: skip
        if max_tokens is None:
            max_tokens = limit - num_prompt
        if num_prompt + max_tokens > limit:
            raise bad_request(
                f"this model's maximum context length is {limit} tokens; you requested "
                f"{num_prompt + max_tokens} ({num_prompt} in the prompt, {max_tokens} to generate)",
                "context_length_exceeded", "max_tokens",
            )  # fmt: skip
        if min_tokens > max_tokens:
            raise bad_request(
                "min_tokens must not exceed max_tokens", "invalid_value", "min_tokens"
            )
        return max_tokens

    # --- parameters -----------------------------------------------------------------------
    def _sampling_params(self, body: Any, max_tokens: int) -> SamplingParams:
        stop_token_ids = body.stop_token_ids or []
        if any(not 0 <= t < self.vocab_size for t in stop_token_ids):
            raise bad_request(
                f"stop_token_ids must lie in [0, {self.vocab_size})",
                "invalid_value",
                "stop_token_ids",
            )
        temperature = 0.0 if body.temperature < _MIN_TEMPERATURE else body.temperature
        top_k = -1 if body.top_k >= self.vocab_size else body.top_k
        try:
            return SamplingParams(
                max_tokens=max_tokens, temperature=temperature, top_p=body.top_p, top_k=top_k,
                min_tokens=body.min_tokens, seed=body.seed, stop=body.stop,
                stop_token_ids=stop_token_ids, ignore_eos=body.ignore_eos,
                skip_special_tokens=body.skip_special_tokens,
            )  # fmt: skip
        except ValueError as error:
            raise bad_request(str(error), "invalid_value") from None

    def _with_defaults(self, body: BaseModel) -> Any:
        """The body with the model's default sampling parameters where it sets none."""
        unset = {
            name: value for name, value in self.defaults.sampling.items()
            if name in type(body).model_fields and name not in body.model_fields_set
        }  # fmt: skip
        if not unset:
            return body
        if "max_tokens" in unset and "max_completion_tokens" in body.model_fields_set:
            del unset["max_tokens"]
        return body.model_copy(update=unset)

    def _priority(self, body: Any, slo: BoundSLO) -> int:
        if body.priority is not None:
            return body.priority
        return self.slo_config.priority_of(slo.targets.slo_class)


def _check_supported(body: BaseModel) -> None:
    if body.n != 1:
        raise bad_request("only n=1 is supported", "unsupported_parameter", "n")
    for name, neutral in UNSUPPORTED.items():
        if name not in type(body).model_fields:
            continue
        value = getattr(body, name)
        if value not in neutral and value != {}:
            raise bad_request(f"{name}={value!r} is not supported", "unsupported_parameter", name)


def _text_of(message: Any, index: int) -> str:
    content = message.content
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


def _request_id(body: Any, headers: Mapping[str, str]) -> str:
    request_id = body.request_id or headers.get(_REQUEST_ID_HEADER)
    if request_id is None:
        return uuid.uuid4().hex
    if not (0 < len(request_id) <= 128 and request_id.isprintable()):
        raise bad_request(
            "request_id must be 1 to 128 printable characters", "invalid_value", "request_id"
        )
    return request_id


def error_for_validation(error: Exception) -> APIError:
    """A pydantic ValidationError as a 400 naming the first offending field."""
    errors = getattr(error, "errors", list)()
    if not errors:
        return bad_request(str(error), "invalid_value")
    first = errors[0]
    param = ".".join(str(part) for part in first.get("loc", ())) or None
    code = "missing_field" if first.get("type") == "missing" else "invalid_type"
    if first.get("type", "").endswith(("_than", "_than_equal", "finite_number")):
        code = "invalid_value"
    return bad_request(
        f"{param}: {first.get('msg')}" if param else first.get("msg", "invalid"), code, param
    )
