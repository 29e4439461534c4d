from __future__ import annotations

from pathlib import Path

import pytest

from superinfer.model.docs import models_markdown
from superinfer.model.registry import architectures, hf_architecture

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def test_models_page_matches_the_registry() -> None:
    text = DOC.read_text()
    assert text == models_markdown(), "run: python -m superinfer.model.docs > docs/models.md"
    for name in architectures():
        assert f"| `{name}` |" in text


def test_unknown_architecture_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError) as error:
        hf_architecture({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    message = str(error.value)
    assert "GPT2LMHeadModel" in message
    assert all(name in message for name in architectures())
