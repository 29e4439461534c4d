"""`--dtype auto` resolves as vLLM's: the checkpoint's dtype where the device computes it,
float32 and unstated ones to the device's preferred dtype."""

from __future__ import annotations

import json

import pytest
import torch

from superinfer.model import dtype as dtype_module
from superinfer.model.dtype import checkpoint_dtype, resolve_dtype

CPU = torch.device("cpu")


def hf_dir(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.fixture
def native_bf16(monkeypatch):
    monkeypatch.setattr(
        dtype_module, "supported_dtypes", lambda device: (torch.bfloat16, torch.float32)
    )


@pytest.fixture
def no_bf16(monkeypatch):
    monkeypatch.setattr(dtype_module, "supported_dtypes", lambda device: (torch.float32,))


def test_explicit_names_are_kept():
    for name, expected in (("float32", torch.float32), ("float16", torch.float16),
                           ("bfloat16", torch.bfloat16)):  # fmt: skip
        assert resolve_dtype(name, None, CPU) == expected


def test_auto_keeps_a_native_checkpoint_dtype(tmp_path, native_bf16):
    assert resolve_dtype("auto", hf_dir(tmp_path, torch_dtype="bfloat16"), CPU) == torch.bfloat16


def test_auto_downcasts_float32_and_unstated(tmp_path, native_bf16):
    assert resolve_dtype("auto", hf_dir(tmp_path, torch_dtype="float32"), CPU) == torch.bfloat16
    assert resolve_dtype("auto", None, CPU) == torch.bfloat16  # the default GGUF


def test_auto_without_native_bf16_is_float32(tmp_path, no_bf16):
    assert resolve_dtype("auto", hf_dir(tmp_path, torch_dtype="bfloat16"), CPU) == torch.float32
    assert resolve_dtype("auto", hf_dir(tmp_path, dtype="float16"), CPU) == torch.float32


def test_checkpoint_dtype_reads_both_keys(tmp_path):
    assert checkpoint_dtype(hf_dir(tmp_path, dtype="float16")) == torch.float16
    assert checkpoint_dtype(hf_dir(tmp_path)) is None
    assert checkpoint_dtype(str(tmp_path / "x.gguf")) is None


def test_vllm_spellings_normalise():
    from superinfer.config import ModelConfig

    assert ModelConfig(dtype="half").dtype == "float16"
    assert ModelConfig(dtype="float").dtype == "float32"
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig(dtype="fp8")
