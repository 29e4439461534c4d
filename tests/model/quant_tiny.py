"""Tiny AWQ, GPTQ and FP8 checkpoints made from a tiny random model, each beside a plain
checkpoint of the weights it stands for (its exact dequantization), for transformers.

The packers follow the formats as AutoAWQ and AutoGPTQ write them (and vLLM's
`awq_pack` / `gptq_pack` test helpers): AWQ puts eight outputs in an int32, nibble i
holding output AWQ_ORDER[i]; GPTQ puts eight inputs in an int32, in order, and eight
outputs per int32 in its zeros, which its v1 format stores minus one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor
from transformers import LlamaConfig, PretrainedConfig, Qwen2Config

from tests.model.tiny import TINY, save_tiny

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # fmt: skip


def tiny_quant_config() -> LlamaConfig:
    """Widths that groups of 32, 64 and whole rows all divide."""
    return LlamaConfig(**{**TINY, "intermediate_size": 128}, tie_word_embeddings=False)


def tiny_quant_qwen2_config() -> Qwen2Config:
    """Qwen2 (q/k/v biases, tied embeddings) in the same widths."""
    return Qwen2Config(**{**TINY, "intermediate_size": 128}, tie_word_embeddings=True)


def quantize_groups(
    w: Tensor, group_size: int, min_zero: int = 0, is_symmetric: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """4-bit groups along the inputs of w (N, K): q (K, N), z (G, N) int32, s (G, N)
    float16. Asymmetric (zeros from `min_zero`: GPTQ v1 cannot store 0) or symmetric
    (z = 8, GPTQ's `sym`)."""
    num_rows, num_inputs = w.shape
    size = num_inputs if group_size == -1 else group_size
    wg = w.t().reshape(num_inputs // size, size, num_rows)
    lo, hi = wg.amin(1), wg.amax(1)
    if is_symmetric:
        s = (torch.maximum(-lo, hi) / 7).clamp(min=1e-4).half()
        z = torch.full_like(lo, 8.0)
    else:
        s = ((hi - lo) / 15).clamp(min=1e-4).half()
        z = torch.round(-lo / s.float()).clamp(min_zero, 15)
    q = (torch.round(wg / s.float().unsqueeze(1)) + z.unsqueeze(1)).clamp(0, 15)
    return q.reshape(num_inputs, num_rows).int(), z.int(), s


def dequantize_groups(q: Tensor, z: Tensor, s: Tensor, groups: Tensor) -> Tensor:
    """The (N, K) float32 weight w[n, k] = (q[k, n] - z[g[k], n]) s[g[k], n]."""
    return ((q.float() - z[groups].float()) * s[groups].float()).t().contiguous()


def _to_int32(packed: Tensor) -> Tensor:
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32).contiguous()


def pack_columns(v: Tensor, order: tuple[int, ...] = tuple(range(8))) -> Tensor:
    """(R, N) nibbles -> (R, N / 8) int32, nibble i holding column 8 c + order[i]."""
    cols = v.long().reshape(v.shape[0], -1, 8)[..., list(order)]
    return _to_int32(sum(cols[..., i] << (4 * i) for i in range(8)))


def pack_rows(v: Tensor) -> Tensor:
    """(K, N) nibbles -> (K / 8, N) int32, nibble i of row r holding row 8 r + i."""
    rows = v.long().reshape(-1, 8, v.shape[1])
    return _to_int32(sum(rows[:, i] << (4 * i) for i in range(8)))


def int4_tensors(
    w: Tensor,
    method: str,
    group_size: int,
    groups: Tensor | None = None,
    is_symmetric: bool = False,
) -> tuple[dict[str, Tensor], Tensor]:
    """A layer's checkpoint tensors in `method` ("awq", "gptq" v1, "gptq_v2"), and the
    weight they stand for. `groups` (GPTQ act-order): each input's group, any order."""
    num_inputs, min_zero = w.shape[1], int(method == "gptq")
    if groups is None:
        q, z, s = quantize_groups(w, group_size, min_zero, is_symmetric)
        size = num_inputs if group_size == -1 else group_size
        groups = torch.arange(num_inputs) // size
    else:  # quantize inputs grouped by `groups`: permute them together, then back
        perm = torch.argsort(groups, stable=True)
        q, z, s = quantize_groups(w[:, perm], group_size, min_zero)
        q = q[torch.argsort(perm)]
    reference = dequantize_groups(q, z, s, groups)
    if method == "awq":
        tensors = {"qweight": pack_columns(q, AWQ_ORDER), "qzeros": pack_columns(z, AWQ_ORDER)}
    else:
        stored = z - 1 if method == "gptq" else z
        tensors = {"qweight": pack_rows(q), "qzeros": pack_columns(stored),
                   "g_idx": groups.to(torch.int32)}  # fmt: skip
    return {**tensors, "scales": s}, reference


def fp8_tensors(
    w: Tensor, per_channel: bool, is_static: bool, block: int | None = None
) -> tuple[dict[str, Tensor], Tensor]:
    """An FP8 layer's tensors (per-tensor or per-channel scale, optional static input
    scale, or block scales) and the weight they stand for."""
    if block is not None:
        blocks = w.reshape(w.shape[0] // block, block, w.shape[1] // block, block)
        scale = blocks.abs().amax((1, 3)) / 448
        full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
        weight = (w / full).to(torch.float8_e4m3fn)
        return {"weight": weight, "weight_scale_inv": scale}, weight.float() * full
    scale = w.abs().amax(1, keepdim=True) / 448 if per_channel else w.abs().amax() / 448
    weight = (w / scale).to(torch.float8_e4m3fn)
    tensors = {"weight": weight, "weight_scale": scale.float()}
    if is_static:
        tensors["input_scale"] = torch.tensor(0.02)
    return tensors, weight.float() * scale


def save_quantized(
    directory: Path,
    method: str,
    quantization_config: dict,
    make_layer,
    seed: int = 3,
    config: PretrainedConfig | None = None,
) -> tuple[Path, Path]:
    """(quantized checkpoint, plain checkpoint of the weights it stands for) of one tiny
    model (`config`, default `tiny_quant_config()`); `make_layer(name, w)` returns a linear
    layer's tensors and its weight (biases stay as they are)."""
    dense_dir = save_tiny(directory / "dense", config or tiny_quant_config(), seed)
    quantized, reference = quantize_checkpoint(dense_dir, make_layer)
    quantized_dir = write_checkpoint(dense_dir, directory / f"{method}-quantized", quantized,
                                     quantization_config)  # fmt: skip
    return quantized_dir, write_checkpoint(dense_dir, directory / f"{method}-reference", reference)


def quantize_checkpoint(source: Path, make_layer) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(quantized tensors, the weights they stand for) of the checkpoint in `source`: each
    decoder linear layer through `make_layer(name, w)`, every other tensor as it is."""
    tensors = {}
    for shard in sorted(source.glob("*.safetensors")):
        tensors.update(load_file(shard))
    quantized, reference = {}, {}
    for name, t in tensors.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.endswith(LINEARS):
            parts, weight = make_layer(module, t)
            quantized.update({f"{module}.{k}": v for k, v in parts.items()})
            reference[name] = weight
        else:
            quantized[name] = reference[name] = t
    return quantized, reference


def write_checkpoint(
    source: Path, path: Path, tensors: dict[str, Tensor], quantization_config: dict | None = None
) -> Path:
    """`tensors` as a checkpoint at `path`, with `source`'s config (plus
    `quantization_config`) and tokenizer files."""
    path.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():  # the tokenizer's files
        if not f.name.startswith(("model", "config")):
            shutil.copy(f, path / f.name)
    config = json.loads((source / "config.json").read_text())
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, path / "model.safetensors")
    return path
