"""Every registered architecture against transformers' own implementation: tiny random
models built with its config classes, float32, greedy over 32 steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from superinfer.model.loader import load_model
from superinfer.model.registry import architectures
from tests.model.paged import PagedRun
from tests.model.tiny import hf_auto_class, save_tiny, tiny_configs, tiny_phi3_longrope_config

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


def _hf_model(directory: Path):
    """transformers' own model of a saved tiny checkpoint, in float32."""
    auto = hf_auto_class(AutoConfig.from_pretrained(directory))
    return auto.from_pretrained(directory, dtype=torch.float32).eval()


def _reference(directory: Path) -> list[list[int]]:
    model = _hf_model(directory)
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
    """One tiny config per registered name (`architectures[0]`: the class transformers
    builds and saves the checkpoint as)."""
    names = {type(hf_auto_class(c).from_config(c)).__name__ for c in CONFIGS.values()}
    assert names == set(architectures())


def test_greedy_batched_chunked_matches_transformers(tiny) -> None:
    name, directory = tiny
    loaded = load_model(str(directory), torch.float32, "cpu")
    assert loaded.checkpoint.architecture == CONFIGS[name].architectures[0]
    expected = _reference(directory)
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == expected


def test_prefill_logits_match_transformers(tiny) -> None:
    _name, directory = tiny
    loaded = load_model(str(directory), torch.float32, "cpu", pack_weights=False)
    reference = _hf_model(directory)
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


def test_longrope_factors_follow_max_model_len(tmp_path) -> None:
    """LongRoPE through the engine: with max_model_len within the original context (64),
    the short factors, as transformers takes for sequences that stay within it (these
    reach 53 tokens); with a longer one, the long factors. Checked on the prompts'
    log-probabilities (the tiny model's greedy tokens cycle, whichever the factors)."""
    from superinfer import LLM, SamplingParams

    directory = save_tiny(tmp_path, tiny_phi3_longrope_config(original_context=64), seed=3)
    params = SamplingParams(max_tokens=NUM_NEW_TOKENS, min_tokens=NUM_NEW_TOKENS,
                            temperature=0.0, prompt_logprobs=0)  # fmt: skip
    tokens, logprobs = {}, {}
    for max_model_len in (64, 256):
        llm = LLM(str(directory), dtype="float32", device="cpu", block_size=4,
                  max_model_len=max_model_len, check_invariants=True)  # fmt: skip
        try:
            outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
        finally:
            llm.engine.close()
        tokens[max_model_len] = [o.outputs[0].token_ids for o in outputs]
        logprobs[max_model_len] = torch.tensor(
            [e.logprob for o in outputs for e in o.prompt_logprobs[1:]]
        )
    reference = _hf_model(directory)
    with torch.inference_mode():
        expected = torch.cat([
            reference(torch.tensor([p])).logits[0, :-1].log_softmax(-1)
            .gather(1, torch.tensor(p[1:])[:, None])[:, 0] for p in PROMPTS
        ])  # fmt: skip
    # attention moves this random model's log-probabilities little: float32 rounding
    # leaves them within 1e-6 of transformers', the other factors 1e-4 and more
    torch.testing.assert_close(logprobs[64], expected, rtol=0, atol=1e-5)
    assert (logprobs[256] - expected).abs().max() > 1e-4
    assert tokens[64] == _reference(directory)


def test_vision_language_checkpoints_give_their_language_model_either_layout() -> None:
    """transformers 4.x and 5.x save the language model as language_model.model.*; some
    tools store 5.x's module names (model.language_model.*). The vision tower goes."""
    from superinfer.model.vision_language import vl_text_weights

    names = ["model.language_model.layers.0.mlp.up_proj.weight", "language_model.model.norm.weight",
             "language_model.lm_head.weight", "lm_head.weight", "vision_tower.encoder.x",
             "model.vision_tower.y", "multi_modal_projector.z", "model.multi_modal_projector.w"]  # fmt: skip
    kept = [name for name, _ in vl_text_weights(((n, None) for n in names), None)]
    assert kept == ["model.layers.0.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight",
                    "lm_head.weight"]  # fmt: skip
