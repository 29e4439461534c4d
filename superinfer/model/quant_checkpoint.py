"""AWQ, GPTQ and FP8 safetensors checkpoints (the `quantization_config` of config.json).

Loading takes two passes over the layers a checkpoint quantizes. `QuantizedTensors` first
stands between the checkpoint and `load_hf_weights`: it keeps each such layer's tensors and
hands the model that layer's dequantized weight (float32, exact), so the model builds as
from an unquantized checkpoint and `--quantization none` is just that. Then, where
`quantized_kernel` finds a kernel here for them, `swap_quantized_linears` replaces those
layers by ones that run on the quantized values (otherwise no quantized copy is kept).

**4-bit (AWQ with GEMM packing, GPTQ v1 and v2).** Each layer holds 4-bit values q and, per
group of `group_size` inputs, a scale s and an integer zero z: w = (q - z) s.
- AWQ packs eight outputs in an int32, in the order 0 2 4 6 1 3 5 7; GPTQ packs eight inputs,
  in order, and its zeros (eight outputs an int32); GPTQ v1 stores z - 1.
- With w = (q - 8) s + (8 - z) s, the groups become the (scale, zero) pairs of PyTorch's int4
  kernels (groups of 32; a group of 64 or 128 repeats its pair). On the CPU they run as GGUF
  Q4_1 does (`quant.Int4Linear` with the few-row GEMV and the 4-bit GEMM), on CUDA with
  tinygemm (`cuda_int4`). The pairs are rounded to bfloat16 there, the kernels' dtype.
- GPTQ's act-order (`desc_act`, a `g_idx` that is not in input order) runs where every run of
  32 inputs shares a group; other layers stay dequantized.

**FP8 (e4m3 weights).** `quant_method: fp8` with a per-tensor `weight_scale`, or
compressed-tensors' float 8-bit weights (per tensor or per channel), optional static
`input_scale`: on CUDA `fp8_linear.Fp8Linear` (`torch._scaled_mm`); on a CPU they stay
dequantized to `--dtype` (PyTorch's CPU FP8 matmul is about 30x slower than bfloat16's)
unless `--quantization fp8` asks for FP8 execution.
Block-scaled FP8 (`weight_block_size`, `weight_scale_inv`) is dequantized everywhere.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from superinfer.model.config import ModelConfig
from superinfer.model.cuda_int4 import CudaInt4Linear, cuda_int4_available, inner_k_tiles
from superinfer.model.fp8_linear import FP8, Fp8Linear
from superinfer.model.quant import GROUP, Planes, int4_kernel_available, swap_int4_linears
from superinfer.model.weights import interleave_rope_rows, parameter_part

SUPPORTED = (
    "AWQ (4-bit, GEMM packing), GPTQ (4-bit; checkpoint_format gptq or gptq_v2), FP8 "
    "(quant_method fp8, or compressed-tensors with 8-bit float weights)"
)
METHODS = ("awq", "gptq", "fp8")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # the output each of an int32's eight nibbles holds
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)
_INT4_KINDS = ("qweight", "qzeros", "scales", "g_idx")
_FP8_KINDS = ("weight", "weight_scale", "weight_scale_inv", "input_scale")


@dataclass(frozen=True)
class QuantScheme:
    """What a checkpoint's `quantization_config` says, reduced to what loading needs."""

    method: str  # "awq" | "gptq" | "fp8"
    group_size: int = 0  # 4-bit: inputs per group; -1: the whole row
    stores_zero_minus_one: bool = False  # GPTQ v1
    block_size: tuple[int, int] | None = None  # block-scaled FP8


def quant_scheme(hf_config: dict) -> QuantScheme | None:
    """The checkpoint's scheme; None when it is not quantized. Raises ValueError, naming
    what is supported, for any other quantization."""
    qc = hf_config.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "awq":
        bits, version = qc.get("bits", qc.get("w_bit")), str(qc.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm":
            raise _unsupported(f"AWQ with {bits} bits and version {version!r}")
        return QuantScheme("awq", int(qc.get("group_size", qc.get("q_group_size", 128))))
    if method == "gptq":
        bits, fmt = qc.get("bits"), str(qc.get("checkpoint_format", "gptq")).lower()
        if bits != 4 or fmt not in ("gptq", "gptq_v2"):
            raise _unsupported(f"GPTQ with {bits} bits and checkpoint_format {fmt!r}")
        return QuantScheme("gptq", int(qc.get("group_size", 128)), fmt == "gptq")
    if method == "fp8":
        block = qc.get("weight_block_size")
        return QuantScheme("fp8", block_size=None if block is None else tuple(block))
    if method == "compressed-tensors" and _is_fp8_weights(qc):
        return QuantScheme("fp8")
    raise _unsupported(f"quant_method {method!r}")


def _is_fp8_weights(qc: dict) -> bool:
    groups = (qc.get("config_groups") or {}).values()
    weights = [g.get("weights") or {} for g in groups]
    return bool(weights) and all(
        w.get("num_bits") == 8 and w.get("type") == "float"
        and w.get("strategy") in ("tensor", "channel")
        for w in weights
    )  # fmt: skip


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported; quantized checkpoints supported: {SUPPORTED}; "
                      "GGUF Q4_0, Q4_1, Q8_0 and Q4_K run quantized too (docs/models.md)")  # fmt: skip


