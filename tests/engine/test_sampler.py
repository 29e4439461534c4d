"""Sampling on synthetic logits: greedy, seeds, top-k, top-p, min_tokens."""

from __future__ import annotations

import torch

from superinfer.core.outputs import ScheduledSequence
from superinfer.engine.sampler import Sampler
from superinfer.sampling_params import SamplingParams

CPU = torch.device("cpu")


def seq(request_id="r", num_output_tokens=5, **params) -> ScheduledSequence:
    return ScheduledSequence(
        request_id=request_id, token_ids=[1], num_context_tokens=3, block_table=[0],
        is_sampling=True, sampling_params=SamplingParams(**params),
        num_output_tokens=num_output_tokens,
    )  # fmt: skip


def logits(rows=1, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))


def test_greedy_is_argmax():
    x = logits(4)
    assert Sampler(CPU)(x.clone(), [seq(temperature=0.0)] * 4) == x.argmax(-1).tolist()


def test_seeded_rows_repeat_whatever_the_batch():
    x = logits(3)
    alone = [
        Sampler(CPU, seed=1)(x[1:2].clone(), [seq("b", temperature=1.0, seed=7)])[0]
        for _ in range(2)
    ]
    batch = Sampler(CPU, seed=2)(
        x.clone(),
        [seq("a", temperature=1.0), seq("b", temperature=1.0, seed=7), seq("c", temperature=0)],
    )
    assert alone[0] == alone[1] == batch[1]


def test_seeded_stream_advances_between_steps():
    sampler = Sampler(CPU)
    x = torch.zeros(1, 1000)  # uniform: consecutive draws differ almost surely
    draws = [sampler(x.clone(), [seq("r", temperature=1.0, seed=3)])[0] for _ in range(5)]
    assert len(set(draws)) > 1
    fresh = Sampler(CPU)
    assert draws == [fresh(x.clone(), [seq("r", temperature=1.0, seed=3)])[0] for _ in range(5)]


def test_top_k_and_top_p_restrict_the_support():
    x = torch.tensor([[5.0, 4.0, 3.0, -10.0, -10.0, -10.0]])
    sampler = Sampler(CPU)
    top_k = {sampler(x.clone(), [seq(temperature=5.0, top_k=2)])[0] for _ in range(200)}
    assert top_k <= {0, 1} and len(top_k) == 2
    probs = torch.softmax(x, -1)[0]
    assert probs[0] < 0.9  # so top_p=0.5 keeps token 0 alone, top_p=0.9 keeps 0 and 1
    only_best = {sampler(x.clone(), [seq(temperature=1.0, top_p=0.5)])[0] for _ in range(100)}
    assert only_best == {0}
    two = {sampler(x.clone(), [seq(temperature=1.0, top_p=0.9)])[0] for _ in range(300)}
    assert two == {0, 1}


def test_sampling_follows_the_distribution():
    x = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    sampler = Sampler(CPU, seed=0)
    counts = torch.bincount(
        torch.tensor([sampler(x.clone(), [seq(temperature=1.0)])[0] for _ in range(3000)]),
        minlength=3,
    )
    assert abs(counts[0].item() / 3000 - 0.7) < 0.04
    assert abs(counts[2].item() / 3000 - 0.1) < 0.03


def test_the_inverse_cdf_picks_only_tokens_with_probability():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0]])
    for u, expected in [(0.0, [1, 4]), (0.2499, [1, 4]), (0.25, [3, 4]), (0.999999, [3, 4])]:
        picked = Sampler._invert_cdf(probs, torch.tensor([u, u], dtype=torch.float64))
        assert picked.tolist() == expected


def test_sampling_follows_the_distribution_over_a_large_vocabulary():
    vocab = 49152  # the default model's: a float32 cumulative sum would blur the tail
    probs = torch.full((1, vocab), 0.5 / (vocab - 1))
    probs[0, -1] = 0.5
    sampler = Sampler(CPU, seed=0)
    draws = torch.tensor([sampler(probs.log(), [seq(temperature=1.0)])[0] for _ in range(2000)])
    assert abs((draws == vocab - 1).float().mean().item() - 0.5) < 0.05
    assert len(set(draws.tolist())) > 900  # the other half spreads over the vocabulary


