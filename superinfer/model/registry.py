"""The architectures superinfer runs, one entry per Hugging Face `architectures` name.

Each architecture family is one module of `superinfer.model.families` that registers its
entries here: how its config maps onto `ModelConfig`, how its checkpoint names map onto the
shared decoder's weights (safetensors and, where llama.cpp converts it, GGUF), and which
layer variants it turns on. The loader, the simulator's profiles and docs/models.md read
this table; nothing else knows the list.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from superinfer.model.config import ModelConfig

if TYPE_CHECKING:  # torch-free at run time: the simulator reads this table
    from torch import Tensor

HFConfigFn = Callable[[Mapping[str, Any]], ModelConfig]
GGUFConfigFn = Callable[[Mapping[str, Any], Collection[str], Sequence[float] | None], ModelConfig]
WeightsFn = Callable[[Iterable[tuple[str, "Tensor"]], ModelConfig], Iterable[tuple[str, "Tensor"]]]


@dataclass(frozen=True)
class Architecture:
    """One entry of the registry (see the module docstring)."""

    name: str  # HF `architectures[0]`, e.g. "Qwen3ForCausalLM"
    family: str  # the module under superinfer.model.families
    model_types: tuple[str, ...]  # HF `model_type` values it covers
    hf_config: HFConfigFn
    # checkpoint names -> the canonical HF names of the shared decoder (identity by default)
    hf_weights: WeightsFn | None = None
    gguf_arch: str | None = None  # llama.cpp's `general.architecture`, where supported
    gguf_config: GGUFConfigFn | None = None
    gguf_tensor_names: Mapping[str, str] = field(default_factory=dict)  # extra layer tensors
    gguf_interleaved_qk: bool = False  # llama.cpp permuted q/k rows for interleaved RoPE
    features: str = ""  # what differs from Llama, for the docs
    tested: str = ""  # what the tests check, for the docs


_ARCHITECTURES: dict[str, Architecture] = {}


def register(arch: Architecture) -> Architecture:
    if arch.name in _ARCHITECTURES:
        raise ValueError(f"architecture {arch.name!r} registered twice")
    _ARCHITECTURES[arch.name] = arch
    return arch


def architectures() -> dict[str, Architecture]:
    """Every registered architecture by HF name, in registration order."""
    _load_families()
    return dict(_ARCHITECTURES)


def hf_architecture(cfg: Mapping[str, Any]) -> Architecture:
    """The entry for a `config.json`: by `architectures`, else by `model_type`."""
    known = architectures()
    names = cfg.get("architectures") or []
    for name in names:
        if name in known:
            return known[name]
    if not names:
        for arch in known.values():
            if cfg.get("model_type") in arch.model_types:
                return arch
    label = names[0] if names else cfg.get("model_type")
    raise ValueError(
        f"unsupported architecture {label!r}; supported: {', '.join(known)} (docs/models.md)"
    )


def gguf_architecture(gguf_arch: str | None) -> Architecture:
    """The entry for a GGUF file's `general.architecture`."""
    known = {a.gguf_arch: a for a in architectures().values() if a.gguf_arch}
    if gguf_arch not in known:
        raise ValueError(
            f"unsupported GGUF architecture {gguf_arch!r}; supported: {', '.join(known)} "
            "(docs/models.md)"
        )
    return known[gguf_arch]


def _load_families() -> None:
    import superinfer.model.families  # noqa: F401  (registers on import)
