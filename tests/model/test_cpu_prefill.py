"""The C prefill-attention kernel (`csrc/paged_prefill.c`) against the reference path
(gathered keys + SDPA), through `paged_attention` as the model calls it."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch

from superinfer.model.attention import AttentionMetadata, GatherWorkspace, SeqEntry, paged_attention
from superinfer.model.cpu_attention import decode_kernel

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)


def _has_avx512_bf16() -> bool:
    try:
        return "avx512_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


BLOCK_SIZE, NUM_LAYERS, LAYER = 16, 2, 1


def _attend(entries, heads, head_dim, dtype, window, use_kernel, seed=0, block_size=BLOCK_SIZE):
    """Each entry's step through `paged_attention`: (output, cache after)."""
    num_heads, num_kv_heads = heads
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(len(e.block_table) for e in entries) + 4
    cache = torch.randn(num_blocks, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim,
                        generator=gen).to(dtype)  # fmt: skip
    meta = AttentionMetadata.build(entries, block_size, "cpu")
    qkv = torch.randn(meta.num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=gen)
    q, k, v = qkv.to(dtype).split([num_heads, num_kv_heads, num_kv_heads], 1)  # strided views
    with torch.inference_mode():
        out = paged_attention(q, k, v, cache, LAYER, meta, GatherWorkspace(), window=window,
                              use_kernel=use_kernel)  # fmt: skip
    return out, cache


def _entries(spans: list[tuple[int, int]], seed: int = 1, block_size: int = BLOCK_SIZE):
    """(context, query) spans, each sequence on shuffled blocks."""
    blocks = list(range(sum(-(-(c + n) // block_size) for c, n in spans) + 4))
    random.Random(seed).shuffle(blocks)
    out = []
    for context, num_query in spans:
        num = -(-(context + num_query) // block_size)
        out.append(SeqEntry(num_query, context, [blocks.pop() for _ in range(num)]))
    return out


@pytest.mark.parametrize(
    "spans, window",
    [([(0, 37)], None), ([(0, 256)], None), ([(100, 50)], None), ([(300, 300)], 200),
     ([(1000, 24)], 64), ([(0, 5), (40, 3), (0, 70)], None), ([(21, 40), (0, 1)], 30)],
)  # fmt: skip
@pytest.mark.parametrize(
    "heads, head_dim", [((9, 3), 64), ((8, 2), 128), ((4, 4), 32), ((16, 1), 64)]
)
def test_matches_the_reference(spans, window, heads, head_dim, rows_on):
    """Chunks without and with cached context, windows, several chunks in a step (with a
    decode), group sizes 3, 4, 1 and 16, on AVX-512 and on AMX tiles (where the GEMMs' rows
    run): within bfloat16's rounding of the reference."""
    entries = _entries(spans)
    got, cache = _attend(entries, heads, head_dim, torch.bfloat16, window, use_kernel=True)
    expected, expected_cache = _attend(entries, heads, head_dim, torch.bfloat16, window,
                                       use_kernel=False)  # fmt: skip
    assert torch.equal(cache, expected_cache)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("block_size", [8, 32])
def test_matches_the_reference_on_other_block_sizes(block_size, rows_on):
    """16 keys of a block are an AMX tile only where blocks hold a multiple of 16; with 8
    the kernel runs on AVX-512 there, with 32 a tile is half a block."""
    entries = _entries([(100, 90), (0, 40)], block_size=block_size)
    got, cache = _attend(entries, (9, 3), 64, torch.bfloat16, None, use_kernel=True,
                         block_size=block_size)  # fmt: skip
    expected, expected_cache = _attend(entries, (9, 3), 64, torch.bfloat16, None,
                                       use_kernel=False, block_size=block_size)  # fmt: skip
    assert torch.equal(cache, expected_cache)
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not _has_avx512_bf16(), reason="the kernel needs AVX-512 BF16")
def test_runs_where_the_cpu_has_avx512_bf16():
    kernel = decode_kernel()
    assert kernel is not None
    cache = torch.zeros(4, NUM_LAYERS, 2, BLOCK_SIZE, 3, 64, dtype=torch.bfloat16)
    q = torch.randn(20, 9, 64).to(torch.bfloat16)
    table = torch.tensor([2, 0], dtype=torch.long)
    out = kernel.prefill(q, cache, LAYER, table, 0, 0)
    assert out is not None and out.shape == q.shape
    assert torch.equal(out, torch.zeros_like(out)), "zero values give zero outputs"


def test_declines_what_it_does_not_run():
    kernel = decode_kernel()
    assert kernel is not None
    table = torch.tensor([0], dtype=torch.long)
    float_cache = torch.zeros(2, NUM_LAYERS, 2, BLOCK_SIZE, 2, 64)
    assert kernel.prefill(torch.zeros(4, 4, 64), float_cache, 0, table, 0, 0) is None
    odd_heads = torch.zeros(2, NUM_LAYERS, 2, BLOCK_SIZE, 2, 48, dtype=torch.bfloat16)
    q = torch.zeros(4, 4, 48, dtype=torch.bfloat16)
    assert kernel.prefill(q, odd_heads, 0, table, 0, 0) is None
