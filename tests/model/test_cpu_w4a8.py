"""The GEMM on 8-bit activations (`csrc/q4_q8_linear.c`, 4-bit and Q8_0 weights) against
float64 products of the same weights and of the activations rounded to 8 bits per block of
32, as ggml rounds them; and `--quantization gguf-w4a8` end to end on a tiny GGUF model."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM, LlamaConfig

from superinfer.model.cpu_w4a8 import w4a8_kernel
from superinfer.model.loader import load_gguf_model
from superinfer.model.quant import Int4Linear
from tests.model.gguf_tiny import write_gguf
from tests.model.paged import PagedRun
from tests.model.test_cpu_q4 import random_q4
from tests.model.tiny import PROMPT, TINY, save_tiny

pytestmark = pytest.mark.skipif(w4a8_kernel() is None, reason="no AVX-512 VNNI kernel here")
CPU = torch.device("cpu")


def rounded_to_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, K) as the kernel sees it, in float64: per block of 32, the scale
    max|x| / 127 and the values rounded to nearest; and the scales (rows, K / 32)."""
    blocks = x.float().view(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(amax > 0, 127 / amax, 0.0)
    scale = (amax / 127).double()
    return (torch.round(blocks * inverse).double() * scale).view(x.shape), scale.squeeze(-1)


def float_weights(nibbles, scales, zeros) -> torch.Tensor:
    """w = (q - 8) * scale + zero in float64, the GGUF scales unrounded."""
    s = scales.double().repeat_interleave(32, 1)
    z = zeros.double().repeat_interleave(32, 1)
    return (nibbles.double() - 8) * s + z


@pytest.mark.parametrize("num_rows", [1, 5, 12, 13, 25, 40])
@pytest.mark.parametrize("has_bias", [False, True])
def test_products_match_float64_of_the_rounded_activations(num_rows, has_bias) -> None:
    num_out, num_in = 72, 96  # a partial strip of 16 columns; 12-row tiles and a rest
    nibbles, scales, zeros = random_q4(num_out, num_in, seed=num_rows)
    bias = torch.randn(num_out) if has_bias else None
    weights = w4a8_kernel().pack(nibbles, scales, zeros, bias)
    wide = torch.randn(num_rows, num_in + 6, dtype=torch.bfloat16,
                       generator=torch.Generator().manual_seed(num_rows))  # fmt: skip
    x = wide[:, 2 : 2 + num_in]  # rows a stride apart, not contiguous as a whole
    y = weights(x)
    w = float_weights(nibbles, scales, zeros)
    rounded, steps = rounded_to_int8(x)
    reference = rounded @ w.t() + (0 if bias is None else bias.double())
    assert y.shape == (num_rows, num_out) and y.dtype == torch.bfloat16
    # Integer sums are exact and the rest is float, rounded once to bfloat16; a value
    # that lands on a tie (x / scale = k + 1/2 up to float rounding) may round to the other
    # integer here than in C: allow one step of that block, against the largest weight.
    one_step = steps.amax(-1, keepdim=True) * w.abs().max()
    error = (y.double() - reference).abs()
    assert (error <= 2**-8 * reference.abs() + one_step + 1e-4).all()
    # and the 8-bit rounding is really there: unrounded activations give other products
    exact = x.double() @ w.t() + (0 if bias is None else bias.double())
    assert not torch.allclose(y.double(), exact, rtol=2**-9, atol=0)


@pytest.mark.parametrize("num_rows", [3, 12, 25])
def test_q8_0_weights_match_float64_of_the_rounded_activations(num_rows) -> None:
    num_out, num_in = 40, 96
    g = torch.Generator().manual_seed(num_rows)
    values = torch.randint(-128, 128, (num_out, num_in), generator=g, dtype=torch.int8)
    scales = torch.rand(num_out, num_in // 32, generator=g) * 0.01
    bias = torch.randn(num_out, generator=g)
    weights = w4a8_kernel().pack_q8(values, scales, bias)
    x = torch.randn(num_rows, num_in, generator=g).to(torch.bfloat16)
    w = values.double() * scales.double().repeat_interleave(32, 1)
    rounded, steps = rounded_to_int8(x)
    reference = rounded @ w.t() + bias.double()
    one_step = steps.amax(-1, keepdim=True) * w.abs().max()
    error = (weights(x).double() - reference).abs()
    assert (error <= 2**-8 * reference.abs() + one_step + 1e-4).all()


def test_q8_0_planes_pack_as_their_8_bit_values() -> None:
    """Q8_0 arrives as `int4_planes`' two planes; packed from them or from the values, the
    products are the same."""
    g = torch.Generator().manual_seed(0)
    values = torch.randint(-128, 128, (24, 64), generator=g, dtype=torch.int8)
    d = torch.rand(24, 2, generator=g) * 0.01
    u = values.int() + 128  # as quant.int4_planes splits a Q8_0 tensor
    nibbles = torch.cat([u & 15, u >> 4], 1)
    scales, zeros = torch.cat([d, 16 * d], 1), torch.cat([8 * d, torch.zeros_like(d)], 1)
    kernel = w4a8_kernel()
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    from_planes = kernel.pack_planes(nibbles, scales, zeros, 64)
    assert from_planes.is_q8 and torch.equal(from_planes(x), kernel.pack_q8(values, d)(x))


def test_rows_of_zeros_give_the_bias() -> None:
    nibbles, scales, zeros = random_q4(40, 64, seed=1)
    bias = torch.randn(40)
    y = w4a8_kernel().pack(nibbles, scales, zeros, bias)(torch.zeros(3, 64, dtype=torch.bfloat16))
    assert torch.equal(y, bias.to(torch.bfloat16).expand(3, 40))


def test_odd_shapes_are_refused() -> None:
    nibbles, scales, zeros = random_q4(8, 64, seed=0)
    with pytest.raises(ValueError, match="one scale per 32"):
        w4a8_kernel().pack(nibbles[:, :48], scales, zeros)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    directory = save_tiny(tmp_path_factory.mktemp("llama"), LlamaConfig(**TINY), seed=5)
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1,
                                   GGMLQuantizationType.Q8_0], ids=lambda q: q.name)  # fmt: skip