def sorted_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]):
    """The definition, by a full sort: keep the top_k best, then the fewest best of those
    whose probability reaches top_p."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k = torch.tensor([k if k > 0 else vocab for k in top_k])
    mask = torch.arange(vocab)[None, :] >= k[:, None]
    probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(dim=-1)
    mask |= probs.cumsum(dim=-1) - probs >= torch.tensor(top_p)[:, None]
    mask[:, 0] = False
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(mask, -1e30))


def test_top_k_top_p_ranks_few_candidates_and_keeps_what_a_full_sort_keeps():
    vocab = 5000
    gen = torch.Generator().manual_seed(0)
    peaked = torch.randn(6, vocab, generator=gen) - 8 * torch.rand(6, vocab, generator=gen) ** 0.2
    cases = {  # rows: (top_k, top_p)
        "nuclei among the candidates": [(0, 0.9), (5, 1.0), (50, 0.5), (0, 1.0), (0, 0.99), (3, 0.2)],
        "a top_k beyond the candidates": [(2000, 1.0), (0, 0.9), (0, 1.0), (5, 0.5), (0, 0.8), (1, 1.0)],
        "a nucleus beyond them": [(0, 0.9), (0, 0.999999), (0, 1.0), (7, 0.3), (0, 0.5), (10, 0.9)],
    }  # fmt: skip
    for name, rows in cases.items():
        logits = peaked.clone()
        logits[1] = torch.randn(vocab, generator=gen) * 0.1  # flat: its nucleus is most of it
        top_k, top_p = [k for k, _ in rows], [p for _, p in rows]
        got = Sampler._apply_top_k_top_p(logits, top_k, top_p)
        expected = sorted_top_k_top_p(logits, top_k, top_p)
        keeps = [(k == 0 or k >= vocab) and p >= 1.0 for k, p in rows]
        for row, keep_all in enumerate(keeps):
            kept = got[row] > float("-inf")
            assert torch.equal(kept, expected[row] > -1e30) or keep_all, (name, row)
            if keep_all:
                assert torch.equal(got[row], logits[row]), (name, row)
            assert torch.equal(got[row][kept], logits[row][kept]), (name, row)


def test_min_tokens_suppresses_stop_tokens():
    x = torch.zeros(1, 10)
    x[0, 2] = 10.0  # eos is by far the best
    x[0, 4] = 5.0
    sampler = Sampler(CPU, eos_token_ids=[2])
    assert sampler(x.clone(), [seq(temperature=0, min_tokens=3, num_output_tokens=1)]) == [4]
    assert sampler(x.clone(), [seq(temperature=0, min_tokens=3, num_output_tokens=3)]) == [2]


# --- logits processing, vLLM's definitions ------------------------------------------------
def history_sampler(request_id, params, prompt, outputs):
    """A sampler that has seen `prompt` and sampled `outputs` for one request."""
    sampler = Sampler(CPU)
    sampler.add_request(request_id, params, prompt)
    sampler._histories[request_id].output_token_ids.extend(outputs)
    return sampler


def test_penalties_follow_vllms_definitions():
    params = SamplingParams(temperature=0, repetition_penalty=2.0, frequency_penalty=0.5,
                            presence_penalty=0.25)  # fmt: skip
    sampler = history_sampler("r", params, prompt=[1], outputs=[2, 2, 3])
    x = torch.tensor([[4.0, 4.0, 4.0, -4.0, 4.0]])
    out = x.clone()
    sampler._apply_penalties(out, [seq("r", num_output_tokens=3, **_fields(params))])
    # token 1: prompt only (repetition); 2: twice in the output; 3: once, negative logit
    assert out.tolist() == [[4.0, 2.0, 2.0 - 1.0 - 0.25, -8.0 - 0.5 - 0.25, 4.0]]


def _fields(params):
    return {k: getattr(params, k) for k in ("temperature", "repetition_penalty",
            "frequency_penalty", "presence_penalty")}  # fmt: skip


def test_greedy_picks_the_argmax_after_penalties_and_bias():
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    sampler = history_sampler("r", SamplingParams(frequency_penalty=2.0), [3], [0])
    assert sampler(x.clone(), [seq("r", temperature=0, frequency_penalty=2.0)]) == [1]
    assert Sampler(CPU)(x.clone(), [seq(temperature=0, logit_bias={3: 5.0})]) == [3]


def test_allowed_token_ids_and_bad_words_restrict_only_their_rows():
    x = torch.tensor([[5.0, 4.0, 3.0, 2.0]] * 3)
    rows = [seq("a", temperature=0, allowed_token_ids=[2, 3]), seq("b", temperature=0),
            seq("c", temperature=0)]  # fmt: skip
    rows[2].sampling_params.bad_words_token_ids = [[0], [7, 1]]  # 0 always, 1 after 7
    sampler = Sampler(CPU)
    assert sampler(x.clone(), rows) == [2, 0, 1]
    sampler.add_request("c", rows[2].sampling_params, [9])
    sampler._histories["c"].output_token_ids.append(7)
    assert sampler(x.clone(), rows) == [2, 0, 2]


def test_min_p_drops_tokens_below_a_share_of_the_best():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler(CPU, seed=0)
    drawn = {sampler(x.clone(), [seq(temperature=1.0, min_p=0.4)])[0] for _ in range(300)}
    assert drawn == {0, 1}  # 0.15 < 0.4 x 0.5


def test_logprobs_are_raw_ranked_and_topped_per_row():
    x = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    rows = [seq("a", temperature=0, logprobs=2, logit_bias={3: 50.0}), seq("b", temperature=0)]
    out = Sampler(CPU).sample(x.clone(), rows)
    assert out.token_ids == [3, 2]
    entry = out.logprobs["a"]
    raw = torch.log_softmax(x[0], -1)  # before the bias that picked the token
    assert entry.token_id == 3 and abs(entry.logprob - raw[3].item()) < 1e-6
    assert entry.rank == 4
    assert [t for t, _ in entry.top] == [1, 2]
    assert abs(entry.top[0][1] - raw[1].item()) < 1e-6
    assert "b" not in out.logprobs


def test_prompt_logprobs_score_every_prompt_token_across_chunks():
    prompt = [4, 1, 2, 3, 0]
    params = SamplingParams(temperature=0, prompt_logprobs=1)
    sampler = Sampler(CPU)
    sampler.add_request("r", params, prompt)
    table = torch.randn(len(prompt), 6, generator=torch.Generator().manual_seed(1))
    for start, end in ((0, 2), (2, 5)):  # chunked prefill: two steps
        chunk = ScheduledSequence("r", prompt[start:end], start, [0], end == 5, params, 0)
        sampler.record_prompt_logprobs(chunk, lambda a, b, s=start: table[s + a : s + b])
    last = ScheduledSequence("r", [0], 4, [0], True, params, 0)
    entries = sampler.sample(table[4:5].clone(), [last]).prompt_logprobs["r"]
    assert entries[0] is None and len(entries) == len(prompt)
    for position in range(1, len(prompt)):
        expected = torch.log_softmax(table[position - 1], -1)[prompt[position]].item()
        assert entries[position].token_id == prompt[position]
        assert abs(entries[position].logprob - expected) < 1e-6
        assert len(entries[position].top) == 1
    again = sampler.sample(table[4:5].clone(), [last])
    assert again.prompt_logprobs == {}  # sent once, with the first token


def test_bad_words_are_tokenized_with_and_without_a_leading_space():
    class Tokenizer:
        def encode(self, text, add_special_tokens=False):
            return {"Paris": [5, 6], " Paris": [7, 6], "x": [9], " x": [9]}[text]

    params = SamplingParams(bad_words=["Paris", "x"])
    params.update_from_tokenizer(Tokenizer())
    assert params.bad_words_token_ids == [[5, 6], [7, 6], [9]]
    assert params.needs_history
