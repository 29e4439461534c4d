"""Every registered architecture against transformers' own implementation: tiny random
models built with its config classes, float32, greedy over 32 steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from superinfer.model.loader import load_model
from superinfer.model.registry import architectures
from tests.model.paged import PagedRun
from tests.model.tiny import save_tiny, tiny_configs

CONFIGS = tiny_configs()
PROMPTS = [[1, 17, 42, 99, 5, 63, 8, 120, 33, 71, 3, 64, 90],
           [1, 9, 4, 77, 31, 100, 6, 52, 14, 88, 23, 45, 67, 12, 80, 3, 39, 111, 27, 59, 7],
           [1, 50, 75, 19, 101, 36, 44]]  # fmt: skip
PLANS = [[5, 0, -1], [7, 9, -1], [0, 3, -1]]  # prefill chunk sizes per step (0 idle, -1 rest)
NUM_NEW_TOKENS = 32
EOS = 2


_SAVED: dict[str, Path] = {}


def _saved(name: str, tmp_path_factory) -> Path:
    if name not in _SAVED:
        _SAVED[name] = save_tiny(tmp_path_factory.mktemp(name), CONFIGS[name], seed=3)
    return _SAVED[name]


@pytest.fixture(scope="module", params=list(CONFIGS))
def tiny(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, _saved(request.param, tmp_path_factory)


def _reference(directory: Path) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for ids in PROMPTS:  # one at a time: no padding in the reference
            tokens = model.generate(torch.tensor([ids]), max_new_tokens=NUM_NEW_TOKENS,
                                    min_new_tokens=NUM_NEW_TOKENS, do_sample=False,
                                    pad_token_id=0)  # fmt: skip
            out.append(tokens[0, len(ids) :].tolist())
    return out


def _chunked_greedy(run: PagedRun) -> list[list[int]]:
    """Prefill each prompt in its plan's chunks, decode the others meanwhile, all sequences
    packed in each step; the end-of-sequence token is banned (as min_new_tokens does)."""
    seqs = [run.add(p) for p in PROMPTS]
    generated: list[list[int]] = [[] for _ in PROMPTS]
    step = 0
    while any(len(g) < NUM_NEW_TOKENS for g in generated):
        work = []
        for seq, prompt, plan in zip(seqs, PROMPTS, PLANS):
            remaining = len(prompt) - run.num_cached[seq]
            size = plan[step] if step < len(plan) else -1
            if remaining > 0 and size != 0:
                work.append((seq, remaining if size < 0 else min(size, remaining)))
            elif remaining <= 0 and len(generated[seq]) < NUM_NEW_TOKENS:
                work.append((seq, 1))
        logits = run.step(work).clone()
        logits[:, EOS] = float("-inf")
        for (seq, _), row in zip(work, logits):
            if run.num_cached[seq] == len(run.tokens[seq]):  # sampled a new token
                generated[seq].append(int(row.argmax()))
                run.tokens[seq].append(generated[seq][-1])
        step += 1
    return generated


def test_every_architecture_has_a_tiny_model() -> None:
    loaded_names = {type(c).__name__.replace("Config", "ForCausalLM") for c in CONFIGS.values()}
    loaded_names = {n.replace("TextForCausalLM", "ForCausalLM") for n in loaded_names}
    assert loaded_names == set(architectures())


def test_greedy_batched_chunked_matches_transformers(tiny) -> None:
    name, directory = tiny
    loaded = load_model(str(directory), torch.float32, "cpu")
    assert loaded.checkpoint.architecture == CONFIGS[name].architectures[0]
    expected = _reference(directory)
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == expected


def test_prefill_logits_match_transformers(tiny) -> None:
    _name, directory = tiny
    loaded = load_model(str(directory), torch.float32, "cpu", pack_weights=False)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    run = PagedRun(loaded.model, num_blocks=64, block_size=4)
    seqs = [run.add(p) for p in PROMPTS]
    logits = run.step([(s, len(p)) for s, p in zip(seqs, PROMPTS)], all_logits=True)
    for rows, ids in zip(logits.split([len(p) for p in PROMPTS]), PROMPTS):
        with torch.inference_mode():
            expected = reference(torch.tensor([ids])).logits[0]
        torch.testing.assert_close(rows, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("policy", ["rotasched", "fcfs-recompute"])
@pytest.mark.parametrize("name", ["mistral", "gemma3", "qwen3_moe"])
def test_engine_under_kv_pressure_matches_transformers(name, policy, tmp_path_factory) -> None:
    """The real engine with room for about two sequences: requests are rotated out (or
    preempted) and resumed; the tokens stay those of transformers. For the architectures
    whose cache use differs (windows, local RoPE, experts), to keep the suite short."""
    from superinfer import LLM, SamplingParams

    directory = _saved(name, tmp_path_factory)
    prompts = PROMPTS * 2
    # Mistral frees the blocks out of its window (8): a sequence holds 3 blocks, not 14
    num_device_blocks = 14 if name == "mistral" else 28
    llm = LLM(str(directory), dtype="float32", device="cpu", policy=policy, block_size=4,
              num_device_blocks=num_device_blocks, max_model_len=56,
              check_invariants=True)  # fmt: skip
    try:
        params = SamplingParams(max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS,
                                temperature=0.0)  # fmt: skip
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        stats = llm.engine.scheduler.stats
        assert stats.num_preemptions + stats.num_swap_outs > 0
    finally:
        llm.engine.close()
    assert [o.outputs[0].token_ids for o in outputs] == _reference(directory) * 2
