"""The C decode-attention kernel against dense attention over each sequence's own K/V."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from superinfer.model import cpu_attention
from superinfer.model.cpu_attention import decode_kernel

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)

NUM_LAYERS, LAYER, BLOCK_SIZE = 3, 1, 16


def _case(
    lengths: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int = 0,
    block_size: int = BLOCK_SIZE,
):
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 8
    cache = torch.randn(num_blocks, NUM_LAYERS, 2, block_size, num_kv_heads, head_dim,
                        generator=gen).to(dtype)  # fmt: skip
    max_blocks = max(-(-n // block_size) for n in lengths)
    shuffled = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(lengths), max_blocks, dtype=torch.long)
    for seq, n in enumerate(lengths):
        for i in range(-(-n // block_size)):
            tables[seq, i] = shuffled.pop()
    q = torch.randn(len(lengths), num_heads, head_dim, generator=gen).to(dtype)
    return q, cache, tables, torch.tensor(lengths)


def _reference(q, cache, tables, lengths, starts=None) -> torch.Tensor:
    num_heads, num_kv_heads, head_dim = q.shape[1], cache.shape[-2], cache.shape[-1]
    rows = []
    for seq, n in enumerate(lengths.tolist()):
        first = 0 if starts is None else int(starts[seq])
        k, v = (cache[tables[seq], LAYER, i].reshape(-1, num_kv_heads, head_dim)[first:n]
                .float().transpose(0, 1) for i in (0, 1))  # fmt: skip
        group_q = q[seq].float().view(num_kv_heads, num_heads // num_kv_heads, head_dim)
        rows.append(F.scaled_dot_product_attention(group_q, k, v).reshape(num_heads, head_dim))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 1)])
# bfloat16 with a multiple of 32 takes the AVX-512 BF16 loops where the CPU has them
@pytest.mark.parametrize("head_dim", [64, 128, 96, 80])
def test_matches_dense_attention(dtype, tolerance, heads, head_dim, rows_on):
    """On AMX (bfloat16, 16-token groups of a block as tiles) and on AVX-512 alike."""
    kernel = decode_kernel()
    assert kernel is not None, "a compiler is here, so the kernel must build"
    # one token, block edges, several 256-token partitions, and a batch of mixed lengths
    lengths = [1, 15, 16, 17, 256, 257, 1000, 3]
    q, cache, tables, seq_lens = _case(lengths, *heads, head_dim=head_dim, dtype=dtype)
    assert kernel.supports(cache, heads[0])
    out = kernel(q, cache, LAYER, tables, seq_lens)
    expected = _reference(q, cache, tables, seq_lens)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)


# 32: two 16-token tiles a block on AMX; 8: a block smaller than a tile (AVX-512 only)
@pytest.mark.parametrize("block_size", [32, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_other_block_sizes(block_size, head_dim, rows_on):
    kernel = decode_kernel()
    assert kernel is not None
    lengths = [1, 31, 32, 33, 63, 64, 65, 300]
    q, cache, tables, seq_lens = _case(lengths, 9, 3, head_dim, torch.bfloat16, seed=3,
                                       block_size=block_size)  # fmt: skip
    out = kernel(q, cache, LAYER, tables, seq_lens)
    expected = _reference(q, cache, tables, seq_lens)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_a_window_reads_from_each_key_start(dtype, tolerance, rows_on):
    kernel = decode_kernel()
    assert kernel is not None
    lengths = [40, 300, 700, 5]
    q, cache, tables, seq_lens = _case(lengths, 9, 3, 64, dtype)
    starts = torch.tensor([7, 45, 100, 0])  # not on block or 16-token edges but the last
    out = kernel(q, cache, LAYER, tables, seq_lens, key_starts=starts)
    expected = _reference(q, cache, tables, seq_lens, starts)
    torch.testing.assert_close(out.float(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reads_only_its_own_layer_and_blocks(dtype, rows_on):
    kernel = decode_kernel()
    assert kernel is not None
    q, cache, tables, seq_lens = _case([40, 70], 9, 3, 64, dtype)
    before = kernel(q, cache, LAYER, tables, seq_lens)
    used = set(tables.flatten().tolist())
    unused = [b for b in range(cache.shape[0]) if b not in used]
    cache[unused] = float("nan")  # other blocks
    cache[:, LAYER + 1] = float("nan")  # another layer
    # slots past each sequence's length in its last block
    cache[tables[0, 2], LAYER, :, 40 - 32 :] = float("nan")
    torch.testing.assert_close(kernel(q, cache, LAYER, tables, seq_lens), before)


def test_unsupported_shapes_and_dtypes_are_declined():
    kernel = decode_kernel()
    assert kernel is not None
    _, cache, _, _ = _case([4], 9, 3, 64, torch.float16)
    assert not kernel.supports(cache, 9)
    _, cache, _, _ = _case([4], 9, 3, 512, torch.float32)
    assert not kernel.supports(cache, 9)


@pytest.fixture
def fresh_lookup():
    """`decode_kernel` looks again under this test's environment, and again afterwards."""
    cpu_attention.decode_kernel.cache_clear()
    yield
    cpu_attention.decode_kernel.cache_clear()


