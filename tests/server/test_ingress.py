"""Every admission path and every kind of malformed input: a 4xx with an OpenAI-style
error body, a log line, and a server that keeps serving."""

from __future__ import annotations

import time

import httpx
import pytest

pytestmark = pytest.mark.slow

OK_BODY = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    # OpenAI's four fields; a refusal admission estimated adds its estimate (docs/slo.md)
    assert set(error) - {"estimated_ttft_ms"} == {"message", "type", "param", "code"}
    assert error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


def test_not_ready_while_warming_up(server):
    status, body = server.boot_observations["post"]
    assert status == 503 and body["error"]["code"] == "not_ready"


def test_health_and_models(server):
    assert server.get("/health").json() == {"status": "ok"}
    assert server.get("/v1/models").json()["data"][0]["max_model_len"] == 2048


def test_missing_or_wrong_key_is_401(server):
    server.num_posts += 2
    no_key = httpx.post(server.url + "/v1/completions", json=OK_BODY, timeout=30)
    assert_error(no_key, 401, "invalid_api_key")
    wrong = httpx.post(
        server.url + "/v1/chat/completions", json=OK_BODY, timeout=30,
        headers={"Authorization": "Bearer nope"},
    )  # fmt: skip
    assert_error(wrong, 401, "invalid_api_key")


def test_past_deadline_is_425(server):
    past_ms = str((time.time() - 5) * 1000)
    response = server.post("/v1/completions", OK_BODY, headers={"x-slo-deadline": past_ms})
    assert_error(response, 425, "slo_infeasible")


def test_infeasible_deadline_is_425(server):
    # 500 tokens cannot be decoded in 50 ms on any machine this runs on
    body = {**OK_BODY, "max_tokens": 500, "ignore_eos": True, "slo": {"max_latency_ms": 50}}
    assert_error(server.post("/v1/completions", body), 425, "slo_infeasible")


def test_feasible_deadline_is_served(server):
    body = {**OK_BODY, "slo": {"max_latency_ms": 60000}}
    response = server.post("/v1/completions", body)
    assert response.status_code == 200 and response.json()["slo"]["deadline_met"]


def test_a_ttft_target_the_prefill_alone_breaks_is_425_and_no_target_is_served(server):
    # 1,000 prompt tokens cannot be prefilled in 5 ms here: refused at once, never queued
    body = {"prompt": list(range(100, 1100)), "max_tokens": 1, "temperature": 0}
    response = server.post("/v1/completions", body, headers={"x-slo-ttft-ms": "5"})
    assert "TTFT" in assert_error(response, 425, "slo_infeasible")["message"]
    # the same request on the server's default targets is served, however late
    assert server.post("/v1/completions", body).status_code == 200


TOO_LONG = {"prompt": list(range(100, 2148)), "max_tokens": 1}
MALFORMED = [
    ("invalid json", "{", None, "invalid_json"),
    ("a list body", [1, 2], None, "invalid_json"),
    ("missing prompt", {"max_tokens": 3}, None, "missing_field"),
    ("prompt of wrong type", {"prompt": 123}, None, "invalid_type"),
    ("max_tokens not a number", {**OK_BODY, "max_tokens": "abc"}, None, "invalid_type"),
    ("negative max_tokens", {**OK_BODY, "max_tokens": -1}, None, "invalid_value"),
    ("absurd max_tokens", {**OK_BODY, "max_tokens": 10**12}, None, "context_length_exceeded"),
    ("negative temperature", {**OK_BODY, "temperature": -1}, None, "invalid_value"),
    ("temperature not a number", {**OK_BODY, "temperature": "hot"}, None, "invalid_type"),
    ("NaN temperature", '{"prompt": "x", "temperature": NaN}', None, "invalid_value"),
    ("top_p over 1", {**OK_BODY, "top_p": 5}, None, "invalid_value"),
    ("best_of below n", {**OK_BODY, "n": 3, "best_of": 2}, None, "invalid_value"),
    ("n over the limit", {**OK_BODY, "n": 1000}, None, "invalid_value"),
    ("huge seed", {**OK_BODY, "seed": 2**70}, None, "invalid_value"),
    ("stop token out of vocab", {**OK_BODY, "stop_token_ids": [-1]}, None, "invalid_value"),
    ("token id out of vocab", {"prompt": [10**9], "max_tokens": 2}, None, "invalid_value"),
    ("empty prompt", {"prompt": "", "max_tokens": 2}, None, "invalid_value"),
    ("prompts x n over the limit", {"prompt": ["a"] * 65, "n": 2}, None, "invalid_value"),
    ("one of the prompts empty", {"prompt": ["a", ""], "max_tokens": 2}, None, "invalid_value"),
    ("prompt over the model length", TOO_LONG, None, "context_length_exceeded"),
    ("min_tokens over max_tokens", {**OK_BODY, "min_tokens": 5}, None, "invalid_value"),
    ("logprobs over 20", {**OK_BODY, "logprobs": 21}, None, "invalid_value"),
    ("suffix", {**OK_BODY, "suffix": "x"}, None, "unsupported_parameter"),
    ("unknown class in body", {**OK_BODY, "slo": {"class": "platinum"}}, None, "unknown_slo_class"),
    ("unknown class header", OK_BODY, {"x-slo-class": "platinum"}, "unknown_slo_class"),
    ("negative target", {**OK_BODY, "slo": {"ttft_ms": -5}}, None, "invalid_slo"),
    ("non-numeric target", {**OK_BODY, "slo": {"tbt_ms": "fast"}}, None, "invalid_type"),
    ("misspelt slo field", {**OK_BODY, "slo": {"ttft": 100}}, None, None),
    ("bad ttft header", OK_BODY, {"x-slo-ttft-ms": "soon"}, "invalid_slo"),
    ("negative tbt header", OK_BODY, {"x-slo-tbt-ms": "-3"}, "invalid_slo"),
    ("NaN latency header", OK_BODY, {"x-slo-max-latency": "nan"}, "invalid_slo"),
    ("bad deadline header", OK_BODY, {"x-slo-deadline": "tomorrow"}, "invalid_slo"),
    ("long request id", {**OK_BODY, "request_id": "x" * 500}, None, "invalid_type"),
    ("unknown model", {**OK_BODY, "model": "gpt-9"}, None, "model_not_found"),
    ("nesting bomb", "[" * 100_000 + "]" * 100_000, None, "invalid_json"),
]


