"""Request bodies of the OpenAI-compatible routes (field names as OpenAI and vLLM use them).

Unknown fields are ignored, as OpenAI-compatible servers do; fields that would change the
answer in ways superinfer does not implement are rejected in `superinfer.server.prepare`
(`UNSUPPORTED`, with the value each may take).
Numbers must be finite (NaN and Infinity are rejected).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from superinfer.sampling_params import MAX_LOGPROBS

_INT64 = 2**63
MAX_SEQUENCES = 128  # n and best_of


class SLOBody(BaseModel):
    """The body's `slo` object (OpenAI SDK: `extra_body={"slo": {...}}`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)

    ttft_ms: float | None = None
    tbt_ms: float | None = None
    max_latency_ms: float | None = None
    slo_class: str | None = Field(None, alias="class")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _GenerationRequest(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    min_tokens: int = Field(0, ge=0)
    n: int = Field(1, ge=1, le=MAX_SEQUENCES)
    best_of: int | None = Field(None, ge=1, le=MAX_SEQUENCES)
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: int | None = Field(None, ge=-(2**31), lt=2**31)
    request_id: str | None = Field(None, min_length=1, max_length=128)
    slo: SLOBody | None = None
    user: str | None = None
    # logits processing (SamplingParams has the order and the definitions)
    # (None, as some clients send it, is the neutral value)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    logit_bias: dict[str, float] | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    bad_words: list[str] | None = None
    allowed_token_ids: list[int] | None = None
    # vLLM's: the prompt tokens' log-probabilities, top N each (choices[i].prompt_logprobs)
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # structured output (at most one): OpenAI's, vLLM's, and vLLM's older guided_* fields
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # the top N per token


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    """An earlier call in the history: `arguments` is JSON text, as OpenAI sends it."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str = "{}"


class ToolCallMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallMessage] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool's result: the call it answers


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: that tool must be called."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the template
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize body: a completion's `prompt`, or a chat's `messages` (rendered
    through the chat template as /v1/chat/completions renders them)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[int]
