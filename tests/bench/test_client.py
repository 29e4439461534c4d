"""The benchmark client's requests: chat messages of a conversation's turn, and the replies a
conversation sends back, against a server faked at the transport (`httpx.MockTransport`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import httpx

from superinfer.bench.client import RequestOptions, RequestSpec, chat_messages, send
from superinfer.slo import SLOTargets

TEXTS = ("What is 2+2?", "Four.", "And 3+3?", "Six.", "And 4+4?")


def turn(index: int) -> RequestSpec:
    texts = TEXTS[: 2 * index + 1]
    return RequestSpec(f"t{index}", "\n\n".join(texts), 10, 3, SLOTargets(), 0.0, texts, (7, index))


def test_a_single_turn_is_one_user_message():
    spec = RequestSpec("r", "Hello", 1, 3, SLOTargets(), 0.0)
    assert chat_messages(spec, {(0, 0): "ignored"}) == [{"role": "user", "content": "Hello"}]


def test_a_turn_sends_the_replies_it_got_and_the_reference_for_the_rest():
    messages = chat_messages(turn(2), {(7, 0): "4", (8, 1): "another conversation"})
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in messages] == ["What is 2+2?", "4", "And 3+3?", "Six.",
                                                "And 4+4?"]  # fmt: skip


def streaming_server(reply: tuple[str, ...], status: int = 200) -> tuple[httpx.MockTransport, list[dict]]:
    bodies: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "no", "code": "slo"}})
        chunks = [{"choices": [{"delta": {"content": part}, "finish_reason": None}]}
                  for part in reply]  # fmt: skip
        chunks.append({"choices": [{"delta": {}, "finish_reason": "length"}]})
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle), bodies


async def conversation(reply: tuple[str, ...], status: int = 200) -> tuple[dict, list[dict]]:
    transport, bodies = streaming_server(reply, status)
    options = RequestOptions("http://server/v1/chat/completions", "m", is_chat=True)
    answers: dict = {}
    async with httpx.AsyncClient(transport=transport) as client:
        await send(client, turn(0), options, answers)
        await send(client, turn(1), options, answers)
    return answers, bodies


def test_a_finished_reply_goes_back_in_the_next_turn():
    answers, bodies = asyncio.run(conversation(("It", " is", " four")))
    assert answers == {(7, 0): "It is four", (7, 1): "It is four"}
    assert bodies[1]["messages"][1] == {"role": "assistant", "content": "It is four"}


def test_a_refused_turn_leaves_the_reference_reply_in_the_history():
    answers, bodies = asyncio.run(conversation(("unused",), status=425))
    assert answers == {}
    assert bodies[1]["messages"][1] == {"role": "assistant", "content": "Four."}


def test_a_later_turn_waits_for_the_answer_then_thinks():
    """The client's closed loop: turn 1 leaves `think_s` after turn 0's reply ended, even
    though its arrival says it could go at once, and carries that reply."""
    from superinfer.bench.serve import ServeOptions, _dispatch

    sent: list[float] = []
    transport, bodies = streaming_server(("Four",))

    async def handle(request: httpx.Request) -> httpx.Response:
        sent.append(time.perf_counter())
        await asyncio.sleep(0.2)  # the answer takes a while
        return transport.handle_request(request)

    specs = [turn(0), dataclasses.replace(turn(1), think_s=0.3), turn_alone()]
    options = RequestOptions("http://server/v1/chat/completions", "m", is_chat=True)

    async def run() -> list:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            return await _dispatch(client, specs, options, ServeOptions(base_url="http://server",
                                   disable_tqdm=True), time.perf_counter())  # fmt: skip

    results = asyncio.run(run())
    assert [r.spec.request_id for r in results] == ["t0", "t1", "alone"]
    first, second = min(sent), max(sent)
    assert second - first >= 0.2 + 0.3 - 0.01  # answer, then thinking
    second_turn = next(body for body in bodies if len(body["messages"]) == 3)
    assert second_turn["messages"][1] == {"role": "assistant", "content": "Four"}


def turn_alone() -> RequestSpec:
    return RequestSpec("alone", "Hi", 1, 2, SLOTargets(), 0.0)
