"""The GEMM over Q6_K's own layout (`q6k_linear`, `q6k_rows` in `csrc/q4_linear.c`) against
the weights the dequantized file holds."""

from __future__ import annotations

import pytest
import torch

from superinfer.model.cpu_gemv import gemv_kernel
from superinfer.model.cpu_q4 import Q6K_SCALED_MAX_ROWS, q4_kernel
from tests.model.test_cpu_gemv import q6_k_scales, random_q6_k, rows

pytestmark = pytest.mark.skipif(
    q4_kernel() is None or gemv_kernel() is None, reason="no AVX-512 BF16 kernel here"
)


def dequantized(values: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The weights as gguf's dequantizer computes them: (d sc) q in float32."""
    return values.float() * q6_k_scales(sc, d).repeat_interleave(16, 1)


@pytest.mark.parametrize("num_out, num_in", [(16, 256), (37, 512), (64, 768), (81, 256)])
def test_the_weights_are_the_dense_copy_bit_for_bit(num_out, num_in, rows_on) -> None:
    """Strips of 32 columns made of two of Q6_K's 16 (or one and zeros), every value, sc
    and both signs of d."""
    values, sc, d = random_q6_k(num_out, num_in, seed=num_out)
    weights = gemv_kernel().pack_q6_k(values, sc, d)
    expected = dequantized(values, sc, d).to(torch.bfloat16)
    # one weight per output: no sum to round, whether the weights are rounded (all the
    # rows at once) or d sc scales a sum (a few rows at a time)
    eye = torch.eye(num_in, dtype=torch.bfloat16)
    assert torch.equal(q4_kernel().linear_q6k(eye, weights).t(), expected)
    few = Q6K_SCALED_MAX_ROWS
    got = torch.cat(
        [q4_kernel().linear_q6k(eye[i : i + few], weights) for i in range(0, num_in, few)]
    )
    assert torch.equal(got.t(), expected)


@pytest.mark.parametrize("num_rows", [1, 9, 13, 24, 25, 40])
@pytest.mark.parametrize("has_bias", [False, True])
def test_products_match_a_float64_matmul_of_those_weights(num_rows, has_bias, rows_on) -> None:
    num_out, num_in = 53, 512  # a partial strip of 32 columns; tiles (6, 12 rows) and a rest
    values, sc, d = random_q6_k(num_out, num_in, seed=num_rows)
    bias = torch.randn(num_out) if has_bias else None
    weights = gemv_kernel().pack_q6_k(values, sc, d, bias)
    x = rows(num_rows, num_in, seed=num_rows)
    # up to Q6K_SCALED_MAX_ROWS rows AVX-512 scales sums of x (q - 32) by d sc, as the
    # GEMV does; beyond, and on AMX, it multiplies by the weights rounded to bfloat16
    w = dequantized(values, sc, d)
    is_scaled = num_rows <= Q6K_SCALED_MAX_ROWS and rows_on == "avx512"
    w = (w if is_scaled else w.to(torch.bfloat16)).double()
    reference = x.double() @ w.t() + (0 if bias is None else bias.double())
    y = q4_kernel().linear_q6k(x, weights)
    assert y.shape == (num_rows, num_out) and y.dtype == torch.bfloat16
    # float sums in another order, then one rounding to bfloat16
    torch.testing.assert_close(y.double(), reference, rtol=2**-8, atol=1e-4)


def test_rows_are_the_dequantized_values_exactly() -> None:
    values, sc, d = random_q6_k(45, 512, seed=11)
    weights = gemv_kernel().pack_q6_k(values, sc, d)
    ids = torch.tensor([[44, 0, 17], [16, 31, 32]])
    got = q4_kernel().q6k_rows(weights, ids)
    assert got.shape == (2, 3, 512) and got.dtype == torch.float32
    assert torch.equal(got, dequantized(values, sc, d)[ids])


def test_out_of_range_ids_and_odd_shapes_are_refused() -> None:
    weights = gemv_kernel().pack_q6_k(*random_q6_k(20, 256, seed=1))
    with pytest.raises(IndexError, match="out of range"):
        q4_kernel().q6k_rows(weights, torch.tensor([3, 20]))
    with pytest.raises(IndexError, match="out of range"):
        q4_kernel().q6k_rows(weights, torch.tensor([-1]))
    with pytest.raises(ValueError, match="inputs"):
        q4_kernel().linear_q6k(rows(3, 128, seed=0), weights)  # the layer takes 256
