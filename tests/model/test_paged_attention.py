"""paged_attention against plain causal attention over each sequence's full K/V."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from superinfer.model.attention import AttentionMetadata, GatherWorkspace, SeqEntry, paged_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, NUM_LAYERS, LAYER = 4, 2, 8, 3, 1


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_context: int) -> torch.Tensor:
    """q (Tq, H, D) at positions num_context.., k/v (N, Hkv, D) of positions 0..N-1."""
    group = NUM_HEADS // NUM_KV_HEADS
    k, v = (x.repeat_interleave(group, 1).transpose(0, 1) for x in (k, v))  # (H, N, D)
    mask = torch.arange(k.shape[1]) <= torch.arange(num_context, num_context + q.shape[0])[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask).transpose(0, 1)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOLERANCE = {"cpu": {}, "cuda": {"rtol": 1e-4, "atol": 1e-4}}


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 7), st.integers(0, 13)), min_size=1, max_size=5),
    block_size=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_matches_dense_attention(
    device: str, seqs: list[tuple[int, int]], block_size: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    blocks = list(range(128))
    random.Random(seed).shuffle(blocks)
    cache = torch.randn(128, NUM_LAYERS, 2, block_size, NUM_KV_HEADS, HEAD_DIM, generator=gen)
    entries, full_k, full_v = [], [], []
    for num_query, num_context in seqs:
        num_blocks = -(-(num_query + num_context) // block_size) + 1  # one spare block
        table = [blocks.pop() for _ in range(num_blocks)]
        positions = torch.arange(num_context)
        ctx_blocks = torch.tensor(table)[positions // block_size]
        ctx_offsets = positions % block_size
        k_new, v_new = torch.randn(2, num_query, NUM_KV_HEADS, HEAD_DIM, generator=gen)
        full_k.append(torch.cat([cache[ctx_blocks, LAYER, 0, ctx_offsets], k_new]))
        full_v.append(torch.cat([cache[ctx_blocks, LAYER, 1, ctx_offsets], v_new]))
        entries.append(SeqEntry(num_query, num_context, table))
    k = torch.cat([fk[e.num_context_tokens :] for fk, e in zip(full_k, entries)])
    v = torch.cat([fv[e.num_context_tokens :] for fv, e in zip(full_v, entries)])
    q = torch.randn(k.shape[0], NUM_HEADS, HEAD_DIM, generator=gen)
    meta = AttentionMetadata.build(entries, block_size, device)
    on_device = [x.to(device) for x in (q, k, v, cache)]
    out = paged_attention(*on_device, LAYER, meta, GatherWorkspace()).cpu()
    rows = [e.num_query_tokens for e in entries]
    for e, q_seq, o_seq, fk, fv in zip(entries, q.split(rows), out.split(rows), full_k, full_v):
        expected = _reference(q_seq, fk, fv, e.num_context_tokens)
        torch.testing.assert_close(o_seq, expected, **TOLERANCE[device])
    # every new token's K/V landed in its slot of this layer
    cache = on_device[3].cpu()
    blocks, offsets = meta.slot_blocks.cpu(), meta.slot_offsets.cpu()
    torch.testing.assert_close(cache[blocks, LAYER, 0, offsets], k)
    torch.testing.assert_close(cache[blocks, LAYER, 1, offsets], v)