def test_gguf_w4a8_runs_every_step_on_8_bit_activations(qtype, tiny_llama, tmp_path) -> None:
    path = write_gguf(tiny_llama, tmp_path / "w.gguf", "llama", qtype)
    models = {q: load_gguf_model(str(path), torch.bfloat16, CPU, q)[0]
              for q in ("auto", "gguf-w4a8")}  # fmt: skip
    auto, w4a8 = (m.model.layers[0].mlp.gate_up_proj for m in models.values())
    assert isinstance(w4a8, Int4Linear) and w4a8.packed is None  # no int4 kernel's copy
    for layer in (w4a8, models["gguf-w4a8"].lm_head):  # no dense copy, Q8_0 included
        assert layer.dense is None and layer.q4.is_q8 == (qtype == GGMLQuantizationType.Q8_0)
    x = torch.randn(13, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert w4a8(x[:0]).shape == (0, w4a8.out_features)  # an empty step too
        large, bf16 = w4a8(x).double(), auto(x).double()
        # each row quantized on its own: a row's result does not depend on the others
        assert torch.equal(w4a8(x[3:4]).double(), large[3:4])
    assert not torch.equal(large, bf16)  # 8-bit activations
    assert (large - bf16).norm() < 0.02 * bf16.norm()  # about 1/127 of a block's largest
    runs = {q: PagedRun(m, 16, 4) for q, m in models.items()}
    logits = {q: r.step([(r.add(PROMPT), len(PROMPT))], all_logits=True)
              for q, r in runs.items()}  # fmt: skip
    assert torch.cosine_similarity(logits["auto"], logits["gguf-w4a8"], dim=-1).min() > 0.99


def test_gguf_w4a8_is_refused_off_bfloat16(tiny_llama, tmp_path) -> None:
    path = write_gguf(tiny_llama, tmp_path / "r.gguf", "llama", GGMLQuantizationType.Q4_1)
    with pytest.raises(ValueError, match="gguf-w4a8 runs on the CPU in bfloat16"):
        load_gguf_model(str(path), torch.float32, CPU, "gguf-w4a8")


def test_the_flag_is_accepted_and_others_still_refused() -> None:
    from superinfer.config import ModelConfig

    assert ModelConfig(quantization="gguf-w4a8").quantization == "gguf-w4a8"
    with pytest.raises(ValueError, match="auto, none, gguf, gguf-w4a8, awq, gptq, fp8"):
        ModelConfig(quantization="w4a8")
