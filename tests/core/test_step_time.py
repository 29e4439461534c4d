"""The engine's online step-time model: it fits the steps it sees, learns a drift from the
window of recent steps, and is not ready before a warm-up anchored it."""

from __future__ import annotations

import random

import pytest

from superinfer.core.step_time import (
    FEATURE_NAMES,
    BatchShape,
    LinearStepModel,
    OnlineStepModel,
    ShapeBuilder,
    decode_row_seconds,
    fit_non_negative,
)


def machine(batch: BatchShape, speed: float = 1.0) -> float:
    """A made-up CPU: flat while reading the weights, then per row; attention per key."""
    dense = 0.030 + 0.0009 * max(0, batch.num_tokens - 8)
    return speed * (dense + 2e-6 * batch.num_decode_context + 1e-8 * batch.num_prefill_pairs)


def random_batch(rng: random.Random) -> BatchShape:
    num_decode = rng.choice([1, 2, 4, 8, 16, 32])
    num_prefill = rng.choice([0, 0, 0, 32, 128, 256])
    queries = [1] * num_decode + ([num_prefill] if num_prefill else [])
    contexts = [rng.randint(20, 600) for _ in range(num_decode)] + ([0] if num_prefill else [])
    return BatchShape.of_lists(queries, contexts)


def test_fit_recovers_a_linear_machine_within_noise():
    rng = random.Random(0)
    model = OnlineStepModel()
    for _ in range(300):
        batch = random_batch(rng)
        model.observe(batch, machine(batch) * rng.uniform(0.97, 1.03))
    model.keep_as_anchors()
    assert model.is_ready
    for _ in range(50):
        batch = random_batch(rng)
        assert model.forward_time(batch) == pytest.approx(machine(batch), rel=0.08)


def test_a_drifting_machine_is_learned_from_the_recent_window():
    rng = random.Random(1)
    model = OnlineStepModel(window=256, refit_every=16)
    for _ in range(64):  # the warm-up's grid
        batch = random_batch(rng)
        model.observe(batch, machine(batch))
    model.keep_as_anchors()
    for _ in range(600):  # the machine got 30% slower since
        batch = random_batch(rng)
        model.observe(batch, machine(batch, speed=1.3))
    probe = BatchShape.of_lists([1] * 8, [200] * 8)
    assert model.forward_time(probe) == pytest.approx(machine(probe, 1.3), rel=0.1)


def test_the_late_factor_is_a_high_quantile_of_measured_over_predicted():
    """A machine that is right on average but one step in five runs 1.5x long: the fit
    stays near the mean, and the late factor says how long a step may well take."""
    rng = random.Random(2)
    model = OnlineStepModel()
    assert model.late_factor == 1.0  # nothing seen yet
    for i in range(600):
        batch = random_batch(rng)
        model.observe(batch, machine(batch) * (1.5 if i % 5 == 0 else 0.9))
    assert 1.3 < model.late_factor < 1.8
    steady = OnlineStepModel()
    for _ in range(600):
        batch = random_batch(rng)
        steady.observe(batch, machine(batch))
    assert steady.late_factor == pytest.approx(1.0, abs=0.05)  # never below 1


def test_not_ready_without_anchors():
    model = OnlineStepModel(min_samples=2)
    batch = BatchShape.of_lists([1], [10])
    for _ in range(10):
        model.observe(batch, 0.03)
    assert model.model is not None and not model.is_ready  # fitted, but never warmed up


def test_non_negative_fit_never_returns_a_negative_coefficient():
    rows = [[1.0, x, x * x] for x in range(1, 20)]
    targets = [5.0 - 0.1 * x for x in range(1, 20)]  # falls with x: the slope would be < 0
    assert min(fit_non_negative(rows, targets)) >= 0.0


def test_shape_builder_matches_batch_shape():
    builder = ShapeBuilder()
    entries = [(1, 40, True), (37, 0, True), (16, 32, False), (1, 7, True)]
    for entry in entries:
        builder.add(*entry)
    builder.remove(*entries[1])
    expected = BatchShape.of_lists([1, 16, 1], [40, 32, 7], [True, False, True])
    assert builder.shape() == expected


def test_a_decode_rows_cost_is_the_models_slope():
    coef = dict.fromkeys(FEATURE_NAMES, 0.0)
    coef.update(const=0.05, tokens=0.001, decode_context=1e-6)
    model = LinearStepModel([coef[name] for name in FEATURE_NAMES])
    # a row: one token (1 ms) and its 100 keys plus its own (101 us)
    assert decode_row_seconds(model, 100) == pytest.approx(0.001 + 101e-6)
    assert decode_row_seconds(None, 100) == 0.0
