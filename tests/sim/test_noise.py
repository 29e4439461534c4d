from __future__ import annotations

import itertools
import math
import statistics

import pytest

from superinfer.core.step_time import BatchShape
from superinfer.sim.fitted import FittedPredictor
from superinfer.sim.noise import NoiseParams, NoisyStepModel, StepNoise
from superinfer.sim.results import records_of, result_json
from superinfer.sim.simulation import simulate

from .helpers import run_small, small_config, small_workload


def draws(params: NoiseParams, num: int, seed: int = 0) -> list[float]:
    noise = StepNoise(params, seed)
    return [noise.factor() for _ in range(num)]


def lag1(values: list[float]) -> float:
    mean = statistics.fmean(values)
    centered = [v - mean for v in values]
    variance = statistics.fmean(c * c for c in centered)
    return statistics.fmean(a * b for a, b in itertools.pairwise(centered)) / variance


def test_exact_noise_is_one():
    assert draws(NoiseParams(0.0, 0.0), 5) == [1.0] * 5


def test_the_same_seed_draws_the_same_factors():
    params = NoiseParams(0.15, 0.8)
    assert draws(params, 50, seed=3) == draws(params, 50, seed=3)
    assert draws(params, 50, seed=3) != draws(params, 50, seed=4)


def test_factors_have_mean_one_and_the_asked_spread_and_correlation():
    params = NoiseParams(0.15, 0.8)
    factors = draws(params, 40_000)
    logs = [math.log(f) for f in factors]
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.02)
    assert statistics.pstdev(logs) == pytest.approx(0.15, rel=0.1)
    assert lag1(logs) == pytest.approx(0.8, abs=0.03)
    independent = [math.log(f) for f in draws(NoiseParams(0.15, 0.0), 40_000)]
    assert abs(lag1(independent)) < 0.03


def test_estimate_recovers_the_noise_and_ignores_a_bias():
    predicted = [0.04 + 0.001 * (i % 7) for i in range(20_000)]
    factors = draws(NoiseParams(0.12, 0.7), len(predicted), seed=1)
    measured = [1.1 * p * f for p, f in zip(predicted, factors)]  # the fit 10% fast: a bias
    estimate = NoiseParams.estimate(measured, predicted)
    assert estimate.sigma == pytest.approx(0.12, rel=0.1)
    assert estimate.lag1 == pytest.approx(0.7, abs=0.05)
    assert NoiseParams.estimate([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]).is_exact


def test_bad_noise_parameters_are_refused():
    with pytest.raises(ValueError):
        NoiseParams(-0.1, 0.0)
    with pytest.raises(ValueError):
        NoiseParams(0.1, 1.0)
    with pytest.raises(ValueError, match="at least 3"):
        NoiseParams.estimate([1.0], [1.0])
    with pytest.raises(ValueError, match="step_noise_lag1"):
        small_config(step_noise_lag1=1.5)
    with pytest.raises(ValueError, match="step_noise_sigma"):
        small_config(step_noise_sigma=-0.2)


def ttfts(run) -> list[float]:
    return [r.token_times[0] - r.arrival_time for r in records_of(run) if r.token_times]


def test_noise_is_seeded_and_keeps_the_work_about_the_same():
    exact = run_small()
    noisy = [run_small(step_noise_sigma=0.3, step_noise_lag1=0.8, noise_seed=s) for s in range(4)]
    assert ttfts(noisy[0]) == ttfts(run_small(step_noise_sigma=0.3, step_noise_lag1=0.8))
    assert ttfts(noisy[0]) != ttfts(noisy[1])
    for run in noisy:  # conservation holds with noise too (invariants checked every step)
        assert len(records_of(run)) == len(run.requests)
    assert exact.engine.runner.noise is None
    exact_busy = exact.engine.runner.counters.busy_s
    mean_busy = statistics.fmean(r.engine.runner.counters.busy_s for r in noisy)
    assert 0.8 < mean_busy / exact_busy < 1.25  # mean-1 factors: the work is about the same


def test_the_fitted_cpu_profile_carries_its_measured_noise_and_zero_turns_it_off():
    fit = FittedPredictor.load("cpu_smollm2.json")
    measured = fit.meta["step_noise"]
    assert 0 < measured["sigma"] < 1 and 0 <= measured["lag1"] < 1
    config = small_config(predictor="fitted", check_invariants_every=0)
    workload = small_workload(num_requests=10)
    run = simulate(config, workload)
    assert run.system.noise == NoiseParams(measured["sigma"], measured["lag1"])
    assert result_json(run)["step_noise"] == NoiseParams(**{
        k: measured[k] for k in ("sigma", "lag1")}).to_dict()  # fmt: skip
    off = simulate(small_config(predictor="fitted", step_noise_sigma=0.0), workload)
    assert off.system.noise.is_exact and off.engine.runner.noise is None


def test_the_scheduler_in_a_noisy_simulation_knows_how_late_a_step_may_run():
    """The guards hold steps to their limits by the model's late factor, as the real engine
    learns it: the noise's 0.9 quantile, which the drawn factors pass one time in ten."""
    predictor = FittedPredictor([1], [0.001, 0.0, 0.0, 0.0, 0.0, 0.0], [0.01, 0.0])
    params = NoiseParams(sigma=0.16, lag1=0.5)
    model = NoisyStepModel(predictor, params)
    factors = draws(params, 40_000)
    share_later = sum(f > model.late_factor for f in factors) / len(factors)
    assert share_later == pytest.approx(0.1, abs=0.02)
    batch = BatchShape.of_lists([100], [0])
    assert model.forward_time(batch) == predictor.forward_time(batch)
    assert NoisyStepModel(predictor, NoiseParams(0.0, 0.0)).late_factor == 1.0
