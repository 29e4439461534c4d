"""Every field of the request bodies is used or refused (issue 17, item 8): set to a value
other than its default, it either changes what the engine is asked to do (the prepared
request) or is a 400 naming it. A field added without an entry here fails the walk.
Also the known OpenAI and vLLM fields the models leave to `extra`: refused by name."""

from __future__ import annotations

import pytest

from superinfer.server.errors import APIError
from superinfer.server.protocol import ChatCompletionRequest, CompletionRequest

# field -> a valid value other than its default
SAMPLES = {
    "max_tokens": 5, "temperature": 0.5, "top_p": 0.5, "top_k": 5, "min_tokens": 2, "n": 2,
    "best_of": 3, "seed": 7, "stop": ["x"], "stop_token_ids": [5], "ignore_eos": True,
    "skip_special_tokens": False, "stream": True, "stream_options": {"include_usage": True},
    "priority": 3, "request_id": "other", "slo": {"ttft_ms": 500},
    "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2,
    "logit_bias": {"5": 1.0}, "min_p": 0.1, "bad_words": ["cat"], "allowed_token_ids": [1, 2],
    "prompt_logprobs": 1, "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "[a-z]+"}, "guided_json": {"type": "object"},
    "guided_regex": "[0-9]+", "guided_choice": ["a", "b"], "guided_grammar": 'start: "a"',
    "prompt": "Hello there", "echo": True, "suffix": "end", "logprobs": 2,
    "messages": [{"role": "user", "content": "Hello there"}], "max_completion_tokens": 5,
    "add_generation_prompt": False, "top_logprobs": 2,
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
    "chat_template_kwargs": {"add_generation_prompt": False},
    "include_stop_str_in_output": True,
}  # fmt: skip
CHAT_SAMPLES = {"logprobs": True}
# fields that change no output, and why
NO_EFFECT = {
    "model": "checked by the front (404 for a model not served)",
    "user": "OpenAI's end-user id for abuse monitoring",
}
BASE = {
    CompletionRequest: {"prompt": "Hi", "request_id": "r"},
    ChatCompletionRequest: {"messages": [{"role": "user", "content": "Hi"}], "request_id": "r"},
}


@pytest.fixture(scope="module")
def preparer():
    from superinfer.model.loader import default_model_path
    from superinfer.model.tokenizer import load_tokenizer
    from superinfer.server.prepare import RequestPreparer
    from superinfer.slo.classes import SLOConfig

    return RequestPreparer(load_tokenizer(default_model_path()), 49152, 2048, SLOConfig())


def prepare(preparer, body_type, **fields):
    from superinfer.server.arrival import Arrival

    body = body_type(**{**BASE[body_type], **fields})
    return repr(preparer.prepare(body, {}, Arrival(monotonic=1.0, wall=1e9)))


CASES = [(t, name) for t in BASE for name in t.model_fields if name not in NO_EFFECT]


@pytest.mark.parametrize("body_type, name", CASES, ids=[f"{t.__name__}.{n}" for t, n in CASES])
def test_every_field_is_used_or_refused_by_name(preparer, body_type, name):
    samples = {**SAMPLES, **(CHAT_SAMPLES if body_type is ChatCompletionRequest else {})}
    assert name in samples, f"{body_type.__name__}.{name}: add a sample (and use or refuse it)"
    baseline = prepare(preparer, body_type)
    try:
        changed = prepare(preparer, body_type, **{name: samples[name]})
    except APIError as error:
        assert error.status == 400 and error.param == name, (error.param, error.message)
        return
    assert changed != baseline, f"{name}={samples[name]!r} changed nothing"


@pytest.mark.parametrize("name, value", [
    ("echo", True), ("functions", [{"name": "f"}]), ("function_call", "f"),
    ("use_beam_search", True), ("length_penalty", 2.0),
    ("truncate_prompt_tokens", 5), ("reasoning_effort", "high"),
])  # fmt: skip
def test_known_extra_fields_are_refused_by_name(preparer, name, value):
    with pytest.raises(APIError) as info:
        prepare(preparer, ChatCompletionRequest, **{name: value})
    assert info.value.status == 400 and info.value.param == name


def test_neutral_values_of_refused_fields_pass(preparer):
    prepare(preparer, ChatCompletionRequest, tool_choice="none", echo=False, suffix=None)
