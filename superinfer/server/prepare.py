"""Turn a validated request body into what the engine needs: token ids, sampling
parameters, the bound SLO, priority and id. Every check that can fail happens here, so
bad input is a 400 at ingress and never reaches the engine thread.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from superinfer.config import EngineConfig
from superinfer.sampling_params import SamplingParams
from superinfer.server.arrival import Arrival
from superinfer.server.chat_template import conversation_of, render_chat
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError, bad_request
from superinfer.server.logprobs import TokenTexts
from superinfer.server.protocol import MAX_SEQUENCES, ChatCompletionRequest, CompletionRequest
from superinfer.server.serving_defaults import ServingDefaults, serving_defaults_of
from superinfer.server.tools import ToolParser, parser_named, tool_use_of
from superinfer.slo.binding import BoundSLO, bind_slo
from superinfer.slo.classes import SLOConfig
from superinfer.structured import GrammarCompiler, StructuredOutput

_MIN_TEMPERATURE = 1e-5  # below this, sampling is greedy (avoids overflow in logits / t)
_REQUEST_ID_HEADER = "x-request-id"

# field -> its neutral values; anything else is refused rather than silently ignored
# (fields of the protocol models or, for the names OpenAI and vLLM define, extra fields)
UNSUPPORTED: dict[str, Any] = {
    "suffix": (None, ""),
    "echo": (None, False),  # chat: vLLM's echo of the last message
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "spaces_between_special_tokens": (None, True),
    "truncate_prompt_tokens": (None,),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "logits_processors": (None, []),
    "guided_decoding_backend": (None,),
    "guided_whitespace_pattern": (None,),
    "continue_final_message": (None, False),
    "documents": (None, []),
    "reasoning_effort": (None,),
    "prediction": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "web_search_options": (None,),
}


@dataclass
class Prompt:
    """One more prompt of a completions request with several (`prompt` a list)."""

    text: str | None
    token_ids: list[int]
    max_tokens: int


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
    n: int = 1  # choices returned
    best_of: int = 1  # sequences generated (the n with the highest cumulative logprob win)
    echo: bool = False  # completions: the prompt comes first in each choice
    num_top_logprobs: int | None = None  # logprobs in the response: the top N; None: none
    num_prompt_logprobs: int | None = None  # vLLM's prompt_logprobs field, top N each
    tool_parser: ToolParser | None = None  # parses the output's tool calls; None: no tools
    constraint_param: str = "response_format"  # the field a grammar error names
    # completions with several prompts: the second and later (prompt_token_ids is the first)
    more_prompts: list[Prompt] = field(default_factory=list)

    @property
    def num_sequences(self) -> int:
        """Sequences generated per prompt."""
        return max(self.n, self.best_of)

    @property
    def num_prompt_tokens(self) -> int:
        """The tokens of all its prompts (usage counts each prompt once)."""
        return len(self.prompt_token_ids) + sum(len(p.token_ids) for p in self.more_prompts)


def server_preparer(
    tokenizer: Any,
    vocab_size: int,
    server_config: ServerConfig,
    engine_config: EngineConfig,
    slo_config: SLOConfig,
) -> RequestPreparer:
    """The preparer of a server (single, router or Ray ingress) over this model's tokenizer."""
    return RequestPreparer(
        tokenizer, vocab_size, engine_config.scheduler.max_model_len, slo_config,
        serving_defaults_of(server_config, engine_config),
    )  # fmt: skip


