"""Text deltas in, content and tool-call deltas out: the state of one choice's output.

A call is written `START {"name": ..., "arguments": {...}} END` (the tags are the
format's). Outside calls, text is content; the tail that could begin a start tag is held
until the next delta decides it, and so is whitespace at the end of the content (the
whitespace before a call is not content). Inside a call, the name goes out once it is
complete (with the call's id and type), then the arguments' raw JSON text in fragments as
it comes, so the fragments of a call concatenate to its arguments. A call whose JSON does
not hold a name and arguments is content, as written. A whole (non-stream) output is
parsed by feeding it as one delta, so both paths agree.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

# the head of a call streamed as it comes: {"name": "...", "arguments":
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


@dataclass
class ToolCall:
    """One whole call: OpenAI's `{"id", "type": "function", "function": {name, arguments}}`."""

    id: str
    name: str
    arguments: str  # JSON text

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip


@dataclass
class ToolCallDelta:
    """A piece of call `index`: the first carries id and name, the rest arguments text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_dict(self) -> dict[str, object]:
        function: dict[str, str] = {"arguments": self.arguments}
        if self.name is not None:
            function = {"name": self.name, **function}
        delta: dict[str, object] = {"index": self.index}
        if self.id is not None:
            delta.update(id=self.id, type="function")
        return {**delta, "function": function}


@dataclass
class DeltaMessage:
    """What one text delta adds: content text and tool-call pieces."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def add(self, index: int, arguments: str = "", call_id: str | None = None,
            name: str | None = None) -> None:  # fmt: skip
        last = self.tool_calls[-1] if self.tool_calls else None
        if last is not None and last.index == index and call_id is None:
            last.arguments += arguments
        else:
            self.tool_calls.append(ToolCallDelta(index, call_id, name, arguments))

    def extend(self, other: DeltaMessage) -> None:
        self.content += other.content
        for piece in other.tool_calls:
            self.add(piece.index, piece.arguments, piece.id, piece.name)

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


@dataclass
class ParsedMessage:
    """A whole output: its content (None when there is none) and its calls."""

    content: str | None
    tool_calls: list[ToolCall]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class TaggedCallStream:
    """The parse state of one output whose calls are JSON objects between two tags."""

    def __init__(self, start_tag: str, end_tag: str) -> None:
        self.start_tag, self.end_tag = start_tag, end_tag
        self.calls: list[ToolCall] = []
        self._buffer = ""  # text not yet decided
        self._held_space = ""  # whitespace at the end of the content so far
        self._in_call = False
        self._call = ""  # the open call's JSON text so far
        self._id: str | None = None  # the open call's, once its name went out
        self._name = ""
        self._arguments = ""  # the open call's arguments text sent
        self._is_complete = False  # whether those are all of them

    def feed(self, text: str) -> DeltaMessage:
        """The content and call pieces `text` completes."""
        out = DeltaMessage()
        self._buffer += text
        while True:
            tag = self.end_tag if self._in_call else self.start_tag
            at = self._buffer.find(tag)
            if at < 0:
                keep = _partial_tag(self._buffer, tag)
                cut = len(self._buffer) - keep
                decided, self._buffer = self._buffer[:cut], self._buffer[cut:]
                if self._in_call:
                    self._call += decided
                    self._stream_call(out)
                else:
                    self._content(out, decided)
                return out
            decided, self._buffer = self._buffer[:at], self._buffer[at + len(tag) :]
            if self._in_call:
                self._call += decided
                self._close_call(out, closed=True)
            else:
                self._content(out, decided)
                self._held_space = ""  # the whitespace before a call is not content
                self._in_call, self._call = True, ""

    def finish(self) -> DeltaMessage:
        """What is left at the end of the output (a call cut off is parsed as it stands)."""
        out = DeltaMessage()
        if self._in_call:
            self._call += self._buffer
            self._close_call(out, closed=False)
        else:
            self._content(out, self._buffer)
        self._buffer = ""
        if not self.calls:
            out.content += self._held_space
        self._held_space = ""
        return out

    # --- content --------------------------------------------------------------------------
    def _content(self, out: DeltaMessage, text: str) -> None:
        text = self._held_space + text
        body = text.rstrip()
        self._held_space = text[len(body) :]
        out.content += body

    # --- calls ----------------------------------------------------------------------------
    def _stream_call(self, out: DeltaMessage) -> None:
        head = _HEAD.match(self._call)
        if head is None or self._is_complete:
            return
        index = len(self.calls)
        if self._id is None:
            self._id, self._name = new_call_id(), json.loads(f'"{head.group(1)}"')
            out.add(index, "", self._id, self._name)
        arguments = self._call[head.end() :]
        if not arguments.startswith(("{", "[")):
            return  # a scalar's end is known only at the call's end
        end = json_value_end(arguments)
        raw = arguments if end is None else arguments[:end]
        self._is_complete = end is not None
        if len(raw) > len(self._arguments):
            out.add(index, raw[len(self._arguments) :])
            self._arguments = raw

    def _close_call(self, out: DeltaMessage, closed: bool) -> None:
        self._stream_call(out)
        call = _call_of(self._call)
        index = len(self.calls)
        if self._id is not None:  # streamed: its fragments are its arguments
            text = self._arguments
            if not self._is_complete and call is not None:  # scalar arguments
                text = call[1]
                out.add(index, text)
            self.calls.append(ToolCall(self._id, self._name, text))
        elif call is not None:
            call_id = new_call_id()
            out.add(index, call[1], call_id, call[0])
            self.calls.append(ToolCall(call_id, call[0], call[1]))
        else:  # not a call: content as written
            self._content(out, self.start_tag + self._call + (self.end_tag if closed else ""))
        self._in_call, self._call, self._id, self._name = False, "", None, ""
        self._arguments, self._is_complete = "", False


def _call_of(text: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a call's JSON, or None if it is not a call."""
    try:
        call = json.loads(text)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters"))
    if arguments is None:
        return None
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return call["name"], arguments


def json_value_end(text: str) -> int | None:
    """The end of the JSON object or array `text` starts with, None while it is open."""
    depth, in_string, escaped = 0, False, False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (held for the next delta)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0
