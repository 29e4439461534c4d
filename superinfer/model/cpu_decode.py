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

Where every projection runs a C kernel at the step's number of rows (GGUF weights kept
quantized, bfloat16, SiLU, no Granite multipliers), the whole loop runs as one C call
(`csrc/decode_layers.c`): the same kernels in the same order, so the same results bit for
bit, without the 4-6 us of Python around each of the 270 calls of the default model's step
(about a fifth of a one-sequence step). Each projection's call for a number of rows
(`kernel_call`) is asked once and kept.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from superinfer.model.attention import AttentionMetadata
from superinfer.model.cpu_act import act_kernel
from superinfer.model.cpu_attention import MAX_GROUP, MAX_HEAD_DIM
from superinfer.model.cpu_kernels import KERNEL_DTYPES as _DTYPES
from superinfer.model.cpu_kernels import KernelCall, load_kernel
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


class _LinearCall(ctypes.Structure):
    """decode_layers.c's `struct linear_call`: a `KernelCall`."""

    _fields_ = [("fn", _PTR), ("packed", _PTR), ("scales", _PTR), ("bias", _PTR),
                ("num_in", _I64), ("num_out", _I64)]  # fmt: skip


class _LayerCalls(ctypes.Structure):
    """decode_layers.c's `struct decode_layer`."""

    _fields_ = [("qkv", _LinearCall), ("o", _LinearCall), ("gate_up", _LinearCall),
                ("down", _LinearCall), ("input_norm", _PTR), ("post_norm", _PTR),
                ("q_norm", _PTR), ("k_norm", _PTR), ("eps", _FLOAT)]  # fmt: skip


class _Step(ctypes.Structure):
    """decode_layers.c's `struct decode_step`."""

    _fields_ = [("num_rows", _I64), ("hidden", _INT), ("num_threads", _INT),
                ("residual", _PTR), ("h", _PTR), ("qkv", _PTR), ("q_rotated", _PTR),
                ("attention", _PTR), ("y", _PTR), ("gate_up", _PTR), ("act", _PTR),
                ("out", _PTR), ("final_norm", _PTR), ("final_eps", _FLOAT),
                ("rotation", _PTR), ("kv_cache", _PTR), ("slot_blocks", _PTR),
                ("slot_offsets", _PTR), ("num_blocks", _I64), ("block_tables", _PTR),
                ("seq_lens", _PTR), ("max_blocks", _INT), ("num_cached_layers", _INT),
                ("block_size", _INT), ("num_heads", _INT), ("num_kv_heads", _INT),
                ("head_dim", _INT), ("scale", _FLOAT)]  # fmt: skip


@functools.cache
def decode_layers_kernel() -> Callable[..., int] | None:
    """The C `decode_layers`, or None where the kernels cannot be built here."""

    def bind(library: ctypes.CDLL) -> Callable[..., int]:
        fn = library.decode_layers
        fn.restype = _INT
        fn.argtypes = [ctypes.POINTER(_LayerCalls), _INT, ctypes.POINTER(_Step)]
        return fn

    return load_kernel(bind, "decode-layers", "the flat loop in Python")