class RequestPreparer:
    """Validates bodies against the model and the SLO configuration."""

    def __init__(
        self, tokenizer: Any, vocab_size: int, max_model_len: int, slo_config: SLOConfig,
        defaults: ServingDefaults | None = None,
    ) -> None:  # fmt: skip
        self.tokenizer = copy.deepcopy(tokenizer)  # the engine thread decodes with its own
        self.token_texts = TokenTexts(self.tokenizer)  # logprobs' token strings and bytes
        self.grammars = GrammarCompiler(self.tokenizer, vocab_size)  # structured output
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.slo_config = slo_config
        self.defaults = defaults or ServingDefaults()
        self.tool_parser = parser_named(self.defaults.tool_call_parser)
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
        tool_parser, forced, more = None, None, []
        if isinstance(body, ChatCompletionRequest):
            prompt, token_ids, tool_parser, forced = self._chat_prompt(body)
            max_tokens = body.max_completion_tokens or body.max_tokens
        else:
            (prompt, token_ids), *others = self._completion_prompts(body)
            max_tokens = body.max_tokens
            more = [Prompt(text, ids, self._check_length(len(ids), max_tokens, body.min_tokens))
                    for text, ids in others]  # fmt: skip
        max_tokens = self._check_length(len(token_ids), max_tokens, body.min_tokens)
        slo = bind_slo(headers, body.slo, self.slo_config, arrival)
        options = body.stream_options
        num_top, echo = _num_top_logprobs(body), bool(getattr(body, "echo", False))
        best_of = body.best_of or body.n
        params = self._sampling_params(body, max_tokens)
        params.logprobs = num_top if best_of <= body.n else max(num_top or 0, 0)
        params.prompt_logprobs = body.prompt_logprobs
        params.structured = _structured_output(body)
        if forced is not None:
            if params.structured is not None:
                raise bad_request(
                    "a required or named tool_choice cannot be combined with another output "
                    "constraint", "invalid_value", "tool_choice",
                )  # fmt: skip
            params.structured = forced
        if echo and num_top is not None:  # vLLM: echo with logprobs scores the prompt too
            params.prompt_logprobs = max(num_top, body.prompt_logprobs or 0)
        return PreparedRequest(
            request_id=_request_id(body, headers),
            prompt=prompt,
            prompt_token_ids=token_ids,
            params=params,
            slo=slo,
            priority=self._priority(body, slo),
            stream=body.stream,
            include_usage=bool(options and options.include_usage),
            continuous_usage=bool(options and options.continuous_usage_stats),
            n=body.n,
            best_of=best_of,
            echo=echo,
            num_top_logprobs=num_top,
            num_prompt_logprobs=body.prompt_logprobs,
            tool_parser=tool_parser,
            constraint_param="tools" if forced is not None else "response_format",
            more_prompts=more,
        )

    # --- prompts --------------------------------------------------------------------------
    def _completion_prompts(self, body: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """(text, token ids) of each prompt: a string, token ids, or a list of either."""
        prompt = body.prompt
        prompts = prompt if _is_prompt_list(prompt) else [prompt]
        if len(prompts) * max(body.n, body.best_of or body.n) > MAX_SEQUENCES:
            raise bad_request(f"at most {MAX_SEQUENCES} sequences per request (prompts x n)",
                              "invalid_value", "prompt")  # fmt: skip
        return [
            (p, self._tokenize(p, "prompt")) if isinstance(p, str)
            else (None, self._check_token_ids(list(p), "prompt"))
            for p in prompts
        ]  # fmt: skip

    def _chat_prompt(
        self, body: ChatCompletionRequest
    ) -> tuple[str, list[int], ToolParser | None, StructuredOutput | None]:
        """The prompt, and the tools' parser and forced call (None without)."""
        tool_use = tool_use_of(body.tools, body.tool_choice, self.tool_parser)
        text = render_chat(
            self.tokenizer, conversation_of(body.messages), body.add_generation_prompt,
            tool_use.tools if tool_use else None, self.tool_parser, body.chat_template_kwargs,
        )  # fmt: skip
        parser = self.tool_parser if tool_use is not None and tool_use.parses else None
        forced = tool_use.forced if tool_use is not None else None
        return text, self._tokenize(text, "messages"), parser, forced

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
        allowed = body.allowed_token_ids
        if allowed is not None and any(not 0 <= t < self.vocab_size for t in allowed):
            raise bad_request(
                f"allowed_token_ids must lie in [0, {self.vocab_size})", "invalid_value",
                "allowed_token_ids",
            )  # fmt: skip
        try:
            params = SamplingParams(
                max_tokens=max_tokens, temperature=temperature, top_p=body.top_p, top_k=top_k,
                min_tokens=body.min_tokens, seed=body.seed, stop=body.stop,
                include_stop_str_in_output=body.include_stop_str_in_output,
                stop_token_ids=stop_token_ids, ignore_eos=body.ignore_eos,
                skip_special_tokens=body.skip_special_tokens,
                presence_penalty=_or(body.presence_penalty, 0.0),
                frequency_penalty=_or(body.frequency_penalty, 0.0),
                repetition_penalty=_or(body.repetition_penalty, 1.0),
                min_p=_or(body.min_p, 0.0), logit_bias=self._logit_bias(body.logit_bias),
                bad_words=body.bad_words or None, allowed_token_ids=allowed,
            )  # fmt: skip
        except ValueError as error:
            raise bad_request(str(error), "invalid_value") from None
        try:
            params.update_from_tokenizer(self.tokenizer)
        except ValueError as error:
            raise bad_request(str(error), "invalid_value", "bad_words") from None
        return params

    def compile_structured(self, prepared: PreparedRequest) -> None:
        """Compile the request's grammar (slow for a large schema: the server runs this in
        a worker thread, never on the loop or the engine thread); 400 if it is invalid."""
        structured = prepared.params.structured
        if structured is None:
            return
        try:
            self.grammars.compile(structured)
        except ValueError as error:
            raise bad_request(str(error), "invalid_value", prepared.constraint_param) from None

    def _logit_bias(self, bias: dict[str, float] | None) -> dict[int, float] | None:
        """OpenAI's logit_bias: token ids (as JSON keys) -> a bias in [-100, 100]."""
        if not bias:
            return None
        result = {}
        for key, value in bias.items():
            try:
                token_id = int(key)
            except ValueError:
                raise bad_request(
                    f"logit_bias keys are token ids, got {key[:32]!r}", "invalid_value",
                    "logit_bias",
                ) from None  # fmt: skip
            if not 0 <= token_id < self.vocab_size:
                raise bad_request(
                    f"logit_bias token ids must lie in [0, {self.vocab_size})", "invalid_value",
                    "logit_bias",
                )  # fmt: skip
            if not -100 <= value <= 100:
                raise bad_request(
                    "logit_bias values must be in [-100, 100]", "invalid_value", "logit_bias"
                )
            result[token_id] = value
        return result

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


def _is_prompt_list(prompt: Any) -> bool:
    """Whether `prompt` is several prompts (strings or token-id lists), not one's ids."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _num_top_logprobs(body: Any) -> int | None:
    """How many top log-probabilities each token reports; None: no logprobs at all."""
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs=true", "invalid_value", "top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


_REFUSED_FIELDS = {"suffix"}  # protocol fields no route implements yet
_STRUCTURED_KEYS = {"json", "regex", "choice", "grammar", "json_object"}


def _structured_output(body: Any) -> StructuredOutput | None:
    """The one output constraint among response_format, structured_outputs and guided_*."""
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = body.response_format
    kind = (fmt or {}).get("type", "text")
    if kind == "json_object":
        found.append(("response_format", {"json": True}))
    elif kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              "invalid_value", "response_format")  # fmt: skip
        found.append(("response_format", {"json": schema}))
    elif kind != "text":
        raise bad_request(f"response_format type {str(kind)[:32]!r} is not supported",
                          "unsupported_parameter", "response_format")  # fmt: skip
    if body.structured_outputs:
        unknown = set(body.structured_outputs) - _STRUCTURED_KEYS
        if unknown:
            raise bad_request(f"structured_outputs.{min(unknown)} is not supported",
                              "unsupported_parameter", "structured_outputs")  # fmt: skip
        spec = dict(body.structured_outputs)
        if spec.pop("json_object", None):
            spec["json"] = True
        found.append(("structured_outputs", spec))
    for name in ("json", "regex", "choice", "grammar"):
        value = getattr(body, f"guided_{name}")
        if value is not None:
            found.append((f"guided_{name}", {name: value}))
    if not found:
        return None
    param, spec = found[0]
    if len(found) > 1:
        raise bad_request(f"give one output constraint, got {', '.join(p for p, _ in found)}",
                          "invalid_value", found[1][0])  # fmt: skip
    if isinstance(spec.get("json"), str):
        try:
            spec["json"] = json.loads(spec["json"])
        except ValueError:
            raise bad_request("the JSON schema is not valid JSON", "invalid_value", param) from None
    try:
        return StructuredOutput(**{k: v for k, v in spec.items() if v is not None})
    except (TypeError, ValueError) as error:
        raise bad_request(f"{param}: {error}", "invalid_value", param) from None


def _check_supported(body: BaseModel) -> None:
    best_of = body.best_of or body.n
    if best_of < body.n:
        raise bad_request("best_of must be at least n", "invalid_value", "best_of")
    if best_of > body.n and body.stream:
        raise bad_request("best_of above n cannot be streamed", "invalid_value", "best_of")
    extra = body.model_extra or {}
    for name, neutral in UNSUPPORTED.items():
        if name in type(body).model_fields:
            if name not in _REFUSED_FIELDS:
                continue  # a field this route implements (completions' echo)
            value = getattr(body, name)
        elif name in extra:
            value = extra[name]
        else:
            continue
        if value not in neutral:
            raise bad_request(f"{name}={value!r} is not supported", "unsupported_parameter", name)


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
