"""Incremental detokenization with stop strings: the text ends before the stop string, or
(vLLM's include_stop_str_in_output) with it, however the tokens split it."""

from __future__ import annotations

import pytest

from superinfer.engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer():
    from superinfer.model.loader import default_model_path
    from superinfer.model.tokenizer import load_tokenizer

    return load_tokenizer(default_model_path())


def run(tokenizer, text: str, stop: list[str], include: bool) -> IncrementalDetokenizer:
    detokenizer = IncrementalDetokenizer(tokenizer, stop, include_stop_str=include)
    for token in tokenizer.encode(text, add_special_tokens=False):
        detokenizer.add_tokens([token])
    return detokenizer


@pytest.mark.parametrize("include, expected", [(False, "1, 2, 3,"), (True, "1, 2, 3, 4")])
def test_the_stop_string_is_cut_or_kept(tokenizer, include, expected):
    detokenizer = run(tokenizer, "1, 2, 3, 4, 5, 6", [" 4", " 6"], include)
    assert detokenizer.text == expected and detokenizer.stop_string == " 4"
    assert detokenizer.add_tokens([tokenizer.encode(" 9")[0]]) == ""  # nothing after a stop


def test_a_stop_string_across_tokens_is_kept_whole(tokenizer):
    detokenizer = run(tokenizer, "The capital of France is Paris.", ["of Fr"], True)
    assert detokenizer.text == "The capital of Fr"