@dataclass(frozen=True)
class _Plan:
    """The C loop's layers for one number of rows, and the widths of its buffers."""

    layers: ctypes.Array
    qkv_width: int
    inner: int  # the MLP's: half of gate_up's outputs


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
    projections: tuple[object, ...]  # the qkv, o, gate_up and down modules


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
                (
                    layer.self_attn.qkv_proj,
                    layer.self_attn.o_proj,
                    layer.mlp.gate_up_proj,
                    layer.mlp.down_proj,
                ),
            )
            for layer in model.layers
        ]
        is_silu = model.layers[0].mlp.act is torch.nn.functional.silu
        takes_c = (self.dtype == torch.bfloat16 and is_silu and act_kernel() is not None
                   and self.residual_multiplier is None)  # fmt: skip
        self.c_loop = decode_layers_kernel() if takes_c else None
        self._plans: dict[int, _Plan | None] = {}  # by number of rows

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
        is_c = self.c_loop is not None and x.dtype == torch.bfloat16 and x.is_contiguous()
        plan = self._plan(num_seqs) if is_c else None
        if plan is not None:
            return self._run(plan, x, rotation, q_rotated, kv_cache, meta, num_threads)
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

    def _plan(self, num_rows: int) -> _Plan | None:
        """The C loop's layers for steps of `num_rows` rows, or None where a projection
        runs PyTorch at that size (then the loop runs in Python)."""
        if num_rows not in self._plans:
            self._plans[num_rows] = self._make_plan(num_rows)
        return self._plans[num_rows]

    def _make_plan(self, num_rows: int) -> _Plan | None:
        layers = (_LayerCalls * len(self.layers))()
        for layer, out in zip(self.layers, layers):
            calls = [_kernel_call(p, num_rows) for p in layer.projections]
            if None in calls:
                return None
            out.qkv, out.o, out.gate_up, out.down = map(_linear_call, calls)
            out.input_norm = layer.input_norm.data_ptr()
            out.post_norm = layer.post_norm.data_ptr()
            if layer.q_norm is not None:
                out.q_norm, out.k_norm = layer.q_norm.data_ptr(), layer.k_norm.data_ptr()
            out.eps = layer.eps
        return _Plan(layers, layers[0].qkv.num_out, layers[0].gate_up.num_out // 2)

    def _run(self, plan: _Plan, x: Tensor, rotation: Tensor, q_rotated: Tensor,
             kv_cache: Tensor, meta: AttentionMetadata, num_threads: int) -> Tensor:  # fmt: skip
        """The loop as one C call (`csrc/decode_layers.c`), on buffers made here."""
        batch, (num_seqs, hidden) = meta.decode, x.shape
        widths = (hidden, plan.qkv_width, self.num_heads * self.head_dim, hidden,
                  2 * plan.inner, plan.inner)  # fmt: skip
        work = x.new_empty(num_seqs * sum(widths))
        h, qkv, attention, y, gate_up, act = (
            work.data_ptr() + 2 * num_seqs * start
            for start in itertools.accumulate(widths[:-1], initial=0)
        )
        out = x.new_empty(num_seqs, hidden)
        num_blocks, num_layers, _, block_size = kv_cache.shape[:4]
        step = _Step(
            num_rows=num_seqs, hidden=hidden, num_threads=num_threads, residual=x.data_ptr(),
            h=h, qkv=qkv, q_rotated=q_rotated.data_ptr(), attention=attention, y=y,
            gate_up=gate_up, act=act, out=out.data_ptr(),
            final_norm=self.final_norm.data_ptr(), final_eps=self.final_eps,
            rotation=rotation.data_ptr(), kv_cache=kv_cache.data_ptr(),
            slot_blocks=meta.slot_blocks.data_ptr(), slot_offsets=meta.slot_offsets.data_ptr(),
            num_blocks=num_blocks, block_tables=batch.block_ids.data_ptr(),
            seq_lens=batch.seq_lens.data_ptr(), max_blocks=batch.block_ids.shape[0] // num_seqs,
            num_cached_layers=num_layers, block_size=block_size, num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, scale=self.scale,
        )  # fmt: skip
        status = self.c_loop(plan.layers, len(self.layers), ctypes.byref(step))
        if status != 0:
            raise RuntimeError(f"decode_layers failed with status {status}")
        return out


def _kernel_call(projection: object, num_rows: int) -> KernelCall | None:
    """The C call `projection` makes for `num_rows` rows; None for PyTorch's layers."""
    kernel_call = getattr(projection, "kernel_call", None)
    return None if kernel_call is None else kernel_call(num_rows)


def _linear_call(call: KernelCall) -> _LinearCall:
    return _LinearCall(call.fn, call.packed, call.scales, call.bias or None, call.num_in,
                       call.num_out)  # fmt: skip


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
