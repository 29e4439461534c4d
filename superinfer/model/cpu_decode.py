"""Decode steps of a plain decoder as one flat loop on the CPU.

A small model's decode step on a CPU is bound by the calls it makes around its matmuls.
Measured on the default model (one sequence, 256 cached tokens): the 30 layers took 6.1 ms
through the modules, 2.7 ms of it in the int4 matmuls; each layer made about forty module
calls, PyTorch ops and checks besides them. `FlatDecode` runs the same arithmetic in nine
calls a layer: the residual add + RMSNorm kernel (`cpu_norm.py`) twice, the four
projections' own `forward`, the activation and its product, and one C call for the
attention: rotary embedding of q and k, the K/V write and paged decode attention
(`csrc/rotary_decode.c`). Its results are the modules' bit for bit
(`tests/model/test_cpu_decode.py`).

It takes plain layers (Llama, Qwen2, SmolLM2, Mistral without a window) and Qwen3's q/k
norms (each head's q and k normed in place in the fused projection by the norm kernel's
`rms_norm_heads`, as the modules norm them, before the C call rotates them); not sandwich
norms, experts, windows or soft-capping. The module path of a Qwen3 decode step costs more
than its matmuls: 0.35 ms a layer of Python and small ops on Qwen3-0.6B's shape. It runs
steps in which every sequence
decodes one token with the cpu attention backend; every other step runs through the
modules. `DecoderForCausalLM.use_flat_decode` turns it on once the weights are final (the
loader does, on CPU); it reads the norms' weights then.
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from superinfer.model.attention import AttentionMetadata
from superinfer.model.cpu_attention import MAX_GROUP, MAX_HEAD_DIM
from superinfer.model.cpu_kernels import KERNEL_DTYPES as _DTYPES
from superinfer.model.cpu_kernels import load_kernel
from superinfer.model.cpu_norm import NormKernel, norm_kernel

if TYPE_CHECKING:
    from superinfer.model.decoder import DecoderModel

_PTR, _INT, _I64, _FLOAT = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float


@functools.cache
def rotary_decode_kernel() -> Callable[..., int] | None:
    """The C `rotary_decode_attention`, or None where the kernels cannot be built here."""

    def bind(library: ctypes.CDLL) -> Callable[..., int]:
        fn = library.rotary_decode_attention
        fn.restype = _INT
        fn.argtypes = ([_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR]
                       + [_INT] * 8 + [_FLOAT, _INT, _PTR, _INT])  # fmt: skip
        return fn

    return load_kernel(bind, "decode", "through the modules")


@dataclass(frozen=True)
class _Layer:
    """What one layer's flat step reads: norm weights as the kernel takes them (float32,
    offset added), and the projections' `forward`s (a quantized, packed or plain linear)."""

    input_norm: Tensor
    post_norm: Tensor
    eps: float  # both norms' (every norm of a model has its config's)
    qkv: Callable[[Tensor], Tensor]
    o: Callable[[Tensor], Tensor]
    gate_up: Callable[[Tensor], Tensor]
    down: Callable[[Tensor], Tensor]
    q_norm: Tensor | None  # Qwen3's per-head norms' weights as the kernel reads them, or None
    k_norm: Tensor | None


