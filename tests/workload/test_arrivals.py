"""Arrival generators: rate, burstiness, seed determinism, duration and trace replay."""

from __future__ import annotations

import math
import statistics

import pytest

from superinfer.workload.arrivals import (
    arrivals_within,
    generated_arrivals,
    poisson_arrivals,
    replayed_arrivals,
)


def gaps(times):
    return [b - a for a, b in zip([0.0, *times], times)]


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_mean_rate(burstiness):
    times = generated_arrivals(20_000, rate=5.0, burstiness=burstiness, seed=1)
    assert statistics.fmean(gaps(times)) == pytest.approx(1 / 5.0, rel=0.05)
    assert times == sorted(times) and times[0] > 0


def test_burstiness_sets_the_spread():
    # gamma gaps with shape k: coefficient of variation 1 / sqrt(k)
    for k in (0.25, 1.0, 4.0):
        g = gaps(generated_arrivals(20_000, rate=2.0, burstiness=k, seed=3))
        cv = statistics.pstdev(g) / statistics.fmean(g)
        assert cv == pytest.approx(1 / math.sqrt(k), rel=0.08)


def test_gamma_near_one_matches_poisson_mean():
    poisson = gaps(generated_arrivals(20_000, rate=3.0, burstiness=1.0, seed=5))
    near = gaps(generated_arrivals(20_000, rate=3.0, burstiness=1.0 + 1e-9, seed=5))
    assert statistics.fmean(near) == pytest.approx(statistics.fmean(poisson), rel=0.05)


def test_seed_determinism_and_the_simulators_sequence():
    a = generated_arrivals(50, rate=2.0, burstiness=0.5, seed=7)
    assert a == generated_arrivals(50, rate=2.0, burstiness=0.5, seed=7)
    assert a != generated_arrivals(50, rate=2.0, burstiness=0.5, seed=8)
    # burstiness 1 draws exactly what the simulator and policies_overload.py draw
    assert generated_arrivals(30, 2.5, 1.0, seed=4) == poisson_arrivals(30, 2.5, seed=4)


def test_infinite_rate_sends_all_at_once():
    assert generated_arrivals(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrivals_within(10.0, math.inf)


def test_duration_is_a_prefix_of_the_same_process():
    within = arrivals_within(20.0, rate=3.0, burstiness=2.0, seed=9)
    assert within and within[-1] <= 20.0
    longer = generated_arrivals(len(within) + 1, rate=3.0, burstiness=2.0, seed=9)
    assert longer[:-1] == within and longer[-1] > 20.0
    assert len(arrivals_within(1000.0, rate=3.0, seed=2)) == pytest.approx(3000, rel=0.06)


@pytest.mark.parametrize("bad", [{"rate": 0.0}, {"rate": -1.0}, {"burstiness": 0.0}])
def test_rejects_bad_parameters(bad):
    with pytest.raises(ValueError):
        generated_arrivals(5, **{"rate": 1.0, **bad})


def test_replay_scales_relative_times():
    assert replayed_arrivals([10.0, 10.5, 12.0], time_scale=0.5) == [0.0, 0.25, 1.0]
    assert replayed_arrivals([], 2.0) == []
    with pytest.raises(ValueError):
        replayed_arrivals([1.0], 0.0)
