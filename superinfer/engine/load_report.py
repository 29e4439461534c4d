"""What the engine loaded, logged once at info when it is built (vLLM-style startup lines):
the model and its architecture, dtype and quantization, the attention backend and why,
the two KV pools in blocks and tokens, and the scheduler.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from superinfer.engine.kv_cache import bytes_per_block
from superinfer.model.cpu_attention import decode_kernel
from superinfer.model.rotary import longrope_is_long

if TYPE_CHECKING:
    from superinfer.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)


def log_loaded(engine: LLMEngine) -> None:
    """Log the startup summary of a freshly built engine (nothing is computed when info
    lines are not logged)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    for line in (_model_line(engine), _attention_line(engine), _kv_line(engine),
                 _scheduler_line(engine)):  # fmt: skip
        logger.info("%s", line)


def _model_line(engine: LLMEngine) -> str:
    config, mc, info = engine.config.model, engine.model_config, engine.checkpoint
    if info.quantization == "none":
        quantization = "none"
    elif info.num_quantized_linears or info.num_quantized_expert_layers:  # model/quant.py
        embedding = ", the token embedding kept quantized" if info.is_embedding_quantized else ""
        experts = (f" and the experts of {info.num_quantized_expert_layers} MoE layers"
                   if info.num_quantized_expert_layers else "")  # fmt: skip
        kernel = info.kernel or ("on 8-bit activations (gguf-w4a8)"
                                 if config.quantization == "gguf-w4a8" else "int4 kernel")  # fmt: skip
        quantization = (f"{info.quantization} ({info.format}, {info.num_quantized_linears} "
                        f"linear layers{experts} run quantized, {kernel}{embedding}; the rest "
                        f"in {_name(engine.dtype)})")  # fmt: skip
    else:
        why = f"; {info.kernel}" if info.kernel else ""
        quantization = (f"{info.quantization} ({info.format}, dequantized to "
                        f"{_name(engine.dtype)} at load{why})")  # fmt: skip
    return (
        f"Model: {info.path}: architecture {info.architecture}, {mc.num_layers} layers, "
        f"{mc.num_heads} heads ({mc.num_kv_heads} KV) of {mc.head_dim}, vocab {mc.vocab_size}"
        f"{_rope(engine)}; dtype {_name(engine.dtype)} (--dtype {config.dtype}), quantization "
        f"{quantization}, device {engine.device}"
    )


def _rope(engine: LLMEngine) -> str:
    """RoPE where it is not the plain kind over whole heads: its type, the dims it rotates,
    and which of LongRoPE's factors --max-model-len chose (`rotary.longrope_factors`)."""
    mc, scaling = engine.model_config, engine.model_config.rope_scaling or {}
    parts = [f"RoPE {scaling['rope_type']}"] if scaling else []
    if mc.num_rotary_dims < mc.head_dim:
        parts.append(f"RoPE on {mc.num_rotary_dims} of {mc.head_dim} dims")
    if scaling.get("rope_type") == "longrope":
        context = engine.config.scheduler.max_model_len
        is_long = longrope_is_long({**scaling, "context_len": context})
        parts[0] += (f" ({'long' if is_long else 'short'} factors: --max-model-len {context} "
                     f"{'>' if is_long else '<='} the original context "
                     f"{scaling['original_max_position_embeddings']})")  # fmt: skip
    return "".join(f", {p}" for p in parts)


def _attention_line(engine: LLMEngine) -> str:
    graphs = engine.runner.graphs
    captured = (
        "off" if graphs is None else f"{len(graphs.sizes)} decode sizes to {graphs.sizes[-1]}"
    )
    line = f"Attention backend: {_attention_backend(engine)}; CUDA graphs: {captured}"
    if engine.device.type == "cpu":
        flat = engine.runner.model.model.flat_decode is not None and engine.attention.name == "cpu"
        line += f"; flat decode loop (csrc/rotary_decode.c): {'on' if flat else 'off'}"
    return line


def _attention_backend(engine: LLMEngine) -> str:
    """Attention as the chosen backend (`attention_backend.py`) will run it, and why."""
    name = engine.attention.name
    gathered = "torch SDPA over K/V gathered from the paged cache"
    if name == "triton":
        return "triton (one kernel for decode and prefill, reads K/V in place)"
    if name == "reference":
        return f"reference ({gathered}, decode and prefill)"
    kernel = decode_kernel()
    prefill = "torch SDPA"
    if _prefill_kernel_runs(engine):
        prefill = "csrc/paged_prefill.c reads K/V in place"
    if not kernel.supports(engine.kv_tiers.device, engine.model_config.num_heads):
        return (f"cpu: decode {gathered} (the C kernel does not fit this dtype/heads); "
                f"prefill {prefill}")  # fmt: skip
    return f"cpu (decode: csrc/paged_decode.c reads K/V in place; prefill: {prefill})"


def _prefill_kernel_runs(engine: LLMEngine) -> bool:
    """Whether the prefill kernel takes this model's heads and cache dtype on this CPU
    (it declines where it does not: no AVX-512 BF16, a float32 cache), by one tiny call."""
    mc, cache = engine.model_config, engine.kv_tiers.device
    probe = cache.new_zeros(1, 1, 2, cache.shape[3], mc.num_kv_heads, mc.head_dim)
    q = cache.new_zeros(1, mc.num_heads, mc.head_dim)
    table = torch.zeros(1, dtype=torch.long)
    return decode_kernel().prefill(q, probe, 0, table, 0, 0) is not None


def _kv_line(engine: LLMEngine) -> str:
    cache, mc = engine.config.cache, engine.model_config
    block_bytes = bytes_per_block(
        mc.num_layers, cache.block_size, mc.num_kv_heads, mc.head_dim, engine.dtype
    )
    num_device, num_host = engine.kv_tiers.device.shape[0], engine.kv_tiers.host.shape[0]
    max_model_len = engine.config.scheduler.max_model_len
    concurrency = num_device * cache.block_size / max_model_len
    return (
        f"KV cache: device pool {_pool(num_device, cache.block_size, block_bytes)}, host pool "
        f"{_pool(num_host, cache.block_size, block_bytes)}; {cache.block_size} tokens per "
        f"block; maximum concurrency for {max_model_len} tokens per request: {concurrency:.2f}x"
    )


def _pool(num_blocks: int, block_size: int, block_bytes: int) -> str:
    gib = num_blocks * block_bytes / 2**30
    return f"{num_blocks} blocks = {num_blocks * block_size} tokens ({gib:.2f} GiB)"


def _scheduler_line(engine: LLMEngine) -> str:
    config = engine.config
    sched, cache = config.scheduler, config.cache
    return (
        f"Scheduler: policy {engine.scheduler.policy.name}, {sched.max_num_batched_tokens} "
        f"tokens per step, at most {sched.max_num_seqs} running; prefix caching "
        f"{'on' if cache.enable_prefix_caching else 'off'}; KV transfers {cache.transfer_mode}; "
        f"step pipeline {'on' if engine.is_pipelined else 'off'}"
    )


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
