"""Tools and chat templates at ingress: how `tools`, `tool_choice`, the history's calls and
`chat_template_kwargs` reach the prompt, and the grammar a forced choice compiles to."""

from __future__ import annotations

import json

import pytest

from superinfer.server.errors import APIError
from superinfer.server.protocol import ChatCompletionRequest
from superinfer.server.serving_defaults import ServingDefaults

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
HISTORY = [
    *ASK,
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]  # fmt: skip
# a template that renders tools itself (as Qwen's and Llama 3's do)
TOOL_TEMPLATE = (
    "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% if m.tool_calls %}CALLS={{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}"
    "{% if enable_thinking is defined and not enable_thinking %}NO-THINK{% endif %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    from superinfer.model.loader import default_model_path
    from superinfer.model.tokenizer import load_tokenizer

    return load_tokenizer(default_model_path())


def preparer(tokenizer, template=None):
    from superinfer.server.prepare import RequestPreparer
    from superinfer.slo.classes import SLOConfig

    return RequestPreparer(tokenizer, 49152, 2048, SLOConfig(), ServingDefaults(template))


def prepare(p, **body):
    from superinfer.server.arrival import Arrival

    body = {"messages": ASK, **body}
    return p.prepare(ChatCompletionRequest(**body), {}, Arrival(monotonic=1.0, wall=1e9))


def test_a_template_without_tools_gets_them_in_the_hermes_system_prompt(tokenizer):
    prepared = prepare(preparer(tokenizer), tools=[WEATHER])
    assert prepared.prompt.startswith("<|im_start|>system\nYou are a function calling AI")
    assert json.dumps(WEATHER) in prepared.prompt and "<tools>" in prepared.prompt
    assert "SmolLM" not in prepared.prompt  # the tools' system message replaces the default
    assert prepared.tool_parser is not None and prepared.params.structured is None


def test_the_history_calls_and_results_in_the_hermes_format(tokenizer):
    prompt = prepare(preparer(tokenizer), messages=HISTORY, tools=[WEATHER]).prompt
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>" in prompt
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


def test_a_template_that_renders_tools_gets_them_and_dict_arguments(tokenizer):
    prompt = prepare(preparer(tokenizer, TOOL_TEMPLATE), messages=HISTORY, tools=[WEATHER]).prompt
    assert prompt.startswith("TOOLS=[") and '"get_weather"' in prompt.splitlines()[0]
    assert '"function": {"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "tool: sunny, 21 C" in prompt and "You are a function calling" not in prompt


def test_chat_template_kwargs_reach_the_template(tokenizer):
    p = preparer(tokenizer, TOOL_TEMPLATE)
    assert "NO-THINK" not in prepare(p).prompt
    assert prepare(p, chat_template_kwargs={"enable_thinking": False}).prompt.endswith(
        "NO-THINK" "assistant:"
    )
    assert not prepare(p, chat_template_kwargs={"add_generation_prompt": False}).prompt.endswith(
        "assistant:"
    )
    with pytest.raises(APIError) as info:
        prepare(p, chat_template_kwargs={"messages": []})
    assert info.value.param == "chat_template_kwargs"


def test_tool_choice_none_renders_but_does_not_parse(tokenizer):
    prepared = prepare(preparer(tokenizer), tools=[WEATHER], tool_choice="none")
    assert "get_weather" in prepared.prompt and prepared.tool_parser is None


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
    ({"messages": [*ASK, {"role": "assistant", "tool_calls": [{"function": {"name": "f",
      "arguments": "{oops"}}]}]}, "messages.1.tool_calls"),
])  # fmt: skip
def test_choices_that_do_not_fit_the_tools_are_refused(tokenizer, body, param):
    with pytest.raises(APIError) as info:
        prepare(preparer(tokenizer), **body)
    assert info.value.status == 400 and info.value.param == param


def consumes(p, prepared, text: str) -> bool:
    """Whether the request's compiled grammar takes `text` whole and may end after it."""
    p.compile_structured(prepared)
    matcher = prepared.params.structured.matcher
    ids = p.tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def test_a_named_choice_forces_one_call_to_that_tool(tokenizer):
    p = preparer(tokenizer)
    named = {"type": "function", "function": {"name": "get_weather"}}
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert consumes(p, prepare(p, tools=[WEATHER, TIME], tool_choice=named), call)
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert not consumes(p, prepare(p, tools=[WEATHER, TIME], tool_choice=named), other)
    missing = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    assert not consumes(p, prepare(p, tools=[WEATHER, TIME], tool_choice=named), missing)
    assert not consumes(p, prepare(p, tools=[WEATHER], tool_choice=named), "Sure! " + call)


def test_required_forces_a_call_to_any_tool(tokenizer):
    p = preparer(tokenizer)
    other = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    assert consumes(p, prepare(p, tools=[WEATHER, TIME], tool_choice="required"), other)
    assert not consumes(p, prepare(p, tools=[WEATHER, TIME], tool_choice="required"), "Hello")


def test_an_invalid_parameters_schema_is_a_400_naming_tools(tokenizer):
    p = preparer(tokenizer)
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}
    prepared = prepare(p, tools=[bad], tool_choice="required")
    with pytest.raises(APIError) as info:
        p.compile_structured(prepared)
    assert info.value.status == 400 and info.value.param == "tools"
