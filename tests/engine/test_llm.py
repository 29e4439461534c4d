"""The offline engine on the real default model (float32, CPU)."""

from __future__ import annotations

import os

import pytest
import torch

from superinfer import LLM, SamplingParams
from superinfer.model.loader import default_model_path

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "List three primary colors:",
    "Once upon a time, in a small village by the mountains, there lived an old clockmaker who",
    "Translate to French: Good morning, how are you today?",
    "1, 2, 3, 4,",
    "Explain in one sentence why the sky is blue. Keep it short and simple for a child.",
]
NUM_TOKENS = 32


@pytest.fixture(scope="module")
def llm():
    llm = LLM(dtype="float32", device="cpu", check_invariants=True)
    yield llm
    llm.engine.close()


@pytest.fixture(scope="module")
def hf_greedy(llm):
    """transformers' greedy continuation of each prompt, same GGUF weights, float32."""
    from transformers import AutoModelForCausalLM

    directory = os.path.dirname(default_model_path())
    model = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32
    )
    tokenizer = llm.get_tokenizer()
    results = []
    with torch.inference_mode():
        for prompt in PROMPTS:  # one at a time: no padding effects in the reference
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            out = model.generate(
                ids, max_new_tokens=NUM_TOKENS, min_new_tokens=NUM_TOKENS, do_sample=False
            )
            results.append(out[0, ids.shape[1] :].tolist())
    return results


def greedy(max_tokens=NUM_TOKENS):
    # min_tokens bans the end-of-sequence token, as transformers' min_new_tokens does
    return SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, temperature=0.0)


def test_greedy_batched_matches_transformers(llm, hf_greedy):
    outputs = llm.generate(PROMPTS, greedy())
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)


@pytest.mark.parametrize("policy", ["fcfs-recompute", "fcfs-swap"])
def test_memory_pressure_gives_identical_outputs(llm, hf_greedy, policy):
    # Room for about two sequences at once: every request is preempted or swapped.
    tight = LLM(
        dtype="float32", device="cpu", policy=policy, block_size=8, num_device_blocks=14,
        max_model_len=112, check_invariants=True,
    )  # fmt: skip
    try:
        outputs = tight.generate(PROMPTS, greedy())
        assert [o.outputs[0].token_ids for o in outputs] == hf_greedy
        stats, kv = tight.engine.scheduler.stats, tight.engine.scheduler.kv
        if policy == "fcfs-recompute":
            assert stats.num_preemptions > 0
        else:
            assert stats.num_swap_outs > 0 and kv.stats.num_swap_out_blocks > 0
        assert not tight.engine.scheduler.kv.tables
    finally:
        tight.engine.close()


def test_seeded_sampling_repeats(llm):
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    first = llm.generate(PROMPTS[:3], params)
    second = llm.generate(PROMPTS[:3][::-1], params)[::-1]  # other batch order
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in second]
    other = llm.generate(PROMPTS[:3], SamplingParams(max_tokens=16, temperature=0.9, seed=99))
    assert [o.outputs[0].token_ids for o in other] != [o.outputs[0].token_ids for o in first]


def test_stop_string_cuts_the_text(llm):
    (free,) = llm.generate("1, 2, 3, 4,", greedy(24))
    text = free.outputs[0].text
    assert " 7" in text
    (stopped,) = llm.generate("1, 2, 3, 4,", SamplingParams(max_tokens=24, temperature=0, stop=[" 7"]))
    out = stopped.outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == " 7"
    assert out.text == text[: text.index(" 7")]


def test_stop_token_ids_and_max_tokens(llm):
    (free,) = llm.generate(PROMPTS[0], greedy(8))
    stop_id = free.outputs[0].token_ids[3]
    (stopped,) = llm.generate(PROMPTS[0], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=[stop_id]))
    assert stopped.outputs[0].token_ids == free.outputs[0].token_ids[: free.outputs[0].token_ids.index(stop_id) + 1]
    assert stopped.outputs[0].finish_reason == "stop" and stopped.outputs[0].stop_reason == stop_id
    assert len(free.outputs[0].token_ids) == 8


def test_token_id_prompts_and_chat(llm):
    tokenizer = llm.get_tokenizer()
    ids = tokenizer(PROMPTS[0])["input_ids"]
    (by_text,) = llm.generate(PROMPTS[0], greedy(8))
    (by_ids,) = llm.generate({"prompt_token_ids": ids}, greedy(8))
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids
    chats = llm.chat(
        [[{"role": "user", "content": "Say hello."}], [{"role": "user", "content": "What is 2+2?"}]],
        SamplingParams(max_tokens=24, temperature=0),
    )
    assert len(chats) == 2 and all(c.outputs[0].text.strip() for c in chats)
    assert "<|im_start|>assistant" in tokenizer.decode(chats[0].prompt_token_ids)


def test_bad_prompts_are_refused_and_leave_nothing_behind(llm):
    with pytest.raises(ValueError):
        llm.generate({"prompt_token_ids": [10**9]}, greedy(4))
    with pytest.raises(ValueError):
        llm.generate("x " * 5000, greedy(4))  # longer than max_model_len
    with pytest.raises(TypeError):
        llm.generate([123], greedy(4))
    assert not llm.engine.has_unfinished_requests()
    llm.engine.scheduler.check_invariants()


def test_bfloat16_runs_and_mostly_agrees(hf_greedy):
    llm = LLM(dtype="bfloat16", device="cpu")
    try:
        outputs = llm.generate(PROMPTS, greedy(8))
    finally:
        llm.engine.close()
    agree = sum(o.outputs[0].token_ids[:4] == ref[:4] for o, ref in zip(outputs, hf_greedy))
    assert agree >= len(PROMPTS) // 2  # bf16 rounding may flip a near tie, not most of them
