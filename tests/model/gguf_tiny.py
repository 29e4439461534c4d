"""Write a tiny transformers model as a GGUF file with the `gguf` package's own writer,
named and laid out as llama.cpp's converter does (q/k rows permuted for Llama)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, RopeScalingType
from gguf.quants import quantize

from superinfer.model import gguf_checkpoint
from superinfer.model.weights import interleave_rope_rows
from tests.model.tiny import PROMPT

_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
}  # fmt: skip
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
# llama.cpp's gemma3 names for the sandwich norms (its `ffn_norm` is the pre-MLP norm), and
# its converter's shift of every Gemma norm weight (it stores 1 + weight)
_GEMMA_NAMES = {"post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}  # fmt: skip
_QWEN2_MOE_NAMES = {"mlp.shared_expert_gate": "ffn_gate_inp_shexp",
                    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
                    "mlp.shared_expert.up_proj": "ffn_up_shexp",
                    "mlp.shared_expert.down_proj": "ffn_down_shexp"}  # fmt: skip
_ARCH_NAMES = {"gemma2": _GEMMA_NAMES, "gemma3": _GEMMA_NAMES, "qwen2moe": _QWEN2_MOE_NAMES,
               "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}}  # fmt: skip
_NORM_SHIFT = {"gemma2": 1.0, "gemma3": 1.0}


Q4_K = GGMLQuantizationType.Q4_K
Q6_K = GGMLQuantizationType.Q6_K


def quantize_q4_k(data: np.ndarray) -> np.ndarray:
    """(N, K) float32 -> (N, K / 256 * 144) bytes of Q4_K super-blocks, laid out as
    llama.cpp's block_q4_K (gguf-py reads them but does not write them): fp16 d and dmin;
    per block of 32 a 6-bit scale sc and min m (w = d sc q - dmin m), packed in 12 bytes;
    then the 4-bit values, blocks 2i and 2i + 1 in the low and high nibbles of 32 bytes.
    Scales and mins by each block's min and max (not llama.cpp's error search)."""
    num_rows = data.shape[0]
    x = data.astype(np.float32).reshape(-1, 8, 32)  # (super-blocks, blocks, 32)
    lo = np.minimum(x.min(-1), 0)
    block_scale = (x.max(-1) - lo) / 15
    d = (block_scale.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (-lo.min(-1, keepdims=True) / 63).astype(np.float16)
    sc = np.clip(np.round(block_scale / np.maximum(d.astype(np.float32), 1e-12)), 1, 63)
    m = np.clip(np.round(-lo / np.maximum(dmin.astype(np.float32), 1e-12)), 0, 63)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    step = d.astype(np.float32) * sc
    offset = dmin.astype(np.float32) * m
    q = np.clip(np.round((x + offset[..., None]) / np.maximum(step, 1e-12)[..., None]), 0, 15)
    q = q.astype(np.uint8).reshape(-1, 4, 2, 32)
    scales = np.concatenate([
        (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4),
    ], 1)  # fmt: skip
    qs = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], 1)
    return blocks.reshape(num_rows, -1)


def q6_k_quants(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, K) float32 -> Q6_K's numbers per super-block of 256: d (n, 1) fp16, scales sc
    (n, 16) int8, values q (n, 256) in 0..63, w = d sc (q - 32). Each block of 16 takes the
    step max |x| / 31, rounded up to a multiple of d = the largest step / 127: |x| / (d sc)
    stays within 31 (its fp16 rounding aside), so nothing is clipped and the error is at
    most half a step (not llama.cpp's error search)."""
    x = data.astype(np.float32).reshape(-1, 16, 16)  # (super-blocks, blocks, 16)
    step = np.abs(x).max(-1) / 31
    d = (step.max(-1, keepdims=True) / 127).astype(np.float16)
    d32 = d.astype(np.float32)
    sc = np.minimum(np.ceil(np.divide(step, d32, out=np.zeros_like(step), where=d32 > 0)), 127)
    scale = (d32 * sc)[..., None]
    q = np.divide(x, scale, out=np.zeros_like(x), where=scale > 0)
    q = np.clip(np.round(q), -32, 31) + 32
    return d, sc.astype(np.int8), q.astype(np.uint8).reshape(-1, 256)


def pack_q6_k(d: np.ndarray, sc: np.ndarray, q: np.ndarray) -> np.ndarray:
    """`q6_k_quants`' numbers as llama.cpp's block_q6_K, 210 bytes a super-block: ql (128
    bytes: in each half of 128 weights, weight 32 i + j's low 4 bits in nibble i // 2 of
    byte 64 h + 32 (i % 2) + j), qh (64: its high 2 bits in bits 2 i of byte 32 h + j),
    the 16 int8 scales, fp16 d."""
    halves = q.reshape(-1, 2, 4, 32)  # (n, h, i, j)
    low, high = halves & 15, halves >> 4
    ql = low[:, :, :2].reshape(-1, 2, 64) | (low[:, :, 2:].reshape(-1, 2, 64) << 4)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    parts = [ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d.view(np.uint8)]
    return np.concatenate(parts, 1)


