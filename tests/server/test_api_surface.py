"""The rest of the surface against a real server (issue 17, item 6): several prompts in one
/v1/completions call, /tokenize, /detokenize, /version, `stop` in `stop_reason`,
`include_stop_str_in_output`, `skip_special_tokens`."""

from __future__ import annotations

import json

import pytest

import superinfer

pytestmark = pytest.mark.slow

PROMPTS = ["1, 2, 3, 4,", "The capital of France is", "a b c d"]


def complete(server, n_posts: int = 1, **body):
    response = server.post("/v1/completions", {"max_tokens": 6, "temperature": 0, **body})
    server.num_posts += n_posts - 1  # each prompt's sequence is a request of its own
    assert response.status_code == 200, response.text
    return response.json()


def test_several_prompts_are_choices_prompt_major(server):
    alone = [complete(server, prompt=p, ignore_eos=True)["choices"][0]["text"] for p in PROMPTS]
    body = complete(server, 3, prompt=PROMPTS, ignore_eos=True)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == alone  # greedy: each as if sent alone
    prompt_tokens = sum(complete(server, prompt=p, max_tokens=1)["usage"]["prompt_tokens"]
                        for p in PROMPTS)  # fmt: skip
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 18,
                             "total_tokens": prompt_tokens + 18}  # fmt: skip


def test_several_token_id_prompts_with_n(server):
    ids = [server.post("/tokenize", {"prompt": p}).json()["tokens"] for p in PROMPTS[:2]]
    server.num_posts -= 2  # /tokenize is not a generation request
    body = complete(server, 4, prompt=ids, n=2, seed=3, temperature=1.0, ignore_eos=True)
    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert all(c["slo"] is not None for c in choices)  # each sequence tracked on its own
    assert body["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1])
    assert body["usage"]["completion_tokens"] == 24


def test_several_prompts_stream_with_their_indices(server):
    response = server.post("/v1/completions", {
        "prompt": PROMPTS[:2], "max_tokens": 4, "temperature": 0, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    })  # fmt: skip
    server.num_posts += 1
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["text"]
            if choice["finish_reason"]:
                finishes[choice["index"]] = choice["finish_reason"]
        usage = chunk.get("usage") or usage
    whole = complete(server, 2, prompt=PROMPTS[:2], max_tokens=4, ignore_eos=True)
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert finishes == {0: "length", 1: "length"} and usage["completion_tokens"] == 8


def test_a_stop_string_is_the_stop_reason_and_may_be_kept(server):
    full = complete(server, prompt=PROMPTS[0], max_tokens=12, ignore_eos=True)
    text = full["choices"][0]["text"]
    assert " 7" in text
    cut = complete(server, prompt=PROMPTS[0], max_tokens=12, stop=[" 7"])["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == " 7"
    assert cut["text"] == text[: text.index(" 7")]
    kept = complete(server, prompt=PROMPTS[0], max_tokens=12, stop=[" 7"],
                    include_stop_str_in_output=True)["choices"][0]  # fmt: skip
    assert kept["text"] == text[: text.index(" 7") + 2] and kept["stop_reason"] == " 7"


def test_skip_special_tokens_false_keeps_special_tokens(server):
    body = {"prompt": "Hi", "max_tokens": 3, "temperature": 0, "ignore_eos": True,
            "logit_bias": {"1": 100}}  # <|im_start|>, special, not a stop token  # fmt: skip
    shown = complete(server, **body, skip_special_tokens=False)["choices"][0]["text"]
    assert shown == "<|im_start|>" * 3
    assert complete(server, **body)["choices"][0]["text"] == ""


def test_tokenize_and_detokenize_round_trip(server):
    prompt = server.post("/tokenize", {"prompt": "Hello there", "return_token_strs": True}).json()
    assert prompt["count"] == len(prompt["tokens"]) > 0 and prompt["max_model_len"] > 0
    assert "".join(prompt["token_strs"]).replace("Ġ", " ") == "Hello there"
    back = server.post("/detokenize", {"tokens": prompt["tokens"]}).json()
    assert back == {"prompt": "Hello there"}
    chat = server.post("/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}).json()
    text = server.post("/detokenize", {"tokens": chat["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    bad = server.post("/detokenize", {"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    server.num_posts -= 5  # none of these is a generation request


def test_version(server):
    assert server.get("/version").json() == {"version": superinfer.__version__}
