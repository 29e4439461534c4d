"""A token embedding left in its GGUF blocks, for the types without a kernel of their own.

A Q4_K_M file of a model with an untied head (Llama 3.1 8B, Mistral 7B, Qwen2.5 7B) stores
its token embedding as Q4_K: dequantized, Llama 3.1 8B's takes 1.05 GB in bfloat16, against
0.30 GB in the file. `GGUFEmbedding` keeps the tensor's bytes where the loader's reader has
them (the file's memory map: pages the kernel can drop and read again, not private memory),
and a lookup dequantizes only the rows it reads, with gguf's own dequantizer, to the values
the dense table would hold. Q8_0 and Q6_K tables have faster lookups of their own
(`quant.Q8Embedding`, `quant.Q6KEmbedding`).
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor
from gguf.quants import dequantize
from torch import Tensor, nn

# types stored as plain floats: dequantizing gains nothing
FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}


class GGUFEmbedding(nn.Module):
    """A frozen embedding table of a quantized GGUF tensor (vocab, hidden), looked up row by
    row: each looked-up row is gguf's dequantization of its blocks (float32), rounded to
    `dtype`."""

    def __init__(self, tensor: ReaderTensor, dtype: torch.dtype) -> None:
        super().__init__()
        if tensor.tensor_type in FLOAT_TYPES:
            raise ValueError(f"{tensor.name} is {tensor.tensor_type.name}, not quantized")
        self.num_embeddings, self.embedding_dim = int(tensor.shape[-1]), int(tensor.shape[0])
        self.rows = np.asarray(tensor.data).reshape(self.num_embeddings, -1)  # (V, row bytes)
        self.qtype, self.dtype = tensor.tensor_type, dtype

    def forward(self, ids: Tensor) -> Tensor:
        flat = ids.reshape(-1).cpu().numpy()
        if flat.size == 0:
            return torch.empty(*ids.shape, self.embedding_dim, dtype=self.dtype)
        if flat.min() < 0 or flat.max() >= self.num_embeddings:
            raise IndexError(f"token ids out of range for {self.num_embeddings} embeddings")
        values = dequantize(self.rows[flat], self.qtype).reshape(-1, self.embedding_dim)
        return torch.from_numpy(values).to(self.dtype).view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.qtype.name}"