def test_disabled_by_environment(monkeypatch, fresh_lookup):
    monkeypatch.setenv("SUPERINFER_CPU_KERNELS", "0")
    assert cpu_attention.decode_kernel() is None


def test_a_failed_build_falls_back(monkeypatch, tmp_path, fresh_lookup):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("SUPERINFER_KERNEL_CACHE", str(tmp_path / "cache"))
    assert cpu_attention.decode_kernel() is None


def _written(kernel_write: bool, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """A step's K/V rows (views of a fused projection, as the model passes them) written
    into a cache by the C kernel or by indexed assignment."""
    from superinfer.model.attention import AttentionMetadata, SeqEntry, write_kv

    gen = torch.Generator().manual_seed(7)
    num_kv_heads, head_dim = 3, 64
    cache = torch.zeros(12, NUM_LAYERS, 2, BLOCK_SIZE, num_kv_heads, head_dim, dtype=dtype)
    entries = [SeqEntry(20, 0, [4, 9]), SeqEntry(1, 37, [1, 2, 11]), SeqEntry(3, 14, [0, 6])]
    meta = AttentionMetadata.build(entries, BLOCK_SIZE, "cpu")
    qkv = torch.randn(meta.num_tokens, (9 + 2 * num_kv_heads) * head_dim, generator=gen)
    sizes = [9 * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    _, k, v = qkv.to(dtype).split(sizes, -1)
    k, v = k.view(-1, num_kv_heads, head_dim), v.reshape(-1, num_kv_heads, head_dim)
    if kernel_write:
        kernel = decode_kernel()
        assert kernel.can_write(cache, k, v)
        kernel.write_kv(cache, LAYER, k, v, meta.slot_blocks, meta.slot_offsets)
    else:
        write_kv(cache, LAYER, k, v, meta)
    return cache, meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_indexed_assignment(dtype):
    assert decode_kernel() is not None
    cache, _ = _written(True, dtype)
    expected, _ = _written(False, dtype)
    assert torch.equal(cache, expected)
    assert cache.abs().sum() > 0


def test_write_kv_refuses_a_slot_outside_the_cache():
    kernel = decode_kernel()
    assert kernel is not None
    cache = torch.zeros(2, NUM_LAYERS, 2, BLOCK_SIZE, 1, 8)
    k = v = torch.ones(1, 1, 8)
    with pytest.raises(IndexError):
        kernel.write_kv(cache, 0, k, v, torch.tensor([2]), torch.tensor([0]))
    with pytest.raises(IndexError):
        kernel.write_kv(cache, 0, k, v, torch.tensor([0]), torch.tensor([BLOCK_SIZE]))
    assert cache.abs().sum() == 0
    assert not kernel.can_write(cache, k.to(torch.bfloat16), v.to(torch.bfloat16))
