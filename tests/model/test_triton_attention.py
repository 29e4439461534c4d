"""The Triton unified attention kernel against `paged_attention`, on the GPU when there is
one and otherwise through Triton's CPU interpreter.

The kernel reads a copy of the cache in which every slot that no query may read (other
layers, unused blocks, the tails of last blocks, freed blocks) is NaN, so any stray load
shows up in the output."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

# Before triton's first use: the kernel is jitted when first called, and triton reads
# TRITON_INTERPRET when it decorates (jits) a function, not when it launches one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from superinfer.core.kv import FREED_BLOCK
from superinfer.model import triton_attention
from superinfer.model.attention import AttentionMetadata, SeqEntry, paged_attention
from superinfer.model.triton_attention import unified_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_LAYERS, LAYER = 2, 1
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}

UNAVAILABLE = triton_attention.is_available(DEVICE)
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


@dataclass
class Case:
    seqs: list[tuple[int, int]]  # (num_query_tokens, num_context_tokens) in packing order
    block_size: int = 16
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    dtype: torch.dtype = torch.float32
    window: int | None = None
    softcap: float | None = None
    scale: float | None = None
    seed: int = 0
    nan_freed: bool = False  # the kernel's tables name a NaN block, not FREED_BLOCK


def _entries(case: Case, num_blocks: int) -> list[SeqEntry]:
    """Shuffled, non-consecutive block tables; blocks no query of the step sees under the
    window are FREED_BLOCK."""
    free = list(range(num_blocks))
    random.Random(case.seed).shuffle(free)
    entries = []
    for num_query, num_context in case.seqs:
        num_tokens = num_query + num_context
        table = [free.pop() for _ in range(-(-num_tokens // case.block_size))]
        if case.window is not None:
            first = max(0, num_context - case.window + 1) // case.block_size
            table[:first] = [FREED_BLOCK] * first
        entries.append(SeqEntry(num_query, num_context, table))
    return entries


def _poisoned(cache: torch.Tensor, entries: list[SeqEntry], block_size: int) -> torch.Tensor:
    """`cache` with NaN in every slot but the tokens of `entries` in layer LAYER."""
    out = torch.full_like(cache, float("nan"))
    for e in entries:
        for pos in range(e.num_tokens):
            block = e.block_table[pos // block_size]
            if block != FREED_BLOCK:
                out[block, LAYER, :, pos % block_size] = cache[block, LAYER, :, pos % block_size]
    return out


def _kernel_inputs(entries: list[SeqEntry], freed: int) -> dict[str, torch.Tensor]:
    counts = torch.tensor([e.num_query_tokens for e in entries])
    width = max(len(e.block_table) for e in entries) + 1  # padding the kernel never reads
    tables = [[freed if b == FREED_BLOCK else b for b in e.block_table] for e in entries]
    tables = [t + [FREED_BLOCK] * (width - len(t)) for t in tables]
    return {
        "query_start_loc": torch.cat([counts.new_zeros(1), counts.cumsum(0)]).int().to(DEVICE),
        "seq_lens": torch.tensor([e.num_tokens for e in entries], dtype=torch.int32).to(DEVICE),
        "block_tables": torch.tensor(tables, dtype=torch.int32).to(DEVICE),
    }


def _prepare(case: Case) -> tuple[torch.Tensor, torch.Tensor, dict, torch.Tensor]:
    """(q, poisoned kv_cache, the kernel's other inputs, reference output) for `case`; the
    reference runs in float32 on the same (rounded) inputs."""
    gen = torch.Generator().manual_seed(case.seed)
    num_blocks = sum(-(-(q + c) // case.block_size) for q, c in case.seqs) + 3
    entries = _entries(case, num_blocks)
    num_tokens = sum(q for q, _ in case.seqs)
    shape = (num_blocks, NUM_LAYERS, 2, case.block_size, case.num_kv_heads, case.head_dim)
    cache = torch.randn(shape, generator=gen).to(case.dtype).float()
    q = torch.randn(num_tokens, case.num_heads, case.head_dim, generator=gen)
    k, v = torch.randn(2, num_tokens, case.num_kv_heads, case.head_dim, generator=gen)
    q, k, v = (x.to(case.dtype).float() for x in (q, k, v))
    meta = AttentionMetadata.build(entries, case.block_size, "cpu")
    options = {"window": case.window, "softcap": case.softcap, "scale": case.scale}
    expected = paged_attention(q, k, v, cache, LAYER, meta, **options)  # writes k/v first
    kv_cache = _poisoned(cache, entries, case.block_size).to(DEVICE, case.dtype)
    used = {b for e in entries for b in e.block_table}
    freed = min(set(range(num_blocks)) - used) if case.nan_freed else FREED_BLOCK
    max_query_len = max(q for q, _ in case.seqs)
    inputs = _kernel_inputs(entries, freed) | options | {"max_query_len": max_query_len}
    return q.to(DEVICE, case.dtype), kv_cache, inputs, expected


def _check(case: Case) -> None:
    q, kv_cache, inputs, expected = _prepare(case)
    out = unified_attention(q, kv_cache, LAYER, **inputs)
    assert out.dtype == case.dtype and out.shape == expected.shape
    tol = TOLERANCE[case.dtype]
    torch.testing.assert_close(out.float().cpu(), expected, rtol=tol, atol=tol)


def _edges(block_size: int) -> list[tuple[int, int]]:
    """Decode and prefill sequences whose lengths sit on block edges, with and without
    cached context, in one step."""
    b = block_size
    return [(1, b - 2), (b - 1, 0), (1, b - 1), (b, 0), (1, b), (b + 1, 0), (3, 2 * b - 2),
            (1, 0), (b + 5, b - 1), (2, 3 * b + 1)]  # fmt: skip


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(2, 2), (6, 2), (8, 1)])
def test_mixed_step_at_block_edges(block_size: int, num_heads: int, num_kv_heads: int) -> None:
    _check(Case(_edges(block_size), block_size, num_heads, num_kv_heads))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
def test_half_precision(dtype: torch.dtype, block_size: int) -> None:
    _check(Case(_edges(block_size), block_size, 6, 2, dtype=dtype, seed=1))


@pytest.mark.parametrize("block_size", [16, 32])
def test_decode_only(block_size: int) -> None:
    seqs = [(1, n) for n in (0, 5, block_size - 1, block_size, block_size + 1, 100)]
    _check(Case(seqs, block_size, 8, 2, seed=2))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_over_several_wide_key_tiles(head_dim: int) -> None:
    """Decode walks 128 keys a step (64 at head dim 256): contexts that end inside, at and
    past a tile's edge, several tiles long."""
    seqs = [(1, n) for n in (127, 128, 300, 1000)]
    _check(Case(seqs, 16, 8, 2, head_dim=head_dim, seed=7))


def test_decode_tiles_are_wide_and_prefill_tiles_are_not() -> None:
    tile_sizes = triton_attention._tile_sizes
    assert tile_sizes(4, 1, 16, 128) == (16, 128)
    assert tile_sizes(3, 1, 16, 64)[1] == 128
    assert tile_sizes(8, 1, 16, 256)[1] == 64
    assert tile_sizes(4, 1, 256, 128)[1] == 256  # never narrower than a cache block
    assert tile_sizes(4, 64, 16, 128) == (64, 32)  # prefill: more query rows, fewer keys


@pytest.mark.parametrize("head_dim", [8, 80, 96, 128])
def test_head_dims(head_dim: int) -> None:
    """Powers of two, and sizes padded to the next one with a mask."""
    _check(Case([(1, 40), (9, 23), (20, 0)], head_dim=head_dim, seed=3))


@pytest.mark.parametrize("nan_freed", [False, True])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("window", [5, 20, 40])
def test_sliding_window_skips_freed_blocks(block_size: int, window: int, nan_freed: bool) -> None:
    """Blocks before the first one a query sees are never read: FREED_BLOCK, or, to catch
    a read for sure, a block of NaN."""
    seqs = [(1, 90), (30, 45), (70, 0), (1, window - 1), (4, window), (1, 3)]
    _check(Case(seqs, block_size, 6, 2, window=window, seed=4, nan_freed=nan_freed))


def test_sliding_window_bf16() -> None:
    _check(Case([(1, 90), (30, 45), (70, 0)], 16, 6, 2, dtype=torch.bfloat16, window=20, seed=5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softcap_and_scale(dtype: torch.dtype) -> None:
    case = Case([(1, 50), (12, 20), (33, 0)], 16, 8, 2, dtype=dtype, softcap=5.0, scale=0.3)
    _check(case)
    _check(Case(case.seqs, 16, 8, 2, dtype=dtype, window=17, softcap=2.0, seed=6))


def test_long_sequences() -> None:
    """Total lengths up to 2000: a long decode, a chunk over a long cached context, a long
    prefill."""
    _check(Case([(1, 1999), (300, 1700), (1, 700)], 16, 4, 1, head_dim=64, seed=7))


def test_long_prefill_with_window() -> None:
    _check(Case([(1000, 0), (200, 1800)], 32, 2, 1, head_dim=64, window=300, seed=8))


@settings(max_examples=25, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 70)), min_size=1, max_size=6),
    block_size=st.sampled_from([16, 32]),
    heads=st.sampled_from([(2, 2), (6, 2), (8, 1)]),
    window=st.one_of(st.none(), st.integers(1, 60)),
    softcap=st.one_of(st.none(), st.just(3.0)),
    seed=st.integers(0, 2**16),
)
def test_random_steps(
    seqs: list[tuple[int, int]],
    block_size: int,
    heads: tuple[int, int],
    window: int | None,
    softcap: float | None,
    seed: int,
) -> None:
    _check(Case(seqs, block_size, *heads, head_dim=32, window=window, softcap=softcap, seed=seed))


def test_strided_queries_into_given_out() -> None:
    """q as a view into a fused qkv projection; the result lands in a strided `out`."""
    q, kv_cache, inputs, expected = _prepare(Case([(1, 30), (7, 9), (1, 0)], 16, 4, 2, seed=9))
    num_tokens, num_heads, head_dim = q.shape
    qkv = torch.zeros(num_tokens, num_heads + 4, head_dim, device=DEVICE)
    qkv[:, :num_heads] = q
    buffer = torch.full((num_tokens, num_heads, 2 * head_dim), float("nan"), device=DEVICE)
    out = buffer[..., :head_dim]
    result = unified_attention(qkv[:, :num_heads], kv_cache, LAYER, out=out, **inputs)
    assert result is out
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert buffer[..., head_dim:].isnan().all()


def test_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_attention.is_available("cpu") is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "CUDA" in triton_attention.is_available("cpu")
    monkeypatch.setattr(triton_attention, "triton", None)
    assert triton_attention.is_available("cuda") == "triton is not installed"
