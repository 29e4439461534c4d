"""SLO classes from YAML/JSON: order, defaults, reservations, and errors."""

from __future__ import annotations

import json

import pytest

from superinfer.slo.classes import (
    SLOConfigError,
    default_classes,
    load_slo_config,
    parse_slo_config,
)

YAML = """
default_class: silver
default_targets: {ttft_ms: 900, tbt_ms: 150}
classes:
  - name: gold
    ttft_ms: 300
    tbt_ms: 60
    reserved_kv_share: 0.3
    reserved_token_share: 0.25
  - name: silver
    ttft_ms: 1000
  - name: bronze
    ttft_ms: 8000
    tbt_ms: 1000
    max_latency_ms: 60000
    reject_infeasible: false
    priority: 9
"""


def test_yaml_file(tmp_path):
    path = tmp_path / "slo.yaml"
    path.write_text(YAML)
    config = load_slo_config(path)
    assert config.class_names == ["gold", "silver", "bronze"]
    assert config.default_class == "silver"
    assert config.default_targets.ttft_ms == 900 and config.default_targets.tbt_ms == 150
    assert config.reservations() == {"gold": (0.3, 0.25)}
    gold = config.get("gold").targets()
    assert (gold.ttft_ms, gold.tbt_ms, gold.slo_class) == (300, 60, "gold")
    assert not config.get("bronze").reject_infeasible
    assert [config.priority_of(n) for n in ("gold", "silver", "bronze", None)] == [0, 1, 9, 0]
    assert config.rank("bronze") == 2 and config.rank("other") == 3


def test_json_mapping_form_keeps_order(tmp_path):
    path = tmp_path / "slo.json"
    path.write_text(json.dumps({"classes": {"fast": {"ttft_ms": 100}, "slow": {}}}))
    assert load_slo_config(path).class_names == ["fast", "slow"]


def test_defaults_without_a_file():
    config = load_slo_config(None)
    assert config.class_names == ["gold", "silver", "bronze"]
    assert config.reservations() == {}
    assert config.default_class is None


@pytest.mark.parametrize(
    "data",
    [
        [1, 2],
        {"classez": []},
        {"classes": [{"name": "a", "ttft": 5}]},
        {"classes": [{"name": "a", "ttft_ms": -5}]},
        {"classes": [{"name": "a", "ttft_ms": "fast"}]},
        {"classes": [{"name": "a", "tbt_ms": float("nan")}]},
        {"classes": [{"name": "a", "reserved_kv_share": 1.5}]},
        {
            "classes": [
                {"name": "a", "reserved_kv_share": 0.6},
                {"name": "b", "reserved_kv_share": 0.6},
            ]
        },
        {"classes": [{"name": "a"}, {"name": "a"}]},
        {"classes": [{"name": ""}]},
        {"classes": [{"name": "a", "reject_infeasible": "no"}]},
        {"default_class": "platinum"},
        {"default_targets": {"ttft_ms": 0}},
    ],
)
def test_invalid_configs_are_errors(data):
    with pytest.raises(SLOConfigError):
        parse_slo_config(data)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SLOConfigError, match="cannot read"):
        load_slo_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SLOConfigError, match="not valid JSON"):
        load_slo_config(bad)


def test_every_default_class_is_refused_when_its_targets_cannot_be_met():
    # "if we accept it, we keep it": without --slo-config no class is served best effort
    assert [c.name for c in default_classes()] == ["gold", "silver", "bronze"]
    assert all(c.reject_infeasible for c in default_classes())