def quantize_q6_k(data: np.ndarray) -> np.ndarray:
    """(N, K) float32 -> (N, K / 256 * 210) bytes of Q6_K super-blocks (gguf-py reads them
    but does not write them)."""
    return pack_q6_k(*q6_k_quants(data)).reshape(data.shape[0], -1)


def q4_k_m_types(num_layers: int, is_tied: bool) -> dict[str, GGMLQuantizationType]:
    """The tensors llama.cpp's Q4_K_M writes as Q6_K (the others Q4_K), for `write_gguf`'s
    `types`: the output head (the embedding where it is tied), and attn_v and ffn_down of
    its `use_more_bits` layers (the first and last eighth, every third between)."""
    types = {"token_embd.weight" if is_tied else "output.weight": Q6_K}
    eighth = num_layers // 8
    for i in range(num_layers):
        if i < eighth or i >= 7 * num_layers // 8 or (i - eighth) % 3 == 2:
            types[f"blk.{i}.attn_v.weight"] = types[f"blk.{i}.ffn_down.weight"] = Q6_K
    return types


def tiny_gemma3_gguf_config(vocab_size: int = 128):
    """A tiny Gemma 3 as llama.cpp's gemma3 can hold it: five local layers then a global
    one, a query scale of 1/sqrt(head_dim), local RoPE base 10,000; the global layers'
    RoPE with linear scaling; a window (8) shorter than the test sequences."""
    from transformers import Gemma3TextConfig

    from tests.model.tiny import TINY

    return Gemma3TextConfig(
        **{**TINY, "vocab_size": vocab_size, "num_hidden_layers": 6, "head_dim": 16},
        sliding_window=8, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        query_pre_attn_scalar=16,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )  # fmt: skip


def tiny_gemma2_gguf_config(vocab_size: int = 128):
    """A tiny Gemma 2 as llama.cpp's gemma2 can hold it: local and global layers in turn,
    a query scale of 1/sqrt(head_dim); soft-capped attention and final logits."""
    from transformers import Gemma2Config

    from tests.model.tiny import TINY

    return Gemma2Config(
        **{**TINY, "vocab_size": vocab_size, "num_hidden_layers": 4, "head_dim": 16},
        sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2,
        query_pre_attn_scalar=16, attn_logit_softcapping=3.0, final_logit_softcapping=4.0,
    )  # fmt: skip


