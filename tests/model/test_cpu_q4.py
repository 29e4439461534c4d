"""The 4-bit GEMM (`csrc/q4_linear.c`) against the weights Int4Linear dequantizes."""

from __future__ import annotations

import pytest
import torch

from superinfer.model.cpu_q4 import Q8Gemm, q4_kernel
from superinfer.model.quant import Int4Linear

pytestmark = pytest.mark.skipif(q4_kernel() is None, reason="no AVX-512 BF16 kernel here")


def random_q4(num_out: int, num_in: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    nibbles = torch.randint(0, 16, (num_out, num_in), generator=g, dtype=torch.uint8)
    scales = torch.rand(num_out, num_in // 32, generator=g) * 0.02
    zeros = torch.randn(num_out, num_in // 32, generator=g) * 0.02
    return nibbles, scales, zeros


@pytest.mark.parametrize("num_out, num_in", [(48, 64), (96, 32), (144, 160)])
def test_the_weights_are_the_dense_copy_bit_for_bit(num_out, num_in, rows_on) -> None:
    nibbles, scales, zeros = random_q4(num_out, num_in, seed=num_out)
    dense = Int4Linear(nibbles, scales, zeros, num_in).dequantized(
        nibbles, scales, zeros, torch.bfloat16
    )
    weights = q4_kernel().pack(nibbles, scales, zeros)
    # one weight per output: no sum to round
    got = weights(torch.eye(num_in, dtype=torch.bfloat16)).t()
    assert torch.equal(got, dense)


@pytest.mark.parametrize("num_rows", [1, 5, 12, 13, 16, 17, 25, 32, 40, 70])
@pytest.mark.parametrize("has_bias", [False, True])
def test_products_match_a_float_matmul_of_those_weights(num_rows, has_bias, rows_on) -> None:
    # a partial strip of 32 columns; tiles of 12 rows (AVX-512) or 2 x 16 (AMX) and a rest;
    # 3 AMX tiles of 32 inputs
    num_out, num_in = 80, 96
    nibbles, scales, zeros = random_q4(num_out, num_in, seed=num_rows)
    dense = Int4Linear(nibbles, scales, zeros, num_in).dequantized(
        nibbles, scales, zeros, torch.bfloat16
    )
    bias = torch.randn(num_out) if has_bias else None
    weights = q4_kernel().pack(nibbles, scales, zeros, bias)
    wide = torch.randn(num_rows, num_in + 6, dtype=torch.bfloat16)
    x = wide[:, 2 : 2 + num_in]  # rows a stride apart, not contiguous as a whole
    y = weights(x)
    reference = x.double() @ dense.double().t() + (0 if bias is None else bias.double())
    assert y.shape == (num_rows, num_out) and y.dtype == torch.bfloat16
    # float sums in another order, then one rounding to bfloat16
    torch.testing.assert_close(y.double(), reference, rtol=2**-8, atol=1e-4)


def test_odd_shapes_are_refused() -> None:
    nibbles, scales, zeros = random_q4(8, 64, seed=0)
    with pytest.raises(ValueError, match="one scale per 32"):
        q4_kernel().pack(nibbles[:, :48], scales, zeros)


def test_a_rows_result_does_not_depend_on_the_rows_beside_it(rows_on) -> None:
    """Within the GEMM: a request's row gives the same sums whichever tile it lands in."""
    nibbles, scales, zeros = random_q4(64, 128, seed=5)
    weights = q4_kernel().pack(nibbles, scales, zeros, torch.randn(64))
    x = torch.randn(45, 128, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(5))
    together = weights(x)
    for i in (0, 11, 12, 15, 16, 31, 32, 44):
        assert torch.equal(weights(x[i : i + 1]), together[i : i + 1])
    assert torch.equal(weights(x[9:30]), together[9:30])


def test_rows_past_a_block_run_in_blocks_with_the_same_results(rows_on) -> None:
    """The GEMM runs 1 MB of x's rows at a time (32 rows of 16,384 inputs): 70 rows are
    blocks of 32, 32 and 6, each row's result its own and the float matmul's."""
    num_out, num_in = 48, 16384
    nibbles, scales, zeros = random_q4(num_out, num_in, seed=7)
    dense = Int4Linear(nibbles, scales, zeros, num_in).dequantized(
        nibbles, scales, zeros, torch.bfloat16
    )
    weights = q4_kernel().pack(nibbles, scales, zeros, torch.randn(num_out))
    x = torch.randn(70, num_in, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(7))
    together = weights(x)
    for i in (0, 31, 32, 63, 64, 69):
        assert torch.equal(weights(x[i : i + 1]), together[i : i + 1])
    assert torch.equal(weights(x[30:40]), together[30:40])
    reference = x.double() @ dense.double().t() + weights.bias.double()
    torch.testing.assert_close(together.double(), reference, rtol=2**-8, atol=1e-3)


@pytest.mark.parametrize("num_out", [40, 64, 80])  # 40, 80: a last strip of 16 columns alone
def test_q8_0_weights_on_the_gemm(num_out, rows_on) -> None:
    """The GEMM over the GEMV's 8-bit layout: each weight d q rounded once (the GEMV's
    `unpack`, the dense copy's), products within one rounding of a float matmul, and a row's
    result its own."""
    from superinfer.model.cpu_gemv import gemv_kernel

    gemv = gemv_kernel()
    if gemv is None:
        pytest.skip("no GEMV kernel here")
    g = torch.Generator().manual_seed(num_out)
    values = torch.randint(-128, 128, (num_out, 96), generator=g, dtype=torch.int8)
    d = (torch.rand(num_out, 3, generator=g) * 0.01).to(torch.bfloat16).float()
    bias = torch.randn(num_out, generator=g)
    q8 = gemv.pack_q8(values, d, bias)
    gemm = Q8Gemm(q4_kernel(), q8)
    weights = Q8Gemm(q4_kernel(), gemv.pack_q8(values, d))(torch.eye(96, dtype=torch.bfloat16))
    assert torch.equal(weights.t(), gemv.unpack(q8))
    x = torch.randn(37, 96, dtype=torch.bfloat16, generator=g)
    y = gemm(x)
    reference = x.double() @ gemv.unpack(q8).double().t() + bias.double()
    torch.testing.assert_close(y.double(), reference, rtol=2**-8, atol=1e-4)
    for i in (0, 15, 16, 36):
        assert torch.equal(gemm(x[i : i + 1]), y[i : i + 1])