class FlatDecode:
    """The layers and final norm of a `DecoderModel` for decode-only CPU steps."""

    def __init__(self, model: DecoderModel, norm: NormKernel, attention: Callable[..., int]):
        first = model.layers[0].self_attn
        self.num_heads, self.num_kv_heads = first.num_heads, first.num_kv_heads
        self.head_dim, self.dtype = first.head_dim, model.norm.weight.dtype
        self.scale = first.scale or 1.0 / math.sqrt(self.head_dim)
        self.gated = model.layers[0].mlp.gated  # act(gate) * up, as every layer's MLP
        self.residual_multiplier = model.layers[0].residual_multiplier  # Granite
        self.norm, self.attention = norm, attention
        self.final_norm, self.final_eps = model.norm.kernel_weight(), model.norm.eps
        self.layers = [
            _Layer(
                layer.input_layernorm.kernel_weight(),
                layer.post_attention_layernorm.kernel_weight(),
                layer.input_layernorm.eps,
                layer.self_attn.qkv_proj.forward,
                layer.self_attn.o_proj.forward,
                layer.mlp.gate_up_proj.forward,
                layer.mlp.down_proj.forward,
                layer.self_attn.q_norm.kernel_weight() if layer.self_attn.qk_norm else None,
                layer.self_attn.k_norm.kernel_weight() if layer.self_attn.qk_norm else None,
            )
            for layer in model.layers
        ]

    @classmethod
    def build(cls, model: DecoderModel) -> tuple[FlatDecode | None, str]:
        """The flat loop for `model`, or None and why it cannot run it."""
        reason = unsupported_reason(model)
        if reason is not None:
            return None, reason
        norm, attention = norm_kernel(), rotary_decode_kernel()
        if norm is None or attention is None:
            return None, "the CPU kernels did not build (no compiler, or SUPERINFER_CPU_KERNELS=0)"
        return cls(model, norm, attention), "decode-only steps run as one flat loop"

    def takes(self, meta: object, kv_cache: Tensor) -> bool:
        """Whether this step is one the loop runs: every sequence decodes one token, with the
        cpu backend (or hand-built metadata), over a contiguous cache of the model's dtype."""
        if not isinstance(meta, AttentionMetadata) or meta.prefills or meta.decode is None:
            return False
        backend = meta.backend
        return (
            (backend is None or getattr(backend, "uses_kernel", False))
            and kv_cache.dtype == self.dtype
            and kv_cache.device.type == "cpu"
            and kv_cache.is_contiguous()
        )

    def __call__(
        self, x: Tensor, rotation: Tensor, kv_cache: Tensor, meta: AttentionMetadata
    ) -> Tensor:
        """x (B, C) embeddings of the step's tokens, rotation (B, 1, D/2) complex -> the final
        norm's output (B, C), as `DecoderModel.forward` returns it; caches K/V as it does."""
        batch, num_seqs = meta.decode, x.shape[0]
        num_blocks, num_layers, _, block_size = kv_cache.shape[:4]
        q_rotated = x.new_empty(num_seqs, self.num_heads, self.head_dim)
        rotation = rotation.contiguous()
        # the attention call's arguments, but for the layer's own (qkv, layer, out)
        before = (rotation.data_ptr(), q_rotated.data_ptr(), kv_cache.data_ptr(),
                  meta.slot_blocks.data_ptr(), meta.slot_offsets.data_ptr(), num_blocks,
                  batch.block_ids.data_ptr(), batch.seq_lens.data_ptr(), num_seqs,
                  batch.block_ids.shape[0] // num_seqs, num_layers)  # fmt: skip
        after = (block_size, self.num_heads, self.num_kv_heads, self.head_dim, self.scale,
                 _DTYPES[self.dtype])  # fmt: skip
        num_threads, num_qk_heads = torch.get_num_threads(), self.num_heads + self.num_kv_heads
        residual, h = x, self.norm(x, None, self.layers[0].input_norm, self.layers[0].eps)
        for i, layer in enumerate(self.layers):
            if i:
                h = self.norm(x, residual, layer.input_norm, layer.eps)
            qkv = layer.qkv(h)
            if layer.q_norm is not None:  # as `Attention.forward` norms them, in place
                qk = qkv[:, : num_qk_heads * self.head_dim].view(num_seqs, num_qk_heads, -1)
                q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
                self.norm.heads(q, layer.q_norm, layer.eps, out=q)
                self.norm.heads(k, layer.k_norm, layer.eps, out=k)
            o = x.new_empty(num_seqs, self.num_heads * self.head_dim)
            status = self.attention(qkv.data_ptr(), qkv.stride(0), *before, i, *after,
                                    o.data_ptr(), num_threads)  # fmt: skip
            if status != 0:
                raise RuntimeError(f"rotary_decode_attention failed with status {status}")
            o = layer.o(o)
            if self.residual_multiplier is not None:  # as `DecoderLayer.forward`
                o.mul_(self.residual_multiplier)
            h = self.norm(o, residual, layer.post_norm, layer.eps)
            x = layer.down(self.gated(layer.gate_up(h)))
            if self.residual_multiplier is not None:
                x.mul_(self.residual_multiplier)
        return self.norm(x, residual, self.final_norm, self.final_eps)


def unsupported_reason(model: DecoderModel) -> str | None:
    """Why the flat loop cannot run `model`'s layers; None when it can."""
    from superinfer.model.decoder import GatedMLP

    if model.norm.weight.device.type != "cpu":
        return f"the flat loop runs on a CPU, not on {model.norm.weight.device}"
    if model.norm.weight.dtype not in _DTYPES:
        return f"the CPU kernels take float32 or bfloat16, not {model.norm.weight.dtype}"
    if model.local_rotary is not None:
        return "layers with their own rotary base (Gemma 3's local layers)"
    for layer in model.layers:
        attn = layer.self_attn
        if type(layer.mlp) is not GatedMLP:
            return "mixture-of-experts layers"
        if layer.sandwich:
            return "sandwich norms"
        if attn.window is not None or attn.softcap is not None:
            return "sliding windows or soft-capped attention"
        group = attn.num_heads // attn.num_kv_heads
        if attn.head_dim > MAX_HEAD_DIM or attn.head_dim % 2 or group > MAX_GROUP:
            return f"heads the decode kernel does not take ({attn.num_heads}x{attn.head_dim})"
        if attn.num_heads % attn.num_kv_heads:
            return "query heads not a multiple of the kv heads"
    return None
