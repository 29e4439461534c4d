"""The C argmax (`csrc/argmax.c`) against PyTorch's `argmax(dim=-1)`."""

from __future__ import annotations

import pytest
import torch

from superinfer.model.cpu_argmax import argmax, argmax_kernel

pytestmark = pytest.mark.skipif(argmax_kernel() is None, reason="needs a C compiler and AVX-512")


@pytest.mark.parametrize("shape", [(1, 49152), (32, 49152), (7, 17), (3, 5), (5, 100003)])
def test_matches_pytorch(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[1]))
    assert torch.equal(argmax(x), x.argmax(-1))


def test_ties_infinities_and_nan_as_pytorch():
    """The first index of the largest value, in the vectors and in the tail; a row of
    -inf gives 0; a row with a NaN gives PyTorch's answer (its first NaN)."""
    x = torch.zeros(6, 100)
    x[0, 37] = x[0, 90] = 1.0  # a tie across lanes
    x[1, :] = float("-inf")
    x[2, 5] = x[2, 70] = float("inf")
    x[3, 64:] = 2.0  # the tie starts in the vectors and runs into the tail (96..99)
    x[4, 98] = x[4, 99] = 3.0  # only in the tail
    x[5, 50] = float("nan")
    x[5, 80] = float("nan")
    assert torch.equal(argmax(x), x.argmax(-1))
    assert argmax(x).tolist() == [37, 0, 5, 64, 98, 50]


def test_strided_rows_and_other_dtypes():
    y = torch.randn(10, 300)[:, ::2]  # columns not contiguous: copied first
    assert torch.equal(argmax(y), y.argmax(-1))
    z = torch.randn(4, 64, dtype=torch.bfloat16)  # left to PyTorch
    assert torch.equal(argmax(z), z.argmax(-1))
    assert argmax(torch.empty(0, 10)).shape == (0,)
