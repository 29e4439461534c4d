"""The official `openai` SDK against a real server: chat and completions, streaming and
not, usage, and the SLO fields it sends through `extra_body`."""

from __future__ import annotations

import time

import openai
import pytest

from tests.server.conftest import API_KEY

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def counted(server, n: int = 1):
    server.num_posts += n


def test_models(client):
    (model,) = client.models.list().data
    assert model.id == MODEL


def test_completion(client, server):
    counted(server)
    response = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True, "min_tokens": 2, "top_k": 40},
    )  # fmt: skip
    (choice,) = response.choices
    assert choice.text and choice.finish_reason == "length"
    assert response.usage.completion_tokens == 6
    assert response.usage.total_tokens == response.usage.prompt_tokens + 6
    slo = response.model_extra["slo"]
    assert slo["class"] is None and slo["ttft_met"] in (True, False)
    assert slo["targets"] == {"ttft_ms": 1000.0, "tbt_ms": 200.0, "max_latency_ms": None}


def test_chat_with_slo_and_priority(client, server):
    counted(server)
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=5,
        temperature=0, extra_body={"slo": {"class": "gold", "tbt_ms": 900}, "priority": -1},
    )  # fmt: skip
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content
    slo = response.model_extra["slo"]
    assert slo["class"] == "gold"
    assert slo["targets"] == {"ttft_ms": 3000.0, "tbt_ms": 900.0, "max_latency_ms": None}
    assert slo["ttft_ms"] > 0 and slo["e2e_ms"] >= slo["ttft_ms"]


def test_chat_stream_with_usage_agrees_with_client_timing(client, server):
    counted(server)
    start = time.monotonic()
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}, extra_headers={"x-slo-class": "silver"},
    )  # fmt: skip
    first_content, text, chunks = None, "", []
    for chunk in stream:
        chunks.append(chunk)
        if chunk.choices and chunk.choices[0].delta.content:
            first_content = first_content or time.monotonic()
            text += chunk.choices[0].delta.content
    end = time.monotonic()
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and finish[-1].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    slo = last.model_extra["slo"]
    assert slo["class"] == "silver" and text
    client_ttft_ms = (first_content - start) * 1000
    client_e2e_ms = (end - start) * 1000
    # the server's clock starts at ingress, the client's before sending: close, never later
    assert slo["ttft_ms"] <= client_ttft_ms + 5
    assert client_ttft_ms - slo["ttft_ms"] < 1000
    assert slo["e2e_ms"] <= client_e2e_ms + 5
    assert client_e2e_ms - slo["e2e_ms"] < 1000


def test_completion_stream_without_usage_carries_slo_last(client, server):
    counted(server)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="1, 2, 3,",
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"slo": {"ttft_ms": 2500, "max_latency_ms": 60000}},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    slo = last.model_extra["slo"]
    assert slo["targets"]["ttft_ms"] == 2500 and slo["targets"]["max_latency_ms"] == 60000
    assert slo["deadline_met"] is True


def test_stream_never_shows_a_stop_string(client, server):
    counted(server, 2)
    full = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0,
        extra_body={"ignore_eos": True},
    ).choices[0].text  # fmt: skip
    assert " 7" in full
    chunks = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=[" 7"], stream=True
    )
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == full[: full.index(" 7")]


def test_wrong_key_is_401(server):
    counted(server)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"
