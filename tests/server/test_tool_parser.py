"""The Hermes tool-call parser on hand-written outputs, whole and streamed in pieces of
every size: the pieces of a stream add up to the whole parse."""

from __future__ import annotations

import json

import pytest

from superinfer.server.tools import PARSERS, parser_named
from superinfer.server.tools.streaming import json_value_end

PARSER = parser_named("hermes")

TWO_CALLS = (
    "Let me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, {"q": "}] {"}]}}'
    '\n</tool_call>\n<tool_call>{"name":"get_time","arguments":{}}</tool_call>\n'
)


def streamed(text: str, size: int) -> tuple[str, dict[int, dict[str, str]]]:
    """Content and calls (index -> id, name, arguments) reassembled from the deltas of
    `text` fed `size` characters at a time, as a client reassembles a stream."""
    state = PARSER.stream()
    pieces = [state.feed(text[i : i + size]) for i in range(0, len(text), size)]
    pieces.append(state.finish())
    content, calls = "", {}
    for piece in pieces:
        content += piece.content
        for call in piece.tool_calls:
            entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": ""})
            if call.id is not None:
                assert entry["id"] is None, "a call's id goes out once"
                entry.update(id=call.id, name=call.name)
            entry["arguments"] += call.arguments
    return content, calls


def test_two_calls_after_content():
    parsed = PARSER.parse(TWO_CALLS)
    assert parsed.content == "Let me check."
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "get_time"]
    weather = json.loads(parsed.tool_calls[0].arguments)
    assert weather == {"city": "Paris", "days": [1, {"q": "}] {"}]}
    assert json.loads(parsed.tool_calls[1].arguments) == {}
    assert len({c.id for c in parsed.tool_calls}) == 2
    assert all(c.id.startswith("call_") for c in parsed.tool_calls)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
def test_a_stream_split_anywhere_adds_up_to_the_whole_parse(size):
    content, calls = streamed(TWO_CALLS, size)
    whole = PARSER.parse(TWO_CALLS)
    assert content == whole.content
    assert [calls[i]["name"] for i in sorted(calls)] == [c.name for c in whole.tool_calls]
    for i, call in enumerate(whole.tool_calls):
        assert json.loads(calls[i]["arguments"]) == json.loads(call.arguments)


def test_the_name_goes_out_before_the_arguments_end():
    state = PARSER.stream()
    state.feed("<tool_call>\n")
    first = state.feed('{"name": "get_weather", "arguments": {"ci')
    assert first.content == ""
    assert [(c.index, c.name) for c in first.tool_calls] == [(0, "get_weather")]
    assert first.tool_calls[0].id is not None and first.tool_calls[0].arguments == '{"ci'
    rest = state.feed('ty": "Rome"}}\n</tool_call>')
    assert [(c.id, c.arguments) for c in rest.tool_calls] == [(None, 'ty": "Rome"}')]


def test_text_without_calls_is_content_exactly():
    text = "  Hello <b>world</b> and <tool_ca"  # ends in what could begin a tag
    assert PARSER.parse(text).content == text
    assert PARSER.parse(text).tool_calls == []
    content, calls = streamed(text, 1)
    assert (content, calls) == (text, {})


def test_a_held_tag_prefix_is_released_when_it_is_not_a_tag():
    state = PARSER.stream()
    assert state.feed("a <tool").content == "a"
    assert state.feed("box> b").content == " <toolbox> b"


def test_only_a_call_has_no_content():
    parsed = PARSER.parse('\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n')
    assert parsed.content is None
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("f", {"x": 1})]


def test_json_that_is_not_a_call_stays_content():
    parsed = PARSER.parse("<tool_call>{not json}</tool_call> after")
    assert parsed.tool_calls == []
    assert parsed.content == "<tool_call>{not json}</tool_call> after"


def test_arguments_before_name_are_parsed_at_the_end():
    content, calls = streamed('<tool_call>{"arguments": {"a": "b"}, "name": "f"}</tool_call>', 4)
    assert content == ""
    assert calls[0]["name"] == "f" and json.loads(calls[0]["arguments"]) == {"a": "b"}


def test_a_call_cut_off_keeps_what_was_streamed():
    parsed = PARSER.parse('<tool_call>{"name": "f", "arguments": {"a": 1')
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("f", '{"a": 1')]


def test_json_value_end_skips_brackets_in_strings():
    assert json_value_end('{"a": "}]", "b": [1]} tail') == len('{"a": "}]", "b": [1]}')
    assert json_value_end('{"a": "\\"}"') is None
    assert json_value_end("[1, [2]]x") == 8


def test_the_registry_names_its_parsers():
    assert PARSERS["hermes"] is type(PARSER)
    with pytest.raises(ValueError, match="known: hermes"):
        parser_named("nope")


def test_the_serve_flag_offers_every_registered_parser():
    from dataclasses import fields

    from superinfer.server.config import ServerConfig

    (flag,) = [f for f in fields(ServerConfig) if f.name == "tool_call_parser"]
    assert flag.metadata["choices"] == sorted(PARSERS)
