"""The C silu-and-multiply kernel against PyTorch's chunk, silu and multiply, and the gated
MLP's use of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from superinfer.model.cpu_act import act_kernel
from superinfer.model.decoder import GatedMLP

kernel = act_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="needs a C compiler and AVX-512")

EDGES = [0.0, -0.0, 100.0, -100.0, 88.8, -88.8, float("inf"), float("-inf"), float("nan"),
         1e-30, -1e-40, 3.0, -17.5, 0.75]  # fmt: skip


def reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate).mul_(up)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize(("num_rows", "inner"), [(1, 1536), (3, 40), (32, 1536), (300, 1000)])
def test_matches_pytorch_bit_for_bit(num_rows, inner):
    """Every output as PyTorch's, over ~wide values (exp's whole range), a tail of fewer
    than 16 columns, and enough rows for several threads."""
    gen = torch.Generator().manual_seed(num_rows)
    gate_up = (torch.randn(num_rows, 2 * inner, generator=gen) * 6).to(torch.bfloat16)
    assert same_bits(kernel(gate_up), reference(gate_up))


def test_edge_values():
    values = torch.tensor(EDGES)
    pairs = torch.cartesian_prod(values, values)  # every gate with every up
    gate_up = torch.cat([pairs[:, :1], pairs[:, 1:]], 1).to(torch.bfloat16)
    got, expected = kernel(gate_up), reference(gate_up)
    assert torch.equal(got.isnan(), expected.isnan())
    keep = ~expected.isnan()
    assert same_bits(got[keep], expected[keep]), "infinities, zeros' signs and underflow too"


def test_rows_of_a_wider_tensor():
    """gate/up rows read with their stride (a view of a wider buffer)."""
    wide = torch.randn(5, 100).to(torch.bfloat16)
    gate_up = wide[:, :64]
    assert gate_up.stride(0) == 100
    assert same_bits(kernel(gate_up), reference(gate_up))


def test_gated_mlp_runs_it_only_where_it_computes_the_same():
    mlp = GatedMLP(SimpleNamespace(hidden_size=32, intermediate_size=48, hidden_act="silu",
                                   mlp_bias=False))  # fmt: skip
    gate_up = torch.randn(4, 96)
    assert kernel.takes(gate_up.to(torch.bfloat16)) and not kernel.takes(gate_up)
    assert same_bits(mlp.gated(gate_up.to(torch.bfloat16)), reference(gate_up.to(torch.bfloat16)))
    assert torch.equal(mlp.gated(gate_up), reference(gate_up)), "float32 stays on PyTorch"
    mlp.act = lambda x: F.gelu(x, approximate="tanh")
    gelu = mlp.gated(gate_up.to(torch.bfloat16))
    gate, up = gate_up.to(torch.bfloat16).chunk(2, -1)
    assert torch.equal(gelu, F.gelu(gate, approximate="tanh").mul_(up)), "GeLU is not SiLU"
