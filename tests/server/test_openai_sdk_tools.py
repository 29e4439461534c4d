"""Tool calls through the official `openai` SDK against a real server: a forced (named or
required) choice streamed as `tool_calls` deltas, reassembled by the client, parses as
JSON matching the tool's parameters; the whole (non-stream) answer has the call and no
content; a history with the call and its result is accepted. (The default model is tiny:
only a forced choice makes its call deterministic.)"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.conftest import API_KEY

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER_PARAMETERS}},
    {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def reassembled(stream) -> tuple[dict[int, dict], str, list[str]]:
    """(index -> {id, name, arguments}, content, finish reasons) as a client rebuilds them."""
    calls: dict[int, dict] = {}
    content, finishes = "", []
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            if piece.id:
                call["id"] = piece.id
                assert piece.type == "function"
            if piece.function and piece.function.name:
                call["name"] += piece.function.name
            if piece.function and piece.function.arguments:
                call["arguments"] += piece.function.arguments
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
    return calls, content, finishes


@pytest.mark.parametrize("tool_choice", [
    {"type": "function", "function": {"name": "get_weather"}}, "required",
], ids=["named", "required"])  # fmt: skip
def test_a_forced_call_streams_as_tool_call_deltas(client, server, tool_choice):
    server.num_posts += 1
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice=tool_choice, max_tokens=80,
        temperature=0, stream=True,
    )  # fmt: skip
    calls, content, finishes = reassembled(stream)
    assert finishes == ["tool_calls"] and content == ""
    (call,) = calls.values()
    assert call["id"].startswith("call_")
    if tool_choice == "required":
        assert call["name"] in ("get_weather", "get_time")
    else:
        assert call["name"] == "get_weather"
    schema = TOOLS[0 if call["name"] == "get_weather" else 1]["function"]["parameters"]
    jsonschema.validate(json.loads(call["arguments"]), schema)


def test_a_whole_answer_has_the_call_and_no_content(client, server):
    server.num_posts += 1
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    (choice,) = response.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)


def test_a_history_with_a_call_and_its_result_is_answered(client, server):
    server.num_posts += 1
    arguments = '{"city": "Paris", "unit": "celsius"}'
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]  # fmt: skip
    response = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8,
        temperature=0,
    )  # fmt: skip
    (choice,) = response.choices
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")
