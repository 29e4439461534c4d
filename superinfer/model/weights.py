"""Copy a checkpoint under canonical Hugging Face names into a DecoderForCausalLM, fusing
q/k/v, gate/up and the experts' projections.

Canonical names are those of transformers' Llama, plus `self_attn.{q,k}_norm`, the
sandwich norms (`pre_`/`post_feedforward_layernorm`), the router `mlp.gate` and
`mlp.experts.{j}.{gate,up,down}_proj`; a family whose checkpoints differ renames them first
(`Architecture.hf_weights`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from superinfer.model.decoder import DecoderForCausalLM

# Hugging Face projection name -> (fused parameter, index of its part)
_FUSED_PARTS = {
    "q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}  # fmt: skip
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_ROTATED = ("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
            "q_norm.weight", "k_norm.weight")  # fmt: skip

Part = tuple[int, ...]  # (part of a fused projection) or (expert, part)


def load_hf_weights(
    model: DecoderForCausalLM,
    weights: Iterable[tuple[str, Tensor]],
    interleaved_qk: bool = False,
    held: Collection[str] = (),
) -> None:
    """Copy `weights` (name, tensor) into `model`; raise ValueError on a missing, unknown or
    misshapen weight. The parameters named in `held` already hold their values (those of
    modules swapped in before loading): they are neither expected nor accepted.

    RoPE rotates pairs of q/k dims: halves (i, i + D/2) of each head in HF checkpoints,
    interleaved (2i, 2i + 1) in llama.cpp's GGUF files (`interleaved_qk`) and in this model,
    so HF q/k rows (and q/k norm weights) are reordered on the way in.
    """
    config = model.config
    params = {name: p for name, p in model.named_parameters() if name not in held}
    loaded: set[tuple[str, Part]] = set()
    for name, tensor in weights:
        if "rotary_emb" in name or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        if name.endswith(_ROTATED) and not interleaved_qk:
            tensor = interleave_rope_rows(tensor, config.head_dim, config.rotary_dim)
        loaded.add(_load_one(model, params, name, tensor))
    missing = sorted(str(p) for p in _expected_parts(model, params) - loaded)
    if missing:
        raise ValueError(f"checkpoint lacks weights for {missing[:8]} ({len(missing)} in all)")


def interleave_rope_rows(w: Tensor, head_dim: int, rotary_dim: int | None = None) -> Tensor:
    """Reorder q/k projection rows (or bias, or norm weight) from rotate-half pairs
    (i, i + R/2) of each head's first R = `rotary_dim` (default all) rows to interleaved
    pairs (2i, 2i + 1); the rows past R stay where they are."""
    rotary_dim = rotary_dim or head_dim
    if rotary_dim == head_dim:
        heads = w.reshape(-1, 2, head_dim // 2, *w.shape[1:])  # (n, 2, D/2, ...)
        return heads.transpose(1, 2).reshape(w.shape)
    heads = w.reshape(-1, head_dim, *w.shape[1:])  # (n, D, ...)
    rotated = interleave_rope_rows(heads[:, :rotary_dim].reshape(-1, *w.shape[1:]), rotary_dim)
    return torch.cat([rotated.view(heads.shape[0], rotary_dim, *w.shape[1:]),
                      heads[:, rotary_dim:]], 1).reshape(w.shape)  # fmt: skip


def parameter_part(name: str) -> tuple[str, Part]:
    """The parameter a canonical checkpoint name goes to, and which part of it."""
    if match := _EXPERT.match(name):
        prefix, expert, proj = match[1], int(match[2]), match[3]
        if proj == "down_proj":
            return f"{prefix}.down_proj", (expert,)
        return f"{prefix}.gate_up_proj", (expert, _FUSED_PARTS[proj][1])
    module, _, kind = name.rpartition(".")  # kind: weight or bias
    parent, _, proj = module.rpartition(".")
    if proj in _FUSED_PARTS and not parent.endswith(".experts"):
        fused, part = _FUSED_PARTS[proj]
        return f"{parent}.{fused}.{kind}", (part,)
    return name, ()


def _load_one(
    model: DecoderForCausalLM, params: dict[str, nn.Parameter], name: str, tensor: Tensor
) -> tuple[str, Part]:
    """Copy one checkpoint tensor; returns (parameter name, part of a fused parameter)."""
    target, part = parameter_part(name)
    if target not in params:
        raise ValueError(f"unexpected weight {name!r} for {model.config.architecture}")
    param = params[target]
    dest = _part_view(model, target, param.data, part)
    if dest.shape != tensor.shape:
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, "
                         f"expected {tuple(dest.shape)}")  # fmt: skip
    if dest.shape == param.shape and _adoptable(tensor, param):
        param.data = tensor  # no copy into fresh memory
    else:
        dest.copy_(tensor)
    return target, part


def _part_view(model: DecoderForCausalLM, target: str, data: Tensor, part: Part) -> Tensor:
    """The rows of a fused parameter that hold `part`."""
    if target.endswith("experts.down_proj"):
        return data[part[0]]
    if target.endswith("experts.gate_up_proj"):
        data, part = data[part[0]], part[1:]
    if not part:
        return data
    sizes = _part_sizes(model, target)
    start = sum(sizes[: part[0]])
    return data[start : start + sizes[part[0]]]


def _part_sizes(model: DecoderForCausalLM, target: str) -> list[int]:
    c = model.config
    if ".qkv_proj." in target:
        return [c.num_heads * c.head_dim] + [c.num_kv_heads * c.head_dim] * 2
    if target.endswith("experts.gate_up_proj"):
        return [c.moe_intermediate_size] * 2
    return [model.get_parameter(target).shape[0] // 2] * 2  # a gate_up_proj: halves


def _expected_parts(
    model: DecoderForCausalLM, params: dict[str, nn.Parameter]
) -> set[tuple[str, Part]]:
    num_experts = model.config.num_experts
    expected: set[tuple[str, Part]] = set()
    for name in params:
        if name.endswith("experts.down_proj"):
            expected |= {(name, (e,)) for e in range(num_experts)}
        elif name.endswith("experts.gate_up_proj"):
            expected |= {(name, (e, i)) for e in range(num_experts) for i in range(2)}
        elif ".qkv_proj." in name:
            expected |= {(name, (i,)) for i in range(3)}
        elif ".gate_up_proj." in name:
            expected |= {(name, (i,)) for i in range(2)}
        else:
            expected.add((name, ()))
    return expected


def _adoptable(tensor: Tensor, param: Tensor) -> bool:
    """Whether `tensor` can become the parameter's storage as is."""
    return (tensor.dtype == param.dtype and tensor.device == param.device
            and tensor.is_contiguous())  # fmt: skip
