from __future__ import annotations

import json
import os

import pytest

from superinfer.model.loader import default_model_path
from superinfer.model.tokenizer import load_tokenizer

TEXT = "  Hello,   world!\n\nnumbers 12345, accents éàü, 日本語 <|im_end|>"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


@pytest.mark.slow
def test_cached_gguf_tokenizer_equals_the_converted_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SUPERINFER_CACHE_DIR", str(tmp_path))
    converted = load_tokenizer(default_model_path())
    (entry,) = os.listdir(tmp_path / "tokenizers")
    cached = load_tokenizer(default_model_path())
    assert cached.name_or_path == str(tmp_path / "tokenizers" / entry)
    assert cached(TEXT)["input_ids"] == converted(TEXT)["input_ids"]
    assert cached.apply_chat_template(
        MESSAGES, add_generation_prompt=True
    ) == converted.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert (cached.bos_token, cached.eos_token) == (converted.bos_token, converted.eos_token)
    assert cached.eos_token_id == 2


@pytest.mark.slow
def test_empty_cache_dir_disables_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SUPERINFER_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    assert load_tokenizer(default_model_path()).eos_token == "<|im_end|>"
    assert os.listdir(tmp_path) == []


def test_a_processors_chat_template_serves_a_tokenizer_without_one(tmp_path) -> None:
    """Mistral Small 3.1 keeps its template only in the processor's chat_template.json."""
    from tests.model.tiny import save_tiny, tiny_llama_config

    directory = save_tiny(tmp_path, tiny_llama_config(), seed=0)
    assert load_tokenizer(str(directory)).chat_template is None
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    tokenizer = load_tokenizer(str(directory))
    messages = [{"role": "user", "content": "w5 w6"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "[user] w5 w6\n"
