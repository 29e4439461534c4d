"""--chat-template and --generation-config: what a request gets when it does not say."""

from __future__ import annotations

import json

import pytest

from superinfer.server.serving_defaults import load_chat_template, load_generation_defaults


def test_chat_template_from_a_file_or_inline(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    assert load_chat_template(str(path)) == "{{ messages }}"
    assert load_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}").startswith("{%")
    assert load_chat_template(None) is None
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_chat_template(str(tmp_path / "missing.jinja"))


def test_generation_config_auto_reads_the_model_directory(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64, "bos_token_id": 1,
         "min_p": 0.05, "repetition_penalty": 1.1, "do_sample": True}
    ))  # fmt: skip
    defaults = load_generation_defaults("auto", str(tmp_path))
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_tokens": 64,
                        "min_p": 0.05, "repetition_penalty": 1.1}  # fmt: skip
    assert load_generation_defaults("vllm", str(tmp_path)) == {}
    assert load_generation_defaults(str(tmp_path), None) == defaults


def test_generation_config_auto_without_a_file_is_empty(tmp_path):
    assert load_generation_defaults("auto", None) == {}
    assert load_generation_defaults("auto", str(tmp_path / "model.gguf")) == {}
    assert load_generation_defaults("auto", str(tmp_path)) == {}
    with pytest.raises(FileNotFoundError):
        load_generation_defaults(str(tmp_path / "nowhere"), None)
    with pytest.raises(FileNotFoundError):
        load_generation_defaults(str(tmp_path), None)


@pytest.fixture(scope="module")
def tokenizer():
    from superinfer.model.loader import default_model_path
    from superinfer.model.tokenizer import load_tokenizer

    return load_tokenizer(default_model_path())


def preparer(tokenizer, defaults):
    from superinfer.server.prepare import RequestPreparer
    from superinfer.slo.classes import SLOConfig

    return RequestPreparer(tokenizer, 49152, 2048, SLOConfig(), defaults)


def prepare(preparer, body_type, **body):
    from superinfer.server.arrival import Arrival

    return preparer.prepare(body_type(**body), {}, Arrival(monotonic=1.0, wall=1e9))


def test_generation_defaults_fill_only_unset_fields(tokenizer):
    from superinfer.server.protocol import CompletionRequest
    from superinfer.server.serving_defaults import ServingDefaults

    defaults = ServingDefaults(sampling={"temperature": 0.6, "top_k": 20, "max_tokens": 7})
    p = preparer(tokenizer, defaults)
    params = prepare(p, CompletionRequest, prompt="Hello").params
    assert (params.temperature, params.top_k, params.max_tokens) == (0.6, 20, 7)
    params = prepare(p, CompletionRequest, prompt="Hello", temperature=0, max_tokens=3).params
    assert (params.temperature, params.top_k, params.max_tokens) == (0.0, 20, 3)


def test_generation_defaults_of_min_p_and_repetition_penalty(tokenizer):
    from superinfer.server.protocol import ChatCompletionRequest
    from superinfer.server.serving_defaults import ServingDefaults

    p = preparer(tokenizer, ServingDefaults(sampling={"min_p": 0.05, "repetition_penalty": 1.1}))
    ask = [{"role": "user", "content": "hi"}]
    params = prepare(p, ChatCompletionRequest, messages=ask).params
    assert (params.min_p, params.repetition_penalty) == (0.05, 1.1)
    params = prepare(p, ChatCompletionRequest, messages=ask, min_p=0.2, repetition_penalty=1).params
    assert (params.min_p, params.repetition_penalty) == (0.2, 1.0)


def test_chat_template_replaces_the_tokenizers(tokenizer):
    from superinfer.server.protocol import ChatCompletionRequest
    from superinfer.server.serving_defaults import ServingDefaults

    template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    p = preparer(tokenizer, ServingDefaults(chat_template=template))
    prepared = prepare(p, ChatCompletionRequest, messages=[{"role": "user", "content": "hi"}])
    assert prepared.prompt == "<<hi>>"
    own = prepare(preparer(tokenizer, None), ChatCompletionRequest,
                  messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert own.prompt != "<<hi>>" and "hi" in own.prompt