@pytest.mark.parametrize(
    "body, headers, code", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_completion_is_4xx_and_the_server_keeps_serving(server, body, headers, code):
    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
    headers = {"content-type": "application/json", **(headers or {})}
    response = server.post("/v1/completions", headers=headers, **kwargs)
    assert 400 <= response.status_code < 500
    assert_error(response, 404 if code == "model_not_found" else 400, code)


CHAT_MALFORMED = [
    ("no messages", {"messages": []}),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("content of wrong type", {"messages": [{"role": "user", "content": 5}]}),
    ("image content", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("tool without a function",
     {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
]


@pytest.mark.parametrize("body", [m[1] for m in CHAT_MALFORMED], ids=[m[0] for m in CHAT_MALFORMED])
def test_malformed_chat_is_400(server, body):
    assert_error(server.post("/v1/chat/completions", body), 400)


def test_body_too_large_is_413(server):
    response = server.post("/v1/completions", content=b"x" * (17 << 20))
    assert_error(response, 413, "request_too_large")


def test_duplicate_request_id_is_400_while_the_first_runs(server):
    body = {**OK_BODY, "max_tokens": 400, "ignore_eos": True, "request_id": "dup-1"}
    with httpx.Client(timeout=120, headers=server.headers) as client:
        server.num_posts += 1
        with client.stream(
            "POST", server.url + "/v1/completions", json={**body, "stream": True}
        ) as first:
            # keep the line iterator: dropping it closes the stream, the server then sees a
            # disconnect and may abort the first request before the second one arrives
            lines = first.iter_lines()
            assert next(lines).startswith("data: ")
            assert_error(server.post("/v1/completions", body), 400, "duplicate_request_id")
            assert sum(1 for line in lines if line.startswith("data: ")) > 1  # still streaming


def test_non_stream_client_that_leaves_aborts_its_request(server):
    body = {**OK_BODY, "max_tokens": 300, "ignore_eos": True, "request_id": "leaver-1"}
    with pytest.raises(httpx.ReadTimeout):
        server.post("/v1/completions", body, timeout=httpx.Timeout(30, read=1.0))
    report = server.wait_idle(60)  # long before 300 tokens could have been made
    assert report["device_blocks_used"] == 0 and report["host_blocks_used"] == 0
    (line,) = [line for line in server.log_lines() if line["id"] == "leaver-1"]
    assert line["outcome"] == "aborted" and line["reason"] == "client_disconnected"
    assert line["output_tokens"] < 300


def test_unknown_route_and_method(server):
    assert_error(server.get("/v1/nothing"), 404)
    assert httpx.get(server.url + "/v1/completions", timeout=30).status_code == 405


def test_still_serving_after_all_that(server):
    response = server.post("/v1/completions", OK_BODY)
    assert response.status_code == 200 and response.json()["choices"][0]["text"]
    report = server.wait_idle()
    assert report["invariants"] == "ok"
    assert report["device_blocks_used"] == 0 and report["host_blocks_used"] == 0


def test_every_request_left_one_whole_log_line(server):
    lines = server.log_lines()
    assert len(lines) == server.num_posts
    rejected = [line for line in lines if line["outcome"] == "rejected"]
    codes = {m[3] for m in MALFORMED} | {"not_ready", "slo_infeasible", "invalid_api_key",
                                         "invalid_type", "request_too_large", "not_found",
                                         "duplicate_request_id"}  # fmt: skip
    assert {line["reason"] for line in rejected} <= codes
    assert all(line["status"] >= 400 for line in rejected)
    for line in lines:
        assert {"id", "class", "targets", "arrival", "ttft_ms", "tpot_ms", "max_tbt_ms",
                "e2e_ms", "ttft_met", "tpot_met", "deadline_met", "preemptions", "rotations",
                "prompt_tokens", "output_tokens", "finish_reason"} <= set(line)  # fmt: skip
