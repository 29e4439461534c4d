from __future__ import annotations

import json
import os
import random

import pytest

from superinfer.sim.workload import sharegpt_workload, synthetic_workload, workload_from_records
from superinfer.workload.arrivals import poisson_arrivals
from superinfer.workload.datasets import LengthLimits, sample_lengths

RECORDED = os.path.join(os.path.dirname(__file__), "data", "real_cpu_fcfs_rate0.5.json")


def test_sampling_keeps_the_first_pairs_within_the_limits_in_shuffled_order():
    lengths = [(3, 50), (100, 20), (2000, 5), (50, 50), (10, 2), (600, 1500), (40, 40)]
    sampled = sample_lengths(lengths, 3, seed=1, limits=LengthLimits(1024, 2048, 4))
    order = list(range(len(lengths)))
    random.Random(1).shuffle(order)
    kept = [lengths[i] for i in order if lengths[i] in ((100, 20), (50, 50), (40, 40))]
    assert sampled == kept
    with pytest.raises(ValueError, match="only 3 pairs"):
        sample_lengths(lengths, 4, seed=1, limits=LengthLimits(1024, 2048, 4))


def test_poisson_arrivals_have_the_asked_rate_and_repeat():
    times = poisson_arrivals(4000, 20.0, seed=3)
    assert times == sorted(times) and times == poisson_arrivals(4000, 20.0, seed=3)
    assert 4000 / times[-1] == pytest.approx(20.0, rel=0.05)


def test_synthetic_lengths_stay_in_their_ranges():
    workload = synthetic_workload(5.0, 100, (10, 20), (3, 4), seed=0)
    assert all(10 <= r.num_prompt_tokens <= 20 and 3 <= r.num_output_tokens <= 4 for r in workload)


def test_sharegpt_workload_is_the_request_sequence_a_real_run_here_saw():
    # the recorded run: policies_overload.py --num-prompts 60 --request-rate 0.5 (seed 0)
    with open(RECORDED) as f:
        real = workload_from_records(json.load(f)["records"])
    limits = LengthLimits(max_prompt_tokens=384, max_output_tokens=96)
    simulated = sharegpt_workload(0.5, num_requests=60, seed=0, limits=limits)
    first = simulated[0].arrival_s
    for recorded, sim in zip(real, simulated, strict=True):
        assert (recorded.num_prompt_tokens, recorded.num_output_tokens) == (
            sim.num_prompt_tokens, sim.num_output_tokens,
        )  # fmt: skip
        assert recorded.arrival_s == pytest.approx(sim.arrival_s - first, abs=1e-3)
