"""Class mixes and per-request targets (the wire form: tests/slo/test_wire.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from superinfer.bench.request_slo import class_sequence, parse_class_mix, request_targets
from superinfer.slo import SLOTargets
from superinfer.slo.classes import SLOConfig


def test_parse_class_mix_normalizes():
    assert parse_class_mix("gold=0.2,silver=0.5,bronze=0.3") == pytest.approx(
        {"gold": 0.2, "silver": 0.5, "bronze": 0.3}
    )
    assert parse_class_mix("a=1, b=3") == {"a": 0.25, "b": 0.75}
    for bad in ("gold", "gold=x", "gold=-1", "a=0,b=0", "a=1,a=2", "=1"):
        with pytest.raises(ValueError):
            parse_class_mix(bad)


def test_each_class_gets_exactly_its_share_in_a_seeded_order():
    mix = {"gold": 0.2, "silver": 0.5, "bronze": 0.3}
    names = class_sequence(10, mix, seed=1)
    assert Counter(names) == {"gold": 2, "silver": 5, "bronze": 3}
    assert names == class_sequence(10, mix, seed=1)
    assert len(class_sequence(7, mix, seed=1)) == 7  # largest remainder fills the rest


def test_targets_come_from_the_class_and_explicit_values_override():
    config = SLOConfig()  # built-in gold 500/100, silver 1000/200, bronze 5000/1000
    targets = request_targets(4, {"gold": 0.5, "bronze": 0.5}, config, seed=0)
    by_class = {t.slo_class: t for t in targets}
    assert (by_class["gold"].ttft_ms, by_class["gold"].tbt_ms) == (500, 100)
    assert (by_class["bronze"].ttft_ms, by_class["bronze"].tbt_ms) == (5000, 1000)
    overridden = request_targets(2, {"gold": 1.0}, config, tbt_ms=30, max_latency_ms=900)
    assert overridden[0] == SLOTargets(500, 30, 900, "gold")
    plain = request_targets(2, None, config, ttft_ms=250)
    assert plain == [SLOTargets(250, 200, None, None)] * 2
    with pytest.raises(ValueError, match="unknown SLO classes"):
        request_targets(2, {"platinum": 1.0}, config)
