"""Vision-language checkpoints served as their language model (text only): Gemma 3 from
4B up, Mistral 3, Qwen2-VL and Qwen2.5-VL. Their config nests the decoder's under `text_config` and their weights
name it under a prefix, beside a vision tower and a projector that are not loaded. Torch-free,
as the registry that reads it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from superinfer.model.config import ModelConfig


def vl_text_config(cfg: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """The language model's config of a vision-language checkpoint (served text only): its
    `text_config`, completed with the defaults of transformers' own config class for its
    `model_type` (`model_type` if unstated), which checkpoints rely on for what they leave
    out; the end-of-sequence ids and the embedding tie the outer config states (transformers
    5 ties a composite model's lm_head by the outer flag)."""
    from transformers import AutoConfig

    text = dict(cfg.get("text_config") or {})
    full = AutoConfig.for_model(text.pop("model_type", model_type), **text).to_dict()
    outer = {k: cfg[k] for k in ("eos_token_id", "bos_token_id", "tie_word_embeddings")
             if cfg.get(k) is not None}  # fmt: skip
    return {**full, **outer, "architectures": cfg.get("architectures")}


# a vision-language checkpoint's language model (llava-style: Gemma 3, Mistral 3; Qwen-VL's
# is already model.*), as transformers 4.x and 5.x save it, or under 5.x's module names;
# the vision tower and the projector are not loaded (text only)
_VL_TEXT_PREFIXES = ("language_model.model.", "model.language_model.")
_VL_LM_HEAD = "language_model.lm_head."  # transformers 4.x; 5.x's is lm_head already
_VL_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                       "model.multi_modal_projector.", "visual.", "model.visual.")  # fmt: skip


def vl_text_weights(
    weights: Iterable[tuple[str, Tensor]], config: ModelConfig
) -> Iterator[tuple[str, Tensor]]:
    """A vision-language checkpoint's language-model weights under the decoder's names;
    the vision tower's are dropped as they stream past."""
    for name, tensor in weights:
        if name.startswith(_VL_VISION_PREFIXES):
            continue
        for prefix in _VL_TEXT_PREFIXES:
            if name.startswith(prefix):
                name = "model." + name.removeprefix(prefix)
        if name.startswith(_VL_LM_HEAD):
            name = "lm_head." + name.removeprefix(_VL_LM_HEAD)
        yield name, tensor
