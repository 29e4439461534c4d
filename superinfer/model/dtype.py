"""`--dtype`, resolved to a torch dtype as vLLM resolves it.

`auto` keeps the checkpoint's own dtype where the device computes it natively; a float32
checkpoint, one that states no dtype (a GGUF file), or one the device cannot compute is
run in the device's preferred dtype: bfloat16 where it is native (GPUs from Ampere on,
CPUs with AVX512-BF16 or AMX), else float16 on a GPU and float32 on a CPU. An AWQ or GPTQ
checkpoint (stated float16, the dtype of the kernels it was made for) runs in bfloat16
where that is native: PyTorch's int4 kernels, which run it here, compute in bfloat16.
"""

from __future__ import annotations

import json
import os

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, model_path: str | None, device: torch.device) -> torch.dtype:
    """The dtype `name` (a `ModelConfig.dtype`) means for this checkpoint on `device`."""
    if name != "auto":
        return DTYPES[name]
    supported = supported_dtypes(device)
    stated = checkpoint_dtype(model_path)
    if stated == torch.float16 and _is_int4_checkpoint(model_path):
        stated = torch.bfloat16
    if stated is not None and stated != torch.float32 and stated in supported:
        return stated
    return supported[0]


def supported_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """The dtypes `device` computes natively, the preferred one first."""
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.bfloat16, torch.float16, torch.float32
        return torch.float16, torch.float32
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16, torch.float32
    return (torch.float32,)


def _is_int4_checkpoint(model_path: str) -> bool:
    config = _read_config(model_path) or {}
    method = (config.get("quantization_config") or {}).get("quant_method")
    return str(method).lower() in ("awq", "gptq")


def _read_config(model_path: str | None) -> dict | None:
    if model_path is None:
        return None
    config_path = os.path.join(os.path.expanduser(model_path), "config.json")
    if not os.path.isfile(config_path):
        return None
    with open(config_path) as f:
        return json.load(f)


def checkpoint_dtype(model_path: str | None) -> torch.dtype | None:
    """The dtype a Hugging Face directory's config.json states (`torch_dtype` or `dtype`);
    None for a GGUF file (quantized or not, it states none we follow) or an unknown one."""
    config = _read_config(model_path)
    if config is None:
        return None
    stated = config.get("torch_dtype") or config.get("dtype")
    return DTYPES.get(str(stated).removeprefix("torch."))
