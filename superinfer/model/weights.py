"""Copy a Hugging Face-named checkpoint into a LlamaForCausalLM, fusing q/k/v and gate/up."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from torch import Tensor, nn

if TYPE_CHECKING:
    from superinfer.model.llama import LlamaForCausalLM

# Hugging Face projection name -> (fused parameter, index of its part)
_FUSED_PARTS = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}
_ROTATED = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")


def load_hf_weights(
    model: LlamaForCausalLM, weights: Iterable[tuple[str, Tensor]], interleaved_qk: bool = False
) -> None:
    """Copy `weights` (name, tensor) into `model`; raise ValueError on a missing, unknown or
    misshapen weight.

    RoPE rotates pairs of q/k dims: halves (i, i + D/2) of each head in HF checkpoints,
    interleaved (2i, 2i + 1) in llama.cpp's GGUF files (`interleaved_qk`) and in this model,
    so HF q/k rows are reordered on the way in.
    """
    config = model.config
    params = dict(model.named_parameters())
    loaded: set[tuple[str, int]] = set()
    for name, tensor in weights:
        if "rotary_emb" in name or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        if name.endswith(_ROTATED) and not interleaved_qk:
            tensor = interleave_rope_rows(tensor, config.head_dim)
        loaded.add(_load_one(model, params, name, tensor))
    missing = sorted(str(p) for p in _expected_parts(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint lacks weights for {missing[:8]} ({len(missing)} in all)")


def interleave_rope_rows(w: Tensor, head_dim: int) -> Tensor:
    """Reorder q/k projection rows (or bias) from rotate-half pairs (i, i + D/2) of each head
    to interleaved pairs (2i, 2i + 1)."""
    heads = w.reshape(-1, 2, head_dim // 2, *w.shape[1:])  # (n, 2, D/2, ...)
    return heads.transpose(1, 2).reshape(w.shape)


def _load_one(
    model: LlamaForCausalLM, params: dict[str, nn.Parameter], name: str, tensor: Tensor
) -> tuple[str, int]:
    """Copy one checkpoint tensor; returns (parameter name, part of a fused parameter)."""
    module, _, kind = name.rpartition(".")  # kind: weight or bias
    parent, _, proj = module.rpartition(".")
    target, part = name, 0
    if proj in _FUSED_PARTS:
        fused, part = _FUSED_PARTS[proj]
        target = f"{parent}.{fused}.{kind}"
    if target not in params:
        raise ValueError(f"unexpected weight {name!r} for {type(model).__name__}")
    param, rows = params[target], _part_rows(model, target, part)
    dest = param.data[rows]
    if dest.shape != tensor.shape:
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, "
                         f"expected {tuple(dest.shape)}")
    if dest.shape == param.shape and _adoptable(tensor, param):
        param.data = tensor  # no copy into fresh memory
    else:
        dest.copy_(tensor)
    return target, part


def _part_rows(model: LlamaForCausalLM, target: str, part: int) -> slice:
    """Rows of a fused parameter that hold its `part`-th projection."""
    c = model.config
    if ".qkv_proj." in target:
        sizes = [c.num_heads * c.head_dim] + [c.num_kv_heads * c.head_dim] * 2
    elif ".gate_up_proj." in target:
        sizes = [c.intermediate_size] * 2
    else:
        return slice(None)
    start = sum(sizes[:part])
    return slice(start, start + sizes[part])


def _expected_parts(params: dict[str, nn.Parameter]) -> set[tuple[str, int]]:
    def num_parts(name: str) -> int:
        return 3 if ".qkv_proj." in name else 2 if ".gate_up_proj." in name else 1

    return {(name, part) for name in params for part in range(num_parts(name))}


def _adoptable(tensor: Tensor, param: Tensor) -> bool:
    """Whether `tensor` can become the parameter's storage as is."""
    return (tensor.dtype == param.dtype and tensor.device == param.device
            and tensor.is_contiguous())
