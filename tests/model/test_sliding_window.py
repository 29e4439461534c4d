"""Sliding-window attention done for real: windowed layers skip the blocks out of the
window (decode and prefill, C kernel and gather + SDPA), so the engine frees them when every
layer is windowed (Mistral) and the greedy tokens stay those of transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig

import superinfer.model.attention as attention
from superinfer.core.kv import FREED_BLOCK
from superinfer.engine.kv_cache import freeable_window
from superinfer.model.attention import AttentionMetadata, SeqEntry, paged_attention
from superinfer.model.config import ModelConfig
from tests.model.tiny import TINY, save_tiny, tiny_configs

WINDOW = 24
PROMPTS = [[1, 17, 42, 99, 5, 63, 8, 120, 33, 71, 3, 64, 90],
           [1, 9, 4, 77, 31, 100, 6, 52, 14, 88, 23, 45, 67, 12, 80, 3, 39, 111, 27, 59, 7,
            10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]  # fmt: skip
NUM_NEW_TOKENS = 72


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> Path:
    config = MistralConfig(**TINY, sliding_window=WINDOW)
    return save_tiny(tmp_path_factory.mktemp("mistral-window"), config, seed=5)


@pytest.fixture(scope="module")
def reference(mistral) -> list[list[int]]:
    return _reference(mistral)


def _reference(directory: Path) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for ids in PROMPTS:
            tokens = model.generate(torch.tensor([ids]), max_new_tokens=NUM_NEW_TOKENS,
                                    min_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                                    pad_token_id=0)  # fmt: skip
            out.append(tokens[0, len(ids) :].tolist())
    return out


def _generate(directory: Path, block_size: int, **options):
    from superinfer import LLM, SamplingParams

    llm = LLM(str(directory), dtype="float32", device="cpu", block_size=block_size,
              max_model_len=160, check_invariants=True, **options)  # fmt: skip
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS,
                            temperature=0.0)  # fmt: skip
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        return [o.outputs[0].token_ids for o in outputs], llm.engine.scheduler
    finally:
        llm.engine.close()


@pytest.mark.parametrize("block_size", [4, 16])
def test_freeing_mistral_matches_transformers(mistral, reference, block_size) -> None:
    tokens, scheduler = _generate(mistral, block_size)
    assert scheduler.kv.sliding_window == WINDOW
    assert scheduler.kv.stats.num_window_freed_blocks > 0
    assert tokens == reference


def test_freeing_under_kv_pressure_matches_transformers(mistral, reference) -> None:
    """Room for one max_model_len sequence, less than 8 windows: requests are rotated out
    and back with their freed entries; the tokens stay those of transformers."""
    prompts = PROMPTS * 4
    from superinfer import LLM, SamplingParams

    llm = LLM(str(mistral), dtype="float32", device="cpu", block_size=4, policy="rotasched",
              num_device_blocks=40, max_model_len=160, check_invariants=True)  # fmt: skip
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS,
                            temperature=0.0)  # fmt: skip
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        stats, kv_stats = llm.engine.scheduler.stats, llm.engine.scheduler.kv.stats
    finally:
        llm.engine.close()
    assert stats.num_swap_outs + stats.num_preemptions > 0 and kv_stats.num_window_freed_blocks
    assert [o.outputs[0].token_ids for o in outputs] == reference * 4


def test_only_models_windowed_on_every_layer_free_blocks() -> None:
    configs = tiny_configs()

    def window_of(name: str) -> int | None:
        return freeable_window(ModelConfig.from_hf_config(configs[name].to_dict()))

    assert window_of("mistral") == 8
    assert window_of("gemma2") is None and window_of("gemma3") is None  # global layers
    assert window_of("llama") is None


def test_gemma_style_engine_frees_nothing(tmp_path) -> None:
    directory = save_tiny(tmp_path, tiny_configs()["gemma3"], seed=3)
    from superinfer import LLM, SamplingParams

    llm = LLM(str(directory), dtype="float32", device="cpu", block_size=4, max_model_len=80,
              check_invariants=True)  # fmt: skip
    try:
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=40))
        kv = llm.engine.scheduler.kv
        assert kv.sliding_window is None and kv.stats.num_window_freed_blocks == 0
    finally:
        llm.engine.close()


# --- attention: blocks out of the window are never read ---------------------------------
BS, LAYERS, KV_HEADS, HEADS, DIM = 4, 1, 2, 4, 16


def _windowed_vs_full(entries_full, entries_freed, window, use_kernel, monkeypatch):
    """Attention over tables whose out-of-window entries are freed (and the blocks behind
    them filled with NaN; block 0, the padding, stays finite) equals attention over the
    intact tables."""
    if not use_kernel:
        monkeypatch.setattr(attention, "decode_kernel", lambda: None)
    torch.manual_seed(0)
    cache = torch.randn(64, LAYERS, 2, BS, KV_HEADS, DIM)
    num_tokens = sum(e.num_query_tokens for e in entries_full)
    q = torch.randn(num_tokens, HEADS, DIM)
    k, v = torch.randn(num_tokens, KV_HEADS, DIM), torch.randn(num_tokens, KV_HEADS, DIM)
    full_meta = AttentionMetadata.build(entries_full, BS, "cpu")
    expected = paged_attention(q, k, v, cache.clone(), 0, full_meta, window=window)
    poisoned = cache.clone()
    for full, freed in zip(entries_full, entries_freed):
        for block, entry in zip(full.block_table, freed.block_table):
            if entry == FREED_BLOCK:
                poisoned[block] = float("nan")
    meta = AttentionMetadata.build(entries_freed, BS, "cpu")
    windowed = meta.windowed(window)
    if windowed.decode is not None:
        assert FREED_BLOCK not in windowed.decode.block_ids.tolist()
    for chunk in windowed.prefills:
        assert chunk.block_ids is None or FREED_BLOCK not in chunk.block_ids.tolist()
    got = paged_attention(q, k, v, poisoned, 0, meta, window=window)
    torch.testing.assert_close(got, expected)
    return windowed


def _freed(entry: SeqEntry, num_freed: int) -> SeqEntry:
    table = [FREED_BLOCK] * num_freed + list(entry.block_table[num_freed:])
    return SeqEntry(entry.num_query_tokens, entry.num_context_tokens, table)


@pytest.mark.parametrize("use_kernel", [True, False])
def test_decode_skips_blocks_out_of_the_window(use_kernel, monkeypatch) -> None:
    window = 10
    full = [SeqEntry(1, 40, list(range(1, 12))), SeqEntry(1, 5, [20, 21]),
            SeqEntry(1, 23, list(range(30, 36)))]  # fmt: skip
    # the query at 40 sees keys 31..40 (blocks 7..10); at 23, keys 14..23 (blocks 3..5)
    freed = [_freed(full[0], 7), full[1], _freed(full[2], 3)]
    windowed = _windowed_vs_full(full, freed, window, use_kernel, monkeypatch)
    assert windowed.decode.block_tables.shape[1] <= -(-window // BS) + 1  # only the window


@pytest.mark.parametrize("use_kernel", [True, False])
def test_prefill_chunk_skips_blocks_out_of_the_window(use_kernel, monkeypatch) -> None:
    window = 8
    # a chunk of 6 queries at 30..35 (first sees keys 23..30: blocks from 5) and a decode
    full = [SeqEntry(6, 30, list(range(1, 10))), SeqEntry(1, 17, list(range(40, 45)))]
    freed = [_freed(full[0], 5), _freed(full[1], 2)]
    windowed = _windowed_vs_full(full, freed, window, use_kernel, monkeypatch)
    assert windowed.prefills[0].block_ids.tolist() == list(range(6, 10))
