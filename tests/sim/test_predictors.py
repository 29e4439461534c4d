from __future__ import annotations

import random

import numpy as np
import pytest

from superinfer.sim.fitted import (
    FittedPredictor,
    StepSample,
    forward_features,
    interpolation_weights,
    nnls,
    token_knots,
)
from superinfer.sim.hardware import get_hardware
from superinfer.sim.models import get_model
from superinfer.sim.predictor import BatchShape, ConstantPredictor
from superinfer.sim.roofline import RooflinePredictor


def test_batch_shape_tells_prefill_from_decode():
    # a 100-token prompt chunk after 28 cached tokens, two decodes, a first prompt chunk
    batch = BatchShape.of_lists([100, 1, 1, 8], [28, 50, 9, 0], [False, True, True, True])
    assert batch.num_seqs == 4
    assert batch.num_prefill_tokens == 108 and batch.num_decode_tokens == 2
    assert batch.num_sampled == 3
    assert batch.num_decode_context == 51 + 10
    assert batch.num_prefill_context == 28
    assert batch.num_prefill_pairs == 100 * (28 + 50.5) + 8 * 4.5


def test_roofline_decode_is_bound_by_reading_the_weights():
    model, hardware = get_model("llama-3-8b"), get_hardware("gh200-144")
    roofline = RooflinePredictor(model, hardware)
    one = roofline.forward_time(BatchShape.of_lists([1], [100]))
    weights_s = (model.weight_bytes - model.vocab_size * model.hidden_size * 2) / (
        hardware.hbm_gbps * 1e9 * hardware.memory_efficiency
    )
    assert one == pytest.approx(weights_s + hardware.step_overhead_s, rel=0.05)
    eight = roofline.forward_time(BatchShape.of_lists([1] * 8, [100] * 8))
    assert eight < 1.1 * one  # small batches ride on the same weight read


def test_roofline_prefill_is_bound_by_compute_and_grows_with_tokens():
    model, hardware = get_model("llama-3-8b"), get_hardware("gh200-144")
    roofline = RooflinePredictor(model, hardware)
    t4k = roofline.forward_time(BatchShape.of_lists([4096], [0]))
    t8k = roofline.forward_time(BatchShape.of_lists([8192], [0]))
    compute_s = (
        4096 * 2 * model.num_params / (hardware.peak_tflops * 1e12 * hardware.compute_efficiency)
    )
    assert t4k == pytest.approx(compute_s, rel=0.2)
    assert 2.0 < t8k / t4k * 2 < 2.6 * 2  # linear plus attention's quadratic share


def test_mixture_of_experts_reads_only_the_experts_its_tokens_reach():
    roofline = RooflinePredictor(get_model("mixtral-8x7b"), get_hardware("gh200-144"))
    assert roofline.num_experts_reached(1) == pytest.approx(2.0)
    assert 7.9 < roofline.num_experts_reached(64) <= 8.0
    one = roofline.forward_time(BatchShape.of_lists([1], [10]))
    many = roofline.forward_time(BatchShape.of_lists([1] * 64, [10] * 64))
    assert many > 2.5 * one  # all experts' weights read, not two
    dense = RooflinePredictor(get_model("llama-3-8b"), get_hardware("gh200-144"))
    ratio = one / dense.forward_time(BatchShape.of_lists([1], [10]))
    assert 1.2 < ratio < 1.8  # ~13B active parameters read against Llama's 8B


def test_slower_hardware_is_slower():
    batch = BatchShape.of_lists([1] * 64, [512] * 64)
    model = get_model("llama-3-8b")
    gh200 = RooflinePredictor(model, get_hardware("gh200-144")).forward_time(batch)
    h100 = RooflinePredictor(model, get_hardware("h100-pcie5")).forward_time(batch)
    assert h100 > gh200


def test_empty_batches_take_no_time():
    assert (
        RooflinePredictor(get_model("llama-3-8b"), get_hardware("h200")).forward_time(BatchShape())
        == 0
    )
    assert ConstantPredictor(0.01, 1e-3).forward_time(
        BatchShape.of_lists([3], [0])
    ) == pytest.approx(0.013)


def test_nnls_matches_least_squares_when_unconstrained_and_clips_otherwise():
    rng = np.random.default_rng(0)
    a = rng.random((40, 3))
    x = np.array([1.0, 2.0, 0.5])
    assert nnls(a, a @ x) == pytest.approx(x, abs=1e-8)
    b = a @ np.array([1.0, -2.0, 0.5])
    solution = nnls(a, b)
    assert (solution >= 0).all() and solution[1] == 0


