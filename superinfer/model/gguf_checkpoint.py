"""Read a llama.cpp GGUF file: its config, and its weights dequantized under HF names."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Collection, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader, LlamaFileType, ReaderTensor
from gguf.quants import dequantize
from torch import Tensor

from superinfer.model.config import GGUF_LONG_FACTOR, GGUF_SHORT_FACTOR, ModelConfig
from superinfer.model.registry import Architecture, gguf_architecture

_TOP_LEVEL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",  # the router of a mixture of experts
}
# a mixture of experts' projections, stacked: (experts, rows, columns)
_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_ROPE_FREQS = "rope_freqs.weight"
# LongRoPE's factors, read into the config (`config.GGUF_LONG_FACTOR`), not weights
_LONGROPE_FACTORS = {"rope_factors_long.weight": GGUF_LONG_FACTOR,
                     "rope_factors_short.weight": GGUF_SHORT_FACTOR}  # fmt: skip


class GGUFCheckpoint:
    """A GGUF file opened for reading (memory-mapped)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.reader = GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch: Architecture = gguf_architecture(self.architecture)

    def metadata(self) -> dict[str, Any]:
        """Key/values as plain Python values, without the tokenizer's vocabulary arrays."""
        out = {}
        for key, field in self.reader.fields.items():
            vocabulary = key.startswith("tokenizer.ggml.") and not key.endswith("_token_id")
            if not vocabulary:
                out[key] = field.contents()
        return out

    def config(self) -> ModelConfig:
        metadata = self.metadata()
        arch = metadata.get("general.architecture")
        metadata.setdefault(f"{arch}.vocab_size", self._num_rows("token_embd.weight"))
        factors = None
        if _ROPE_FREQS in self.tensors:
            factors = _dequantize(self.tensors[_ROPE_FREQS]).tolist()
        for name, key in _LONGROPE_FACTORS.items():
            if name in self.tensors:
                metadata[f"{arch}.{key}"] = _dequantize(self.tensors[name]).tolist()
        return ModelConfig.from_gguf_metadata(metadata, self.tensors.keys(), factors)

    @property
    def architecture(self) -> str:
        return self.reader.fields["general.architecture"].contents()

    @property
    def quantization(self) -> str:
        """llama.cpp's file type, the quantization of most tensors: "Q4_1", "F16"."""
        field = self.reader.fields.get("general.file_type")
        try:
            return LlamaFileType(field.contents()).name.removeprefix("MOSTLY_")
        except (AttributeError, ValueError):
            return "unknown"

    @property
    def interleaved_qk(self) -> bool:
        """llama.cpp permutes the q/k rows of Llama-style models so that RoPE rotates
        interleaved pairs (2i, 2i + 1), not HF's halves (i, i + D/2); not those of Qwen2."""
        return self.arch.gguf_interleaved_qk

    def weights(
        self, num_threads: int = 2, skip: Collection[str] = ()
    ) -> Iterator[tuple[str, Tensor]]:
        """(HF name, float32 tensor) pairs, q/k rows as stored (see `interleaved_qk`),
        without the GGUF tensors named in `skip` (held quantized elsewhere: never
        dequantized).

        Dequantizes on `num_threads` threads (numpy releases the GIL), a few tensors ahead.
        """
        not_weights = {_ROPE_FREQS, *_LONGROPE_FACTORS, *skip}
        tensors = [t for name, t in self.tensors.items() if name not in not_weights]
        pending: deque[tuple[str, Future[np.ndarray]]] = deque()
        with ThreadPoolExecutor(num_threads) as pool:
            for i, t in enumerate(tensors):
                pending.append((t.name, pool.submit(_dequantize, t)))
                while pending and (len(pending) > 2 * num_threads or i == len(tensors) - 1):
                    gguf_name, future = pending.popleft()
                    tensor = torch.from_numpy(future.result())
                    if match := _EXPERTS.match(gguf_name):  # one matrix per expert
                        layer, proj = match[1], match[2]
                        for j, matrix in enumerate(tensor):
                            yield f"model.layers.{layer}.mlp.experts.{j}.{proj}_proj.weight", matrix
                        continue
                    yield hf_name(gguf_name, self.arch.gguf_tensor_names), tensor

    def _num_rows(self, name: str) -> int:
        return int(self.tensors[name].shape[-1])  # GGUF lists dims innermost first


def hf_name(gguf_name: str, extra_names: Mapping[str, str] | None = None) -> str:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; `extra_names`
    are an architecture's own layer tensors ('attn_q_norm' -> 'self_attn.q_norm')."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _TOP_LEVEL_NAMES:
        return f"{_TOP_LEVEL_NAMES[stem]}.{kind}"
    _prefix, layer, part = stem.split(".", 2) if stem.startswith("blk.") else ("", "", stem)
    names = {**_LAYER_NAMES, **(extra_names or {})}
    if part not in names:
        raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")
    return f"model.layers.{layer}.{names[part]}.{kind}"


def float_tensor(tensor: ReaderTensor) -> Tensor:
    """A GGUF tensor dequantized to float32, dims outermost first, as `weights` yields it."""
    return torch.from_numpy(_dequantize(tensor))


def _dequantize(tensor: ReaderTensor) -> np.ndarray:
    shape = tuple(int(d) for d in reversed(tensor.shape))  # outermost first, as torch
    array = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    if array.dtype != np.float32 or not array.flags.writeable:  # e.g. F32 data is the mmap
        array = array.astype(np.float32)
    return array
