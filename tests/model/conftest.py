from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from superinfer.model.cpu_q4 import q4_kernel
from superinfer.model.loader import LoadedModel, default_model_path, load_model
from tests.model.tiny import save_tiny, tiny_llama_config, tiny_qwen2_config


@pytest.fixture(scope="session", autouse=True)
def tokenizer_cache() -> Iterator[str]:
    """A private tokenizer cache for the session: tests never write to ~/.cache."""
    directory = tempfile.mkdtemp(prefix="superinfer-test-cache-")
    previous = os.environ.get("SUPERINFER_CACHE_DIR")
    os.environ["SUPERINFER_CACHE_DIR"] = directory
    yield directory
    if previous is None:
        del os.environ["SUPERINFER_CACHE_DIR"]
    else:
        os.environ["SUPERINFER_CACHE_DIR"] = previous
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    """The default model (SmolLM2-135M-Instruct GGUF), float32 on CPU, loaded once."""
    return load_model(None, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def smollm_bf16() -> LoadedModel:
    return load_model(None, torch.bfloat16, torch.device("cpu"))


@pytest.fixture(scope="session")
def hf_smollm() -> torch.nn.Module:
    """transformers' own float32 model from the same GGUF file: the reference."""
    from transformers import AutoModelForCausalLM

    directory, filename = os.path.split(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny random Llama (llama3 RoPE scaling, untied) saved as a Hugging Face directory."""
    return save_tiny(tmp_path_factory.mktemp("tiny_llama"), tiny_llama_config(), seed=0)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory) -> Path:
    """A tiny random Qwen2 (q/k/v bias, tied embeddings) saved as a Hugging Face directory."""
    return save_tiny(tmp_path_factory.mktemp("tiny_qwen2"), tiny_qwen2_config(), seed=1)


@pytest.fixture(params=["avx512", "amx"])
def rows_on(request) -> Iterator[str]:
    """The GEMMs and the attention kernels run on AVX-512 or on AMX (where this CPU has it),
    then back to what the kernel chose at load."""
    kernel = q4_kernel()
    was_on = kernel.use_amx()
    if kernel.use_amx(request.param == "amx") != (request.param == "amx"):
        pytest.skip("no AMX here")
    yield request.param
    kernel.use_amx(was_on)