def test_token_knots_are_about_1_5x_apart_up_to_the_budget():
    assert token_knots(512) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
                                384, 512]  # fmt: skip
    assert token_knots(100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 100]
    assert token_knots(1) == [1]


def test_interpolation_weights_interpolate_and_extend_the_last_segment():
    knots = [1, 2, 4, 8]
    values = [10.0, 12.0, 20.0, 28.0]

    def at(x: float) -> float:
        return sum(w * v for w, v in zip(interpolation_weights(x, knots), values))

    assert at(1) == 10.0 and at(4) == 20.0 and at(8) == 28.0
    assert at(3) == pytest.approx(16.0) and at(6) == pytest.approx(24.0)
    assert at(0.5) == 10.0  # held below the first knot
    assert at(12) == pytest.approx(36.0)  # the last slope (2 per token) continues


DENSE = {k: 0.03 + (0.0 if k < 8 else 5e-4 * (k - 8)) for k in token_knots(512)}  # flat, then up
LINEAR = [1e-4, 1e-7, 2e-6, 1e-6, 3e-4]  # sampled, prefill pairs, decode ctx, prefill ctx, seqs


def _synthetic_samples(num: int = 150) -> list[StepSample]:
    """Steps whose true cost is `DENSE` (piecewise linear in tokens) plus `LINEAR`, with
    token counts that reach every knot."""
    rng = random.Random(1)
    knots = token_knots(512)
    samples = []
    for i in range(num):
        num_decode = knots[i % 12] if i % 3 else rng.randint(0, 40)
        prefill = [rng.randint(2, 400)] if i % 3 == 0 or rng.random() < 0.3 else []
        context = [rng.randint(0, 300)] if prefill and rng.random() < 0.5 else [0]
        batch = BatchShape.of_lists(
            prefill + [1] * num_decode,
            context[: len(prefill)] + [rng.randint(10, 400) for _ in range(num_decode)],
        )
        if batch.num_seqs == 0 or batch.num_tokens > 512:
            continue
        features = forward_features(batch, knots)
        forward = sum(c * f for c, f in zip([DENSE[k] for k in knots] + LINEAR, features))
        samples.append(StepSample(batch, forward, 1e-3 + 2e-5 * batch.num_seqs))
    return samples


def test_fit_recovers_known_step_times_and_round_trips(tmp_path):
    samples = _synthetic_samples()
    fit = FittedPredictor.fit(samples, 512, {"machine": "test"})
    for sample in samples:
        assert fit.forward_time(sample.batch) == pytest.approx(sample.forward_s, rel=1e-3)
        assert fit.host_time(sample.batch) == pytest.approx(sample.host_s, rel=1e-3)
    assert fit.meta["forward_mean_rel_error"] < 1e-3
    assert max(abs(e) for e in fit.relative_errors(samples)) < 1e-3
    path = tmp_path / "fit.json"
    fit.save(str(path))
    loaded = FittedPredictor.load(str(path))
    assert loaded.knots == fit.knots
    assert loaded.forward_coef == pytest.approx(fit.forward_coef)
    assert len(FittedPredictor.samples_of(loaded.to_dict())) == len(samples)
    assert "samples" not in loaded.describe()["meta"]


def test_fit_drops_knots_no_sample_reaches():
    samples = [s for s in _synthetic_samples() if s.batch.num_tokens <= 48]
    fit = FittedPredictor.fit(samples, 512)
    assert fit.knots[-1] <= 64 and 512 not in fit.knots


def test_a_fit_without_knots_asks_for_a_refit(tmp_path):
    old = {"predictor": "fitted", "forward": {"const": 0.03}, "host": {"const": 0.0, "seqs": 0.0}}
    with pytest.raises(ValueError, match="superinfer calibrate"):
        FittedPredictor.from_dict(old)


def test_the_committed_cpu_fit_is_sane():
    fit = FittedPredictor.load("cpu_smollm2.json")
    decode = fit.forward_time(BatchShape.of_lists([1] * 32, [200] * 32))
    prefill = fit.forward_time(BatchShape.of_lists([256], [0]))
    assert 0.005 < decode < 1.0 and 0.01 < prefill < 2.0
    assert fit.forward_time(BatchShape.of_lists([512], [0])) > prefill
    assert fit.meta["link"]["gbps_per_direction"] > 0
