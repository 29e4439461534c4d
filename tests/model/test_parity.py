"""The default model against transformers' own implementation of the same GGUF file."""

from __future__ import annotations

import pytest
import torch

from tests.model.paged import PagedRun

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    (
        "Once upon a time, in a small village at the edge of a great forest, there lived an old "
        "clockmaker who"
    ),
    "Q: What is 12 times 7?\nA:",
]

pytestmark = pytest.mark.slow


def _tokenize(smollm, prompts=PROMPTS) -> list[list[int]]:
    return [smollm.tokenizer(p)["input_ids"] for p in prompts]


def _reference_logits(hf_smollm, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf_smollm(torch.tensor([ids])).logits[0].float()  # (T, V)


def _assert_close(logits: torch.Tensor, ref: torch.Tensor, rel: float = 1e-3) -> None:
    scale = ref.abs().max().item()
    assert (logits - ref).abs().max().item() < rel * scale
    assert torch.equal(logits.argmax(-1), ref.argmax(-1))


def test_packed_prompts_match_transformers(smollm, hf_smollm) -> None:
    prompts = _tokenize(smollm)
    assert len({len(p) for p in prompts}) == len(prompts)
    run = PagedRun(smollm.model, num_blocks=64, block_size=8)
    seqs = [run.add(p) for p in prompts]
    logits = run.step([(s, len(p)) for s, p in zip(seqs, prompts)], all_logits=True)
    for rows, ids in zip(logits.split([len(p) for p in prompts]), prompts):
        _assert_close(rows, _reference_logits(hf_smollm, ids))


def _chunked_greedy(
    run: PagedRun, prompts: list[list[int]], plans: list[list[int]], num_new_tokens: int
) -> list[list[int]]:
    """Prefill each prompt in the chunks of its plan (one chunk per step, 0 = idle, -1 = the
    rest), then decode greedily; sequences in different phases share steps."""
    seqs = [run.add(p) for p in prompts]
    generated: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(g) < num_new_tokens for g in generated):
        work = []
        for seq, prompt, plan in zip(seqs, prompts, plans):
            remaining = len(prompt) - run.num_cached[seq]
            if remaining > 0:
                size = plan[step] if step < len(plan) else -1
                if size != 0:
                    work.append((seq, remaining if size < 0 else min(size, remaining)))
            elif len(generated[seq]) < num_new_tokens:
                work.append((seq, 1))
        logits = run.step(work)
        for (seq, _), row in zip(work, logits):
            if run.num_cached[seq] == len(run.tokens[seq]):  # sampled a new token
                token = int(row.argmax())
                generated[seq].append(token)
                run.tokens[seq].append(token)
        step += 1
    return generated


def test_chunked_prefill_and_batched_decode_match_generate(smollm, hf_smollm) -> None:
    prompts = _tokenize(smollm)[1:]
    plans = [[13, 9, -1], [0, 7, 11, -1], [5, 0, -1]]
    ours = _chunked_greedy(PagedRun(smollm.model, 64, 8, seed=1), prompts, plans, 16)
    for ids, tokens in zip(prompts, ours):
        with torch.inference_mode():
            out = hf_smollm.generate(
                torch.tensor([ids]),
                max_new_tokens=16,
                do_sample=False,
                min_new_tokens=16,
                pad_token_id=0,
            )
        assert tokens == out[0, len(ids) :].tolist()


def test_mixed_step_equals_separate_steps(smollm) -> None:
    prompts = _tokenize(smollm)
    run = PagedRun(smollm.model, num_blocks=64, block_size=8, seed=2)
    seqs = [run.add(p + [42]) for p in prompts]  # the extra token is decoded below
    prefill_seq = seqs[2]
    run.step([(s, len(p)) for s, p in zip(seqs, prompts) if s != prefill_seq])
    run.step([(prefill_seq, 11)])  # part of its prompt is cached before the mixed step
    # decode rows around one prefill chunk: the decode tokens are not contiguous
    work = [(seqs[0], 1), (prefill_seq, 9), (seqs[1], 1), (seqs[3], 1)]
    separate = run.clone()
    mixed = run.step(work)
    alone = torch.cat([separate.step([w]) for w in work])
    _assert_close(mixed, alone, rel=1e-5)
    # to the cache's scale: a GEMM blocks its sums by the row count, so a rare element
    # differs in its last bits (seen once at 1.2e-5 on an AVX-512 CPU)
    scale = separate.kv_cache.abs().max().item()
    assert (run.kv_cache - separate.kv_cache).abs().max().item() < 1e-5 * scale


def test_bfloat16_agrees_with_float32(smollm_bf16, hf_smollm) -> None:
    prompts = _tokenize(smollm_bf16)
    run = PagedRun(smollm_bf16.model, num_blocks=64, block_size=16)
    seqs = [run.add(p) for p in prompts]
    logits = run.step([(s, len(p)) for s, p in zip(seqs, prompts)])
    assert logits.dtype == torch.float32
    for row, ids in zip(logits, prompts):
        ref = _reference_logits(hf_smollm, ids)[-1]
        assert row.argmax() == ref.argmax()
        assert torch.cosine_similarity(row, ref, dim=0) > 0.99
    for s in seqs:
        run.tokens[s].append(int(logits[s].argmax()))
    assert torch.isfinite(run.step([(s, 1) for s in seqs])).all()


def _greedy_with_margins(model, ids: list[int], num_new_tokens: int):
    """Greedy tokens and, per step, the gap between the top two logits."""
    run = PagedRun(model, num_blocks=64, block_size=16)
    seq = run.add(ids)
    tokens, margins, logits = [], [], run.step([(seq, len(ids))])
    for _ in range(num_new_tokens):
        top2 = logits[0].topk(2).values
        margins.append(float(top2[0] - top2[1]))
        tokens.append(int(logits[0].argmax()))
        run.tokens[seq].append(tokens[-1])
        logits = run.step([(seq, 1)])
    return tokens, margins


def test_quantized_execution_keeps_the_greedy_tokens(smollm_bf16) -> None:
    """The Q4_1 file kept quantized (int4 kernel) against the same file dequantized to
    bfloat16: identical tokens, or a first divergence where the dequantized run's top two
    logits are within bfloat16's rounding of each other (a tie)."""
    from superinfer.model.loader import default_model_path, load_gguf_model
    from superinfer.model.quant import Int4Linear

    path = default_model_path()
    quantized, info = load_gguf_model(path, torch.bfloat16, torch.device("cpu"), "gguf")
    dense, _ = load_gguf_model(path, torch.bfloat16, torch.device("cpu"), "none")
    assert info.num_quantized_linears == 121  # 30 layers x (qkv, o, gate_up, down) + lm_head
    assert any(isinstance(m, Int4Linear) for m in quantized.modules())
    for ids in _tokenize(smollm_bf16):
        ours, _ = _greedy_with_margins(quantized, ids, 32)
        ref, margins = _greedy_with_margins(dense, ids, 32)
        step = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
        assert step is None or margins[step] <= 0.25, (step, margins[step])
