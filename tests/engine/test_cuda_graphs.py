"""Decode graphs (`cuda_graphs.py`): the buckets, the static buffers and their padding
(driven on a CPU by replaying eagerly what a graph would capture, the Triton backend
through its interpreter), the runner's fallbacks, and on CUDA a real capture and replay."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from superinfer.core.outputs import ScheduledSequence, SchedulerOutput
from superinfer.engine.cuda_graphs import DecodeGraphs, EagerReplay, batch_sizes
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.model_runner import ModelRunner
from superinfer.model.attention import SeqEntry
from superinfer.model.attention_backend import TritonBackend
from superinfer.model.loader import load_model
from superinfer.sampling_params import SamplingParams
from tests.model.test_architectures import _saved

BLOCK_SIZE, MAX_BLOCKS = 4, 12


def test_buckets_follow_vllms_sizes_up_to_the_batch():
    assert batch_sizes(3) == (1, 2, 3)
    sizes = batch_sizes(64)
    assert sizes[:5] == (1, 2, 4, 8, 16) and sizes[-2:] == (56, 64)
    assert batch_sizes(256)[-1] == 256 and all(s % 8 == 0 for s in batch_sizes(256)[3:])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(str(_saved("llama", tmp_path_factory)), torch.float32, "cpu").model


def _cache(model, num_blocks: int = 128) -> torch.Tensor:
    c = model.config
    torch.manual_seed(0)
    return torch.randn(num_blocks, c.num_layers, 2, BLOCK_SIZE, c.num_kv_heads, c.head_dim)


def _decode_step(num_seqs: int, seed: int) -> tuple[list[SeqEntry], list[int]]:
    """Decode entries of different lengths over shuffled blocks (never block 0: capture
    writes there)."""
    rng = random.Random(seed)
    blocks = list(range(1, 128))
    rng.shuffle(blocks)
    entries, ids = [], []
    for _ in range(num_seqs):
        num_tokens = rng.randint(1, MAX_BLOCKS * BLOCK_SIZE)
        table = [blocks.pop() for _ in range(-(-num_tokens // BLOCK_SIZE))]
        entries.append(SeqEntry(1, num_tokens - 1, table))
        ids.append(rng.randrange(100))
    return entries, ids


@pytest.mark.parametrize("num_seqs", [1, 3, 5, 8])
def test_a_padded_replay_equals_the_eager_step(tiny, num_seqs, tmp_path_factory):
    pytest.importorskip("triton")
    # the compiled kernel on a GPU; on a CPU its interpreter (conftest.py set it at import)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = tiny
    if device.type == "cuda":  # loaded there: the CPU model's weights are packed for oneDNN
        model = load_model(str(_saved("llama", tmp_path_factory)), torch.float32, "cuda").model
    backend = TritonBackend(BLOCK_SIZE, device)
    eager_cache, graph_cache = _cache(model).to(device), _cache(model).to(device)
    graphs = DecodeGraphs(model, graph_cache, backend, [1, 2, 4, 8], MAX_BLOCKS)
    assert graphs.capture(EagerReplay)["num_graphs"] == 4
    entries, ids = _decode_step(num_seqs, seed=num_seqs)
    assert graphs.can_run(entries)
    with torch.inference_mode():
        meta = backend.build(entries)
        expected = model(torch.tensor(ids, device=device), meta.positions, eager_cache, meta)
        hidden, graph_meta = graphs.run(entries, ids)
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)
    assert graph_meta.logits_indices.tolist() == list(range(num_seqs))
    # the padding rows wrote only what the last real row wrote: every block but 0 agrees
    torch.testing.assert_close(graph_cache[1:], eager_cache[1:], rtol=1e-5, atol=1e-5)


def test_steps_that_do_not_fit_run_eagerly(tiny):
    graphs = DecodeGraphs(tiny, _cache(tiny), TritonBackend(BLOCK_SIZE, "cpu"), [1, 2], MAX_BLOCKS)
    entries, _ = _decode_step(2, seed=0)
    assert not graphs.can_run(entries)  # nothing captured yet
    graphs._replays = {1: None, 2: None}  # as after a capture
    assert graphs.can_run(entries)
    assert not graphs.can_run(_decode_step(3, seed=0)[0])  # larger than the largest bucket
    assert not graphs.can_run([SeqEntry(4, 0, [1])])  # a prefill chunk
    wide = SeqEntry(1, MAX_BLOCKS * BLOCK_SIZE, list(range(1, MAX_BLOCKS + 2)))
    assert not graphs.can_run([wide])  # its table is wider than the buffers


def _runner(model, **kwargs) -> ModelRunner:
    c = model.config
    kv = KVCacheTiers.allocate(48, 0, c.num_layers, BLOCK_SIZE, c.num_kv_heads, c.head_dim,
                               model.dtype, model.model.norm.weight.device)  # fmt: skip
    return ModelRunner(model, kv, BLOCK_SIZE, kv.device.device, **kwargs)


def test_the_runner_on_a_cpu_captures_nothing_and_says_why(tiny, caplog):
    runner = _runner(tiny, graph_batch_sizes=(1, 2), max_blocks_per_seq=MAX_BLOCKS)
    with caplog.at_level(logging.INFO, logger="superinfer.engine.model_runner"):
        assert runner.capture_graphs()["num_graphs"] == 0
    assert runner.graphs is None and "CUDA graphs off" in caplog.text


def _greedy(runner: ModelRunner, prompts: list[list[int]], num_new: int) -> list[list[int]]:
    greedy = SamplingParams(temperature=0, max_tokens=num_new)
    tables = [list(range(1 + 8 * i, 9 + 8 * i)) for i in range(len(prompts))]
    seqs = [ScheduledSequence(f"r{i}", p, 0, tables[i], True, greedy, 0)
            for i, p in enumerate(prompts)]  # fmt: skip
    out = [[] for _ in prompts]
    step = runner.execute(SchedulerOutput(0, seqs))
    for _ in range(num_new - 1):
        for i, p in enumerate(prompts):
            out[i].append(step.sampled_token_ids[f"r{i}"])
        seqs = [ScheduledSequence(f"r{i}", [out[i][-1]], len(p) + len(out[i]) - 1, tables[i],
                                  True, greedy, 0) for i, p in enumerate(prompts)]  # fmt: skip
        step = runner.execute(SchedulerOutput(0, seqs))
    for i in range(len(prompts)):
        out[i].append(step.sampled_token_ids[f"r{i}"])
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_replayed_graphs_give_the_eager_greedy_tokens_on_cuda(tmp_path_factory):
    pytest.importorskip("triton")
    model = load_model(str(_saved("llama", tmp_path_factory)), torch.float32, "cuda").model
    prompts = [[1, 17, 42, 99, 5], [1, 9, 4], [1, 50, 75, 19, 101, 36, 44]]
    eager = _greedy(_runner(model, attention_backend="triton"), prompts, 12)
    runner = _runner(model, attention_backend="triton", graph_batch_sizes=(1, 2, 4),
                     max_blocks_per_seq=8)  # fmt: skip
    report = runner.capture_graphs()
    assert report["num_graphs"] == 3 and runner.graphs is not None
    assert _greedy(runner, prompts, 12) == eager
