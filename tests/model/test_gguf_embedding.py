"""A token embedding left in its GGUF blocks (`gguf_embedding.GGUFEmbedding`) against the
table the loader dequantizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from superinfer.model.gguf_checkpoint import _dequantize
from superinfer.model.gguf_embedding import GGUFEmbedding
from tests.model.gguf_tiny import quantize_q4_k
from tests.model.test_quant import _one_tensor_file

VOCAB, HIDDEN = 70, 512
Q = GGMLQuantizationType


def _table(tmp_path, qtype: GGMLQuantizationType):
    tmp_path.mkdir(exist_ok=True)
    weight = np.random.default_rng(3).standard_normal((VOCAB, HIDDEN)).astype(np.float32) * 0.1
    blocks = quantize_q4_k(weight) if qtype == Q.Q4_K else quantize(weight, qtype)
    (tensor,) = _one_tensor_file(tmp_path / "e.gguf", blocks, qtype).tensors
    return tensor


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q4_0, Q.Q5_0, Q.Q5_1], ids=lambda q: q.name)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_lookups_are_the_rows_of_the_dequantized_table(qtype, dtype, tmp_path) -> None:
    tensor = _table(tmp_path, qtype)
    table = GGUFEmbedding(tensor, dtype)
    dense = torch.from_numpy(_dequantize(tensor)).to(dtype)  # what the loader would hold
    ids = torch.tensor([[0, 7, 7], [VOCAB - 1, 3, 41]])
    got = table(ids)
    assert got.shape == (2, 3, HIDDEN) and got.dtype == dtype
    assert torch.equal(got, dense[ids])
    assert table(torch.tensor([], dtype=torch.int64)).shape == (0, HIDDEN)


def test_ids_out_of_range_and_float_tables_are_refused(tmp_path) -> None:
    table = GGUFEmbedding(_table(tmp_path / "q", Q.Q4_0), torch.bfloat16)
    for ids in ([VOCAB], [-1]):
        with pytest.raises(IndexError, match="out of range"):
            table(torch.tensor(ids))
    with pytest.raises(ValueError, match="not quantized"):
        GGUFEmbedding(_table(tmp_path / "f", Q.F16), torch.bfloat16)
