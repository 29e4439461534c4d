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
    alone = [Sampler(CPU, seed=1)(x[1:2].clone(), [seq("b", temperature=1.0, seed=7)])[0] for _ in range(2)]
    batch = Sampler(CPU, seed=2)(
        x.clone(), [seq("a", temperature=1.0), seq("b", temperature=1.0, seed=7), seq("c", temperature=0)]
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
        torch.tensor([sampler(x.clone(), [seq(temperature=1.0)])[0] for _ in range(3000)]), minlength=3
    )
    assert abs(counts[0].item() / 3000 - 0.7) < 0.04
    assert abs(counts[2].item() / 3000 - 0.1) < 0.03


def test_min_tokens_suppresses_stop_tokens():
    x = torch.zeros(1, 10)
    x[0, 2] = 10.0  # eos is by far the best
    x[0, 4] = 5.0
    sampler = Sampler(CPU, eos_token_ids=[2])
    assert sampler(x.clone(), [seq(temperature=0, min_tokens=3, num_output_tokens=1)]) == [4]
    assert sampler(x.clone(), [seq(temperature=0, min_tokens=3, num_output_tokens=3)]) == [2]