def tiny_qwen3_moe_gguf_config(vocab_size: int = 128, **overrides):
    """A tiny Qwen3-MoE as llama.cpp's qwen3moe runs it: every layer's MLP routed,
    top-k weights renormalised; `overrides` change the config's fields."""
    from transformers import Qwen3MoeConfig

    from tests.model.tiny import TINY

    fields = {**TINY, "vocab_size": vocab_size, "head_dim": 16, "num_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 48, "norm_topk_prob": True}  # fmt: skip
    return Qwen3MoeConfig(**{**fields, **overrides})


def tiny_qwen2_moe_gguf_config(vocab_size: int = 128, **overrides):
    """A tiny Qwen2-MoE as llama.cpp's qwen2moe runs it: every layer's MLP routed, top-k
    weights as the router gives them, a gated shared expert; `overrides` change the
    config's fields."""
    from transformers import Qwen2MoeConfig

    from tests.model.tiny import TINY

    fields = {**TINY, "vocab_size": vocab_size, "num_experts": 4, "num_experts_per_tok": 2,
              "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96,
              "decoder_sparse_step": 1, "mlp_only_layers": [],
              "norm_topk_prob": False}  # fmt: skip
    return Qwen2MoeConfig(**{**fields, **overrides})


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    stem, _, kind = hf_name.rpartition(".")
    if stem in _TOP:
        return f"{_TOP[stem]}.{kind}"
    _, _, layer, part = stem.split(".", 3)
    return f"blk.{layer}.{({**_NAMES, **_ARCH_NAMES.get(arch, {})})[part]}.{kind}"


def write_gguf(
    model,
    path: Path,
    arch: str,
    qtype: GGMLQuantizationType,
    configure: Callable[[GGUFWriter], None] | None = None,
    *,
    expert_qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    types: Mapping[str, GGMLQuantizationType] | None = None,
) -> Path:
    """Matrices in `qtype` (F32 for the rest), as llama.cpp would convert `model`, but those
    `types` names (GGUF names: `q4_k_m_types`) in their own; `configure` may add metadata
    (a tokenizer, for llama.cpp) before the file is written. The stacked experts are in
    `expert_qtype` (or their own in `types`), each projection whose rows do not divide into
    its blocks in F32."""
    c = model.config
    writer = GGUFWriter(str(path), arch)
    if configure is not None:
        configure(writer)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_embedding_length(c.hidden_size)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(c.num_key_value_heads)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads  # Phi-3
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_context_length(c.max_position_embeddings)
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)  # per layer type: Gemma 3
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    rotary_dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(rotary_dim)
    if rope.get("rope_type") == "longrope":  # as llama.cpp's converter writes Phi-3's
        original = rope["original_max_position_embeddings"]
        scale = c.max_position_embeddings / original
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        )
        for kind in ("long", "short"):
            factors = np.array(rope[f"{kind}_factor"], dtype=np.float32)
            writer.add_tensor(f"rope_factors_{kind}.weight", factors)
    if getattr(c, "sliding_window", None) and arch in ("gemma2", "gemma3"):
        writer.add_sliding_window(c.sliding_window)
    if getattr(c, "attn_logit_softcapping", None):
        writer.add_attn_logit_softcapping(c.attn_logit_softcapping)
    if getattr(c, "final_logit_softcapping", None):
        writer.add_final_logit_softcapping(c.final_logit_softcapping)
    num_experts = getattr(c, "num_local_experts", None) or getattr(c, "num_experts", None)
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(c.num_experts_per_tok)
        if getattr(c, "moe_intermediate_size", None):
            writer.add_expert_feed_forward_length(c.moe_intermediate_size)
        if getattr(c, "shared_expert_intermediate_size", None):
            writer.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_vocab_size(c.vocab_size)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if ".mlp.experts." in name:  # llama.cpp stacks the experts: (experts, rows, cols)
            layer = name.split(".")[2]
            parts = tensor.chunk(2, 1) if name.endswith("gate_up_proj") else (tensor,)
            projs = ("gate", "up") if len(parts) == 2 else ("down",)
            for proj, part in zip(projs, parts):
                data = np.ascontiguousarray(part.float().numpy())
                stacked = f"blk.{layer}.ffn_{proj}_exps.weight"
                _add_stacked(writer, stacked, data, (types or {}).get(stacked, expert_qtype))
            continue
        data = tensor.float().numpy()
        if arch == "llama" and ("q_proj" in name or "k_proj" in name):
            data = interleave_rope_rows(tensor.float(), head_dim).numpy()
        if name.endswith("norm.weight"):
            data = data + _NORM_SHIFT.get(arch, 0.0)
        if name.endswith("shared_expert_gate.weight"):  # llama.cpp's: a vector, float32
            data = data[0]
        if data.ndim == 2:
            kind = (types or {}).get(gguf_name(name, arch), qtype)
            writer.add_tensor(gguf_name(name, arch), _quantized(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(name, arch), np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_stacked(writer: GGUFWriter, name: str, data: np.ndarray, qtype) -> None:
    """(experts, rows, columns) float32 in `qtype`, or F32 where the columns do not divide
    into its blocks (as llama.cpp's converter falls back)."""
    block = GGML_QUANT_SIZES[qtype][0]
    if qtype == GGMLQuantizationType.F32 or data.shape[-1] % block:
        writer.add_tensor(name, data)
        return
    flat = _quantized(data.reshape(-1, data.shape[-1]), qtype)
    blocks = flat.reshape(*data.shape[:2], -1)
    writer.add_tensor(name, blocks, raw_dtype=qtype)


def _quantized(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """A matrix's GGUF bytes: the types gguf-py cannot write by this module's packers."""
    packers = {Q4_K: quantize_q4_k, Q6_K: quantize_q6_k}
    return packers[qtype](data) if qtype in packers else quantize(data, qtype)


# prompts of mixed lengths (token ids of the tiny word-level vocabularies)
MIXED_PROMPTS = [PROMPT, PROMPT[:3],
                 [1, 9, 4, 77, 31, 100, 6, 52, 14, 88, 23, 45, 67, 12, 80, 3, 39, 111, 27, 59, 7],
                 [1, 50, 75, 19, 101, 36, 44]]  # fmt: skip


def engine_greedy(path: Path, tokenizer, monkeypatch, prompts: list[list[int]],
                  num_tokens: int = 12):  # fmt: skip
    """The engine's greedy tokens for `prompts` on the GGUF at `path` (auto: bfloat16,
    quantized), batched and chunked (prefill chunks of up to 16 tokens, 64 blocks of 4),
    and the loaded checkpoint's info. A tiny GGUF holds no tokenizer: `tokenizer` stands in."""
    from superinfer import LLM, SamplingParams
    from superinfer.model import loader

    monkeypatch.setattr(loader, "load_tokenizer", lambda _path: tokenizer)
    llm = LLM(str(path), dtype="bfloat16", device="cpu", quantization="auto", block_size=4,
              num_device_blocks=64, max_model_len=64, max_num_batched_tokens=16)  # fmt: skip
    try:
        params = SamplingParams(max_tokens=num_tokens, min_tokens=num_tokens, temperature=0.0)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return [list(o.outputs[0].token_ids) for o in outputs], llm.engine.checkpoint
    finally:
        llm.engine.close()


def recorded_dequantizations(monkeypatch) -> list[str]:
    """The names of the GGUF tensors the loader dequantizes from now on, in a list that
    grows as it does (`monkeypatch` undoes the recording after the test)."""
    names: list[str] = []
    original = gguf_checkpoint._dequantize

    def recording(tensor):
        names.append(tensor.name)
        return original(tensor)

    monkeypatch.setattr(gguf_checkpoint, "_dequantize", recording)
    return names
