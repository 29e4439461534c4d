"""The quantized layers' CUDA kernels (PyTorch's tinygemm int4 and `torch._scaled_mm` FP8)
against the weights they stand for. Imports only torch and the two layers, so that
scripts/gpu_check.py can run it on a bare GPU image."""

from __future__ import annotations

import pytest
import torch

from superinfer.model.cuda_int4 import GROUP, CudaInt4Linear, cuda_int4_available
from superinfer.model.fp8_linear import Fp8Linear, quantize_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _planes(num_rows: int, num_inputs: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(3)
    nibbles = torch.randint(0, 16, (num_rows, num_inputs), generator=gen, dtype=torch.uint8)
    scales = torch.rand(num_rows, num_inputs // GROUP, generator=gen) * 0.02 + 0.005
    zeros = (torch.rand(num_rows, num_inputs // GROUP, generator=gen) - 0.5) * 0.1
    return nibbles, scales, zeros


def _weight(nibbles: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """w = (q - 8) scale + zero, the pairs rounded to bfloat16 as the kernel holds them."""
    s = scales.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    z = zeros.to(torch.bfloat16).float().repeat_interleave(GROUP, 1)
    return (nibbles.float() - 8) * s + z


@pytest.mark.skipif(not cuda_int4_available(), reason="no int4 kernel")
@pytest.mark.parametrize("shape", [(256, 512), (96, 1024), (64, 128)])
def test_cuda_int4_linear_is_its_weights_product(shape) -> None:
    planes = _planes(*shape)
    layer = CudaInt4Linear(*(p.cuda() for p in planes), bias=None)
    x = torch.randn(7, shape[1], device="cuda", dtype=torch.bfloat16)
    expected = x.float() @ _weight(*planes).cuda().t()
    scale = float(expected.abs().max())
    torch.testing.assert_close(layer(x).float(), expected, rtol=0.02, atol=0.01 * scale)


@pytest.mark.parametrize("is_static", [False, True])
def test_fp8_linear_is_the_product_of_its_rounded_inputs(is_static) -> None:
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(256, 512, generator=gen) * 0.05
    row_scales = w.abs().amax(1) / 448
    weight = (w / row_scales.unsqueeze(1)).to(torch.float8_e4m3fn)
    input_scale = torch.tensor(0.01) if is_static else None
    layer = Fp8Linear(weight.cuda(), row_scales.cuda(),
                      None if input_scale is None else input_scale.cuda(), None,
                      torch.bfloat16)  # fmt: skip
    x = torch.randn(9, 512, device="cuda", dtype=torch.bfloat16)
    x_fp8, x_scale = quantize_rows(x, None if input_scale is None else input_scale.cuda())
    expected = (x_fp8.float() * x_scale) @ (weight.float().cuda() * row_scales.cuda()[:, None]).t()
    torch.testing.assert_close(layer(x).float(), expected, rtol=0.02, atol=0.02)
