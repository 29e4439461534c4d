from __future__ import annotations

import pytest
import torch

from superinfer.model.attention import AttentionMetadata, SeqEntry


def _build(entries: list[SeqEntry], block_size: int = 4) -> AttentionMetadata:
    return AttentionMetadata.build(entries, block_size, "cpu")


def test_mixed_step_by_hand() -> None:
    meta = _build(
        [
            SeqEntry(3, 0, [7]),  # fresh prompt: positions 0..2 in block 7
            SeqEntry(1, 5, [2, 9]),  # decode at position 5: block 9, offset 1
            SeqEntry(2, 9, [4, 1, 8]),  # chunk at positions 9, 10: block 8, offsets 1, 2
        ]
    )
    assert meta.num_tokens == 6
    assert meta.positions.tolist() == [0, 1, 2, 5, 9, 10]
    assert meta.slot_blocks.tolist() == [7, 7, 7, 9, 8, 8]
    assert meta.slot_offsets.tolist() == [0, 1, 2, 1, 1, 2]
    assert meta.logits_indices.tolist() == [2, 3, 5]

    decode = meta.decode
    assert decode.tokens == slice(3, 4) and decode.num_seqs == 1
    assert decode.block_ids.tolist() == [2, 9]
    assert decode.mask.shape == (1, 1, 1, 8)
    assert decode.mask.flatten().tolist() == [True] * 6 + [False] * 2

    fresh, chunk = meta.prefills
    assert fresh.tokens == slice(0, 3) and fresh.block_ids is None and fresh.mask is None
    assert chunk.tokens == slice(4, 6)
    assert chunk.block_ids.tolist() == [4, 1, 8]
    assert chunk.mask.shape == (2, 12)
    assert chunk.mask[0].tolist() == [True] * 10 + [False] * 2  # position 9 sees keys 0..9
    assert chunk.mask[1].tolist() == [True] * 11 + [False]


def test_decode_rows_split_by_a_prefill_are_indexed() -> None:
    meta = _build([SeqEntry(1, 3, [5]), SeqEntry(2, 0, [6]), SeqEntry(1, 0, [0])])
    assert meta.decode.tokens.tolist() == [0, 3]
    assert meta.decode.block_ids.tolist() == [5, 0]
    assert meta.decode.mask.view(2, -1).tolist() == [[True] * 4, [True] + [False] * 3]
    assert meta.logits_indices.tolist() == [0, 2, 3]


def test_decode_block_tables_are_padded_to_the_longest() -> None:
    meta = _build([SeqEntry(1, 8, [3, 4, 5, 11]), SeqEntry(1, 1, [6, 7])])
    assert meta.decode.block_ids.tolist() == [3, 4, 5, 6, 7, 0]
    lengths = meta.decode.mask.view(2, -1).sum(1).tolist()
    assert lengths == [9, 2]
    assert meta.slot_blocks.tolist() == [5, 6] and meta.slot_offsets.tolist() == [0, 1]


def test_pure_prefill_has_no_decode_batch() -> None:
    meta = _build([SeqEntry(5, 0, [1, 2]), SeqEntry(4, 4, [3, 0])])
    assert meta.decode is None and len(meta.prefills) == 2
    assert meta.slot_blocks.tolist() == [1, 1, 1, 1, 2, 0, 0, 0, 0]
    assert meta.positions.tolist() == [0, 1, 2, 3, 4, 4, 5, 6, 7]


@pytest.mark.parametrize(
    "entries",
    [
        [],
        [SeqEntry(0, 3, [1])],
        [SeqEntry(2, -1, [1])],
        [SeqEntry(3, 2, [1])],  # 5 tokens need two blocks of 4
    ],
)
def test_bad_entries_are_rejected(entries: list[SeqEntry]) -> None:
    with pytest.raises(ValueError):
        _build(entries)


def test_tensors_have_the_expected_dtypes() -> None:
    meta = _build([SeqEntry(1, 0, [0]), SeqEntry(2, 0, [1])])
    for t in (
        meta.positions,
        meta.slot_blocks,
        meta.slot_offsets,
        meta.logits_indices,
        meta.decode.block_ids,
    ):
        assert t.dtype == torch.long
    assert meta.decode.mask.dtype == torch.bool