@dataclass
class QuantizedTensors:
    """A checkpoint's quantized layers, kept while their dequantized weights go to the model.

    `planes` (4-bit) and `fp8` map each quantized module (canonical name, e.g.
    'model.layers.0.self_attn.q_proj') to what the swap needs: the int4 kernels' planes
    (None when its groups do not fit them), or (FP8 weight, per-row scales, input scale)."""

    scheme: QuantScheme
    keeps_quantized: bool = True  # False: only dequantize (nothing will run them quantized)
    planes: dict[str, Planes | None] = field(default_factory=dict)
    fp8: dict[str, tuple[Tensor, Tensor, Tensor | None] | None] = field(default_factory=dict)

    def dequantize(
        self,
        weights: Iterable[tuple[str, Tensor]],
        has_bias: Callable[[str], bool] = lambda _module: True,
    ) -> Iterator[tuple[str, Tensor]]:
        """`weights` with each quantized layer's tensors replaced by its `.weight`, float32
        (yielded last, once every file has been read: a layer's tensors may be split).
        A quantized layer's all-zero bias is left out where the model has none
        (`has_bias(module)` is False): AutoGPTQ writes one for every layer, as vLLM skips."""
        pending: dict[str, dict[str, Tensor]] = {}
        for name, tensor in weights:
            module, _, kind = name.rpartition(".")
            if self._is_quantized(kind, tensor) or kind == "bias":
                pending.setdefault(module, {})[kind] = tensor
            else:
                yield name, tensor
        for module, parts in pending.items():
            bias = parts.pop("bias", None)
            if bias is not None and (has_bias(module) or not parts or bool(bias.any())):
                yield f"{module}.bias", bias
            if parts:
                yield f"{module}.weight", self._take(module, parts)

    def _is_quantized(self, kind: str, tensor: Tensor) -> bool:
        if self.scheme.method == "fp8":
            return kind in _FP8_KINDS[1:] or (kind == "weight" and tensor.dtype == FP8)
        return kind in _INT4_KINDS

    def _take(self, module: str, parts: dict[str, Tensor]) -> Tensor:
        if self.scheme.method == "fp8":
            return self._take_fp8(module, parts)
        if "qweight" not in parts or "scales" not in parts:
            raise ValueError(f"quantized layer {module!r} lacks qweight or scales "
                             f"(has {sorted(parts)})")  # fmt: skip
        q, z, s, groups = unpack_int4(self.scheme, parts)
        if self.keeps_quantized:
            self.planes[module] = int4_kernel_planes(q, z, s, groups)
        return dequantize_int4(q, z, s, groups)

    def _take_fp8(self, module: str, parts: dict[str, Tensor]) -> Tensor:
        weight = parts.get("weight")
        scale = parts.get("weight_scale", parts.get("weight_scale_inv"))
        if weight is None or scale is None:
            raise ValueError(f"FP8 layer {module!r} lacks weight or weight_scale "
                             f"(has {sorted(parts)})")  # fmt: skip
        num_rows = weight.shape[0]
        if self.scheme.block_size is not None or scale.dim() == 2 and scale.shape[1] > 1:
            # block scales stay dequantized: _scaled_mm takes rows and columns only
            return _dequantize_blocks(weight, scale.float())
        row_scales = scale.float().reshape(-1).expand(num_rows).contiguous()
        if self.keeps_quantized:
            self.fp8[module] = (weight, row_scales, parts.get("input_scale"))
        return weight.float() * row_scales.unsqueeze(1)


