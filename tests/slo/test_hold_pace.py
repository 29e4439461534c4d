"""The KV check's learned paces: the band of speeds a class's requests really run at."""

from __future__ import annotations

import pytest

from superinfer.slo.hold_pace import HoldPace, Pace


def test_a_class_is_projected_at_the_widest_band_until_enough_have_finished() -> None:
    pace = HoldPace(fast_quantile=0.1, slow_quantile=0.9, window=64, min_samples=16)
    for _ in range(15):
        pace.observe("bronze", tbt_s=1.0, mean_gap_s=0.02)
    # a token a step, the last token at the promise's end
    assert pace.pace("bronze", tbt_s=1.0, step_s=0.01) == Pace(0.01, 1.0)
    pace.observe("bronze", tbt_s=1.0, mean_gap_s=0.02)
    assert pace.pace("bronze", tbt_s=1.0, step_s=0.01) == Pace(pytest.approx(0.02),
                                                              pytest.approx(0.02))  # fmt: skip
    assert pace.pace("gold", tbt_s=0.1, step_s=0.01) == Pace(0.01, 0.1)  # each class its own


def test_the_band_spans_the_classes_fast_and_slow_quantiles_of_its_target() -> None:
    pace = HoldPace(fast_quantile=0.1, slow_quantile=0.9, window=64, min_samples=16)
    for i in range(20):  # ratios 0.01 .. 0.20 of a 0.5 s target
        pace.observe(None, tbt_s=0.5, mean_gap_s=0.005 * (i + 1))
    assert pace.bands()[None] == pytest.approx((0.03, 0.19))
    # a request with a 1 s target of the same class scales with its own target
    assert pace.pace(None, tbt_s=1.0, step_s=0.01) == Pace(pytest.approx(0.03),
                                                          pytest.approx(0.19))  # fmt: skip
    # never faster than a step, never slower than the target
    assert pace.pace(None, tbt_s=1.0, step_s=0.05) == Pace(0.05, pytest.approx(0.19))
    assert pace.pace(None, tbt_s=0.1, step_s=0.5) == Pace(0.1, 0.1)


def test_a_slow_spell_fills_the_window_and_widens_the_band_again() -> None:
    pace = HoldPace(window=32, min_samples=16)
    for _ in range(32):
        pace.observe("silver", tbt_s=0.2, mean_gap_s=0.01)
    assert pace.pace("silver", tbt_s=0.2, step_s=0.01).release_s_per_token == pytest.approx(0.01)
    for _ in range(32):  # parked in the host tier, long steps: gaps near the target
        pace.observe("silver", tbt_s=0.2, mean_gap_s=0.19)
    assert pace.pace("silver", tbt_s=0.2, step_s=0.01).release_s_per_token == pytest.approx(0.19)


def test_requests_without_a_target_teach_nothing_and_are_never_freed_by_one() -> None:
    pace = HoldPace(min_samples=1)
    pace.observe(None, tbt_s=0.0, mean_gap_s=0.01)
    pace.observe(None, tbt_s=0.5, mean_gap_s=float("nan"))
    pace.observe(None, tbt_s=0.5, mean_gap_s=-1.0)
    assert pace.bands() == {}
    assert pace.pace(None, tbt_s=0.0, step_s=0.01) == Pace(0.01, 0.0)  # 0: no bound
    with pytest.raises(ValueError):
        HoldPace(fast_quantile=0.9, slow_quantile=0.1)
