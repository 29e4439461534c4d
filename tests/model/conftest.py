from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from superinfer.model.loader import LoadedModel, default_model_path, load_model  # noqa: E402


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """The default model (SmolLM2-135M-Instruct GGUF), float32 on CPU, loaded once."""
    return load_model(None, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def hf_smollm() -> torch.nn.Module:
    """transformers' own float32 model from the same GGUF file: the reference."""
    from transformers import AutoModelForCausalLM

    directory, filename = os.path.split(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    return model.eval()