def unpack_int4(
    scheme: QuantScheme, parts: dict[str, Tensor]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(q (K, N) uint8, z (G, N) float32, s (G, N) float32, group of each input (K,) int64)
    of an AWQ or GPTQ layer: w[n, k] = (q[k, n] - z[g[k], n]) * s[g[k], n]."""
    qweight, s = parts["qweight"].to(torch.int32), parts["scales"].float()
    if scheme.method == "awq":  # (K, N / 8): eight outputs an int32, in AWQ_ORDER
        nibbles = (qweight.unsqueeze(-1) >> _SHIFTS) & 15  # (K, N / 8, 8)
        q = _awq_columns(nibbles)
    else:  # GPTQ (K / 8, N): eight inputs an int32, in order
        nibbles = (qweight.unsqueeze(1) >> _SHIFTS.view(1, 8, 1)) & 15  # (K / 8, 8, N)
        q = nibbles.reshape(-1, qweight.shape[1])
    num_inputs, num_outputs = q.shape
    if "qzeros" in parts:
        zn = (parts["qzeros"].to(torch.int32).unsqueeze(-1) >> _SHIFTS) & 15  # (G, N / 8, 8)
        z = (_awq_columns(zn) if scheme.method == "awq" else zn.reshape(zn.shape[0], -1)).float()
        if scheme.stores_zero_minus_one:
            z += 1
    else:  # symmetric without stored zeros
        z = torch.full_like(s, 8.0)
    if "g_idx" in parts:
        groups = parts["g_idx"].long()
    else:
        size = num_inputs if scheme.group_size == -1 else scheme.group_size
        groups = torch.arange(num_inputs) // size
    if s.shape != (int(groups.max()) + 1, num_outputs) or z.shape != s.shape:
        raise ValueError(f"scales {tuple(s.shape)} and zeros {tuple(z.shape)} do not fit "
                         f"{num_inputs} inputs in groups of {scheme.group_size}")  # fmt: skip
    return q.to(torch.uint8), z, s, groups


def _awq_columns(nibbles: Tensor) -> Tensor:
    """(rows, N / 8, 8) nibbles in AWQ_ORDER -> (rows, N) in output order."""
    inverse = [AWQ_ORDER.index(i) for i in range(8)]
    return nibbles[..., inverse].reshape(nibbles.shape[0], -1)


def dequantize_int4(q: Tensor, z: Tensor, s: Tensor, groups: Tensor) -> Tensor:
    """The (N, K) float32 weight of `unpack_int4`'s values."""
    return ((q.float() - z[groups]) * s[groups]).t().contiguous()


def int4_kernel_planes(q: Tensor, z: Tensor, s: Tensor, groups: Tensor) -> Planes | None:
    """(nibbles (N, K), scales and zeros (N, K / 32)) for the int4 kernels, w = (q - 8)
    scale + zero; None unless every run of 32 inputs shares one group."""
    num_inputs = q.shape[0]
    if num_inputs % GROUP:
        return None
    by_block = groups.view(-1, GROUP)
    if not bool((by_block == by_block[:, :1]).all()):
        return None
    block_groups = by_block[:, 0]
    scales = s[block_groups]  # (K / 32, N)
    zeros = (8 - z[block_groups]) * scales
    return q.t().contiguous(), scales.t().contiguous(), zeros.t().contiguous()


def _dequantize_blocks(weight: Tensor, scale_inv: Tensor) -> Tensor:
    """A block-scaled FP8 weight: each (rows, cols) block times its scale."""
    num_rows, num_cols = weight.shape
    block_rows = -(-num_rows // scale_inv.shape[0])
    block_cols = -(-num_cols // scale_inv.shape[1])
    scales = scale_inv.repeat_interleave(block_rows, 0)[:num_rows]
    return weight.float() * scales.repeat_interleave(block_cols, 1)[:, :num_cols]


def quantized_kernel(
    scheme: QuantScheme, dtype: torch.dtype, device: torch.device, is_fp8_forced: bool = False
) -> tuple[bool, str]:
    """Whether a checkpoint's quantized layers run quantized here, and what runs them (or
    why they stay dequantized). FP8 runs on a CPU only when `is_fp8_forced`
    (`--quantization fp8`)."""
    if scheme.method == "fp8":
        if device.type != "cuda" and not is_fp8_forced:
            return False, ("FP8 dequantized on the CPU, where torch._scaled_mm is slow "
                           "(--quantization fp8 runs it)")  # fmt: skip
        if device.type == "cuda" and dtype != torch.bfloat16:
            return False, f"FP8 row-wise scaling computes into bfloat16, not {dtype}"
        return True, "torch._scaled_mm"
    if dtype != torch.bfloat16:
        return False, f"the int4 kernels compute in bfloat16, not {dtype}"
    if device.type == "cpu" and int4_kernel_available():
        return True, "int4 kernels (CPU)"
    if device.type == "cuda" and cuda_int4_available():
        return True, "int4 kernel (tinygemm)"
    return False, f"no int4 kernel for {device}"


def swap_quantized_linears(
    model: nn.Module, tensors: QuantizedTensors, dtype: torch.dtype, max_int4_rows: int
) -> int:
    """Replace the model's quantized linear layers (q/k/v and gate/up fused as the model
    holds them) by layers that run on their quantized values, where `quantized_kernel`
    said they run; returns how many were swapped."""
    device = model.model.norm.weight.device
    if tensors.scheme.method == "fp8":
        make = functools.partial(_fp8_linear, dtype=dtype)
        return _swap(model, _fused_parts(tensors.fp8), make)
    fused = _fused_parts(tensors.planes)
    if device.type == "cpu":
        return len(swap_int4_linears(model, fused, False, max_int4_rows))
    return _swap(model, fused, functools.partial(_cuda_int4_linear, device=device))


def _fused_parts(layers: dict[str, object]) -> dict[str, list]:
    """The model's linear layers whose every part is quantized and runnable, with the
    parts' entries in row order: {'model.layers.0.self_attn.qkv_proj': [q, k, v]}."""
    by_module: dict[str, dict[int, object]] = {}
    for module, entry in layers.items():
        target, part = parameter_part(f"{module}.weight")
        if len(part) > 1 or ".experts." in target:
            continue  # MoE experts stay dequantized
        by_module.setdefault(target.removesuffix(".weight"), {})[part[0] if part else 0] = entry
    num_parts = {"qkv_proj": 3, "gate_up_proj": 2}
    fused = {}
    for module, parts in by_module.items():
        expected = num_parts.get(module.rpartition(".")[2], 1)
        entries = [parts.get(i) for i in range(expected)]
        if all(e is not None for e in entries):
            fused[module] = entries
    return fused


def _swap(
    model: nn.Module,
    fused: dict[str, list],
    make: Callable[[list, nn.Linear], nn.Module | None],
) -> int:
    """Replace each layer of `fused` by `make(parts, linear)` (None: keep it); q/k rows are
    reordered for RoPE as `load_hf_weights` reorders the dense ones."""
    swapped = 0
    for name, parts in fused.items():
        linear = model.get_submodule(name)
        if not isinstance(linear, nn.Linear):
            continue
        if name.endswith("qkv_proj"):
            parts = [_rope_rows(p, model.config) for p in parts[:2]] + list(parts[2:])
        layer = make(parts, linear)
        if layer is not None:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)
            swapped += 1
    return swapped


def _rope_rows(entry: tuple, config: ModelConfig) -> tuple:
    """A part's row-indexed tensors in the model's q/k row order (scalars kept)."""
    return tuple(t if t is None or t.dim() == 0 or t.numel() == 1
                 else interleave_rope_rows(t, config.head_dim, config.rotary_dim)
                 for t in entry)  # fmt: skip


def _cuda_int4_linear(
    parts: list[Planes], linear: nn.Linear, device: torch.device
) -> CudaInt4Linear | None:
    nibbles, scales, zeros = (torch.cat([p[i] for p in parts]).to(device) for i in range(3))
    if inner_k_tiles(*reversed(nibbles.shape)) is None:
        return None
    return CudaInt4Linear(nibbles, scales, zeros, linear.bias)


def _fp8_linear(parts: list, linear: nn.Linear, dtype: torch.dtype) -> Fp8Linear | None:
    if linear.in_features % 16 or linear.out_features % 16:
        return None  # torch._scaled_mm multiplies in tiles of 16 (CUDA)
    device = linear.weight.device
    weight = torch.cat([p[0] for p in parts]).to(device)
    row_scales = torch.cat([p[1] for p in parts]).to(device)
    input_scales = [p[2] for p in parts]
    # fused parts share their input: the largest static scale covers them all (as vLLM)
    input_scale = (
        None
        if any(s is None for s in input_scales)
        else torch.stack([s.float().reshape(()) for s in input_scales]).max()
    )
    return Fp8Linear(weight, row_scales, None if input_scale is None else input_scale.to(device),
                     linear.bias, dtype)  # fmt: skip
