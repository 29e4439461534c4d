"""The few-row GEMV (`csrc/q_gemv.c`; 4-bit, Q8_0 and Q6_K weights) against float64
products of the weights it reads."""

from __future__ import annotations

import pytest
import torch

from superinfer.model.cpu_gemv import MAX_ROWS, gemv_kernel
from superinfer.model.cpu_q4 import q4_kernel
from tests.model.test_cpu_q4 import random_q4

pytestmark = pytest.mark.skipif(gemv_kernel() is None, reason="no AVX-512 BF16 kernel here")


def q4_reference(nibbles, scales, zeros) -> torch.Tensor:
    """The weights as the int4 kernel holds them: scale and zero rounded to bfloat16, each
    weight exact in float64."""
    s = scales.to(torch.bfloat16).double().repeat_interleave(32, 1)
    z = zeros.to(torch.bfloat16).double().repeat_interleave(32, 1)
    return (nibbles.double() - 8) * s + z


def rows(num_rows: int, num_in: int, seed: int) -> torch.Tensor:
    """num_rows bfloat16 rows a stride apart (not contiguous as a whole)."""
    wide = torch.randn(num_rows, num_in + 6, dtype=torch.bfloat16,
                       generator=torch.Generator().manual_seed(seed))  # fmt: skip
    return wide[:, 2 : 2 + num_in]


def assert_rounded_from(y: torch.Tensor, exact: torch.Tensor) -> None:
    """y is exact rounded to bfloat16, but where float sums in another order land on the
    other side of a rounding boundary (one bfloat16 step)."""
    assert y.dtype == torch.bfloat16 and y.shape == exact.shape
    torch.testing.assert_close(y.double(), exact, rtol=2**-8, atol=1e-5)
    assert (y == exact.to(torch.bfloat16)).double().mean() > 0.98


@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize("has_bias", [False, True])
def test_4bit_products_match_float64(num_rows, has_bias) -> None:
    num_out, num_in = 80, 96  # a partial strip of 32 columns, one of 16
    nibbles, scales, zeros = random_q4(num_out, num_in, seed=num_rows)
    bias = torch.randn(num_out) if has_bias else None
    weights = q4_kernel().pack(nibbles, scales, zeros, bias)
    x = rows(num_rows, num_in, seed=num_rows)
    exact = x.double() @ q4_reference(nibbles, scales, zeros).t()
    assert_rounded_from(gemv_kernel()(x, weights), exact + (0 if bias is None else bias.double()))


@pytest.mark.parametrize("num_rows", [1, 3, 4, 5, MAX_ROWS])
@pytest.mark.parametrize("has_bias", [False, True])
def test_q8_products_match_float64(num_rows, has_bias) -> None:
    num_out, num_in = 40, 128  # a partial strip of 16 columns
    g = torch.Generator().manual_seed(num_rows)
    values = torch.randint(-128, 128, (num_out, num_in), generator=g)
    scales = torch.rand(num_out, num_in // 32, generator=g) * 0.01
    bias = torch.randn(num_out, generator=g) if has_bias else None
    weights = gemv_kernel().pack_q8(values, scales, bias)
    x = rows(num_rows, num_in, seed=num_rows)
    exact = x.double() @ (values.double() * scales.double().repeat_interleave(32, 1)).t()
    assert_rounded_from(gemv_kernel()(x, weights), exact + (0 if bias is None else bias.double()))


def random_q6_k(num_out: int, num_in: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Q6_K values in -32..31, int8 sc per 16 inputs (all of -128..127) and fp16 d per 256
    (some negative)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-32, 32, (num_out, num_in), generator=g)
    sc = torch.randint(-128, 128, (num_out, num_in // 16), generator=g)
    d = ((torch.rand(num_out, num_in // 256, generator=g) - 0.2) * 1e-3).half().float()
    return values, sc, d


def q6_k_scales(sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The float scale d sc of each 16 inputs (exact), as gguf computes it."""
    return d.repeat_interleave(16, 1) * sc.float()


@pytest.mark.parametrize("num_rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize("has_bias", [False, True])
def test_q6_k_layout_products_match_float64(num_rows, has_bias) -> None:
    """Q6_K's own layout: each half-block's sums times its d sc; every value, sc and both
    signs of d; a partial strip."""
    num_out, num_in = 37, 512  # two strips of 16 columns and a partial one; 2 super-blocks
    values, sc, d = random_q6_k(num_out, num_in, seed=num_rows)
    bias = torch.randn(num_out) if has_bias else None
    weights = gemv_kernel().pack_q6_k(values, sc, d, bias)
    x = rows(num_rows, num_in, seed=num_rows)
    w = values.double() * q6_k_scales(sc, d).double().repeat_interleave(16, 1)
    assert_rounded_from(gemv_kernel()(x, weights), x.double() @ w.t() + (
        0 if bias is None else bias.double()))  # fmt: skip


def test_q6_k_layout_refuses_shapes_off_super_blocks() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        gemv_kernel().pack_q6_k(torch.zeros(8, 128, dtype=torch.int8),
                                torch.ones(8, 8, dtype=torch.int8), torch.ones(8, 1))  # fmt: skip


def test_a_rows_result_does_not_depend_on_the_rows_beside_it() -> None:
    """A request's tokens must not change with the batch it shares a step with."""
    nibbles, scales, zeros = random_q4(64, 192, seed=7)
    q4 = q4_kernel().pack(nibbles, scales, zeros)
    g = torch.Generator().manual_seed(7)
    q8 = gemv_kernel().pack_q8(torch.randint(-128, 128, (64, 192), generator=g),
                               torch.rand(64, 6, generator=g))  # fmt: skip
    q6_k = gemv_kernel().pack_q6_k(*random_q6_k(40, 256, seed=7))
    x = rows(MAX_ROWS, 256, seed=7)
    for weights in (q4, q8, q6_k):
        xw = x[:, : weights.num_in]
        together = gemv_kernel()(xw, weights)
        for i in range(MAX_ROWS):
            assert torch.equal(gemv_kernel()(xw[i : i + 1], weights), together[i : i + 1])
        assert torch.equal(gemv_kernel()(xw[2:5], weights), together[2:5])


def test_q8_planes_are_the_int8_values_with_bfloat16_scales() -> None:
    """Int4Linear's Q8_0 planes (q + 128 = 16 hi + lo, scales [d | 16 d]) repack to the
    values, with d rounded to bfloat16 as the int4 kernel holds it."""
    g = torch.Generator().manual_seed(3)
    values = torch.randint(-128, 128, (24, 64), generator=g)
    d = torch.rand(24, 2, generator=g) * 0.01
    u = values + 128
    planes = torch.cat([u % 16, u // 16], 1)
    weights = gemv_kernel().pack_planes(planes, torch.cat([d, 16 * d], 1), 64)
    x = rows(2, 64, seed=3)
    d16 = d.to(torch.bfloat16).double().repeat_interleave(32, 1)
    assert_rounded_from(gemv_kernel()(x, weights), x.double() @ (values.double() * d16).t())


def test_too_many_rows_and_odd_shapes_are_refused() -> None:
    nibbles, scales, zeros = random_q4(16, 64, seed=0)
    weights = q4_kernel().pack(nibbles, scales, zeros)
    with pytest.raises(RuntimeError, match="GEMV failed"):
        gemv_kernel()(rows(MAX_ROWS + 1, 64, seed=0), weights)
    with pytest.raises(ValueError, match="one scale per 32"):
        gemv_kernel().pack_q8(torch.zeros(8, 48, dtype=torch.int8), torch.ones(8, 1))
    assert gemv_kernel()(rows(0, 64, seed=0), weights).shape == (0, 16)


@pytest.mark.parametrize("rows", [slice(None), slice(5, 37), slice(16, 32), slice(3, 3)])
def test_unpacked_weights_are_the_products_rounded_to_bfloat16(rows) -> None:
    """Exact: each weight is the float product of its value and scale, rounded once; the
    partial strip's rows too, and none beyond them."""
    num_out, num_in = 37, 160
    g = torch.Generator().manual_seed(11)
    values = torch.randint(-128, 128, (num_out, num_in), generator=g)
    scales = torch.rand(num_out, num_in // 32, generator=g) * 0.01
    weights = gemv_kernel().pack_q8(values, scales)
    expected = values.float() * scales.repeat_interleave(32, 1)
    got = gemv_kernel().unpack(weights, rows)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, expected[rows].to(torch.bfloat16))
