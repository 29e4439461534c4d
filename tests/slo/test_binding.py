"""SLO binding at ingress: classes, header/body precedence, deadlines, bad values."""

from __future__ import annotations

import pytest

from superinfer.server.arrival import Arrival
from superinfer.server.errors import APIError
from superinfer.server.protocol import SLOBody
from superinfer.slo import SLOTargets
from superinfer.slo.binding import bind_slo
from superinfer.slo.classes import SLOClass, SLOConfig

CONFIG = SLOConfig(
    classes=(
        SLOClass("gold", ttft_ms=200, tbt_ms=50),
        SLOClass("bronze", ttft_ms=5000, tbt_ms=900),
    ),
    default_targets=SLOTargets(1000, 200),
)
ARRIVAL = Arrival(monotonic=100.0, wall=1_700_000_000.0)


def bind(headers=None, body=None, config=CONFIG):
    return bind_slo(headers or {}, SLOBody(**body) if body else None, config, ARRIVAL)


def test_defaults_without_anything():
    bound = bind()
    assert bound.targets == SLOTargets(1000, 200) and bound.slo_class is None


def test_class_supplies_defaults_and_explicit_fields_override():
    assert bind({"x-slo-class": "gold"}).targets == SLOTargets(200, 50, None, "gold")
    # an explicit target overrides the class's, even a looser one
    assert bind(body={"class": "gold", "ttft_ms": 800}).targets.ttft_ms == 800


def test_stricter_of_header_and_body_holds():
    targets = bind(
        {"x-slo-ttft-ms": "300", "x-slo-tbt-ms": "90"}, {"ttft_ms": 250, "tbt_ms": 120}
    ).targets
    assert (targets.ttft_ms, targets.tbt_ms) == (250, 90)


def test_header_class_wins_over_the_body():
    assert bind({"x-slo-class": "bronze"}, {"class": "gold"}).targets.slo_class == "bronze"


def test_deadline_header_is_relative_to_arrival_and_competes_with_max_latency():
    deadline_ms = ARRIVAL.wall * 1000 + 1500
    assert bind({"x-slo-deadline": str(deadline_ms)}).targets.max_latency_ms == pytest.approx(1500)
    both = bind({"x-slo-deadline": str(deadline_ms), "x-slo-max-latency": "900"}).targets
    assert both.max_latency_ms == 900
    assert bind(body={"max_latency_ms": 700}).targets.max_latency_ms == 700


def test_past_deadline_is_425():
    with pytest.raises(APIError) as info:
        bind({"x-slo-deadline": str(ARRIVAL.wall * 1000 - 1)})
    assert info.value.status == 425 and info.value.code == "slo_infeasible"


@pytest.mark.parametrize(
    "headers, body, code",
    [
        ({"x-slo-class": "platinum"}, None, "unknown_slo_class"),
        (None, {"class": "platinum"}, "unknown_slo_class"),
        ({"x-slo-ttft-ms": "abc"}, None, "invalid_slo"),
        ({"x-slo-ttft-ms": "-5"}, None, "invalid_slo"),
        ({"x-slo-tbt-ms": "nan"}, None, "invalid_slo"),
        ({"x-slo-max-latency": "inf"}, None, "invalid_slo"),
        ({"x-slo-deadline": "tomorrow"}, None, "invalid_slo"),
        (None, {"ttft_ms": 0}, "invalid_slo"),
        (None, {"tbt_ms": -1}, "invalid_slo"),
    ],
)
def test_bad_values_are_400(headers, body, code):
    with pytest.raises(APIError) as info:
        bind(headers, body)
    assert info.value.status == 400 and info.value.code == code


def test_admission_holds_a_request_to_a_ttft_it_gave_or_its_class_gave():
    assert bind().binding_ttft_ms is None  # server defaults: best effort on TTFT
    assert bind({"x-slo-ttft-ms": "300"}).binding_ttft_ms == 300
    assert bind(body={"ttft_ms": 400}).binding_ttft_ms == 400
    assert bind({"x-slo-class": "gold"}).binding_ttft_ms == 200
    assert bind({"x-slo-tbt-ms": "90"}).binding_ttft_ms is None


def test_admission_holds_a_request_to_a_tbt_it_gave_or_its_class_gave():
    assert bind().binding_tbt_ms is None
    assert bind({"x-slo-tbt-ms": "90"}).binding_tbt_ms == 90
    assert bind(body={"tbt_ms": 120}).binding_tbt_ms == 120
    assert bind({"x-slo-class": "gold"}).binding_tbt_ms is not None
    assert bind({"x-slo-ttft-ms": "300"}).binding_tbt_ms is None


def test_gateway_headers_are_targets_and_the_stricter_holds():
    """llm-d's names and their older aliases (x-slo-tpot-ms), alone and with superinfer's."""
    alone = bind({"x-llm-d-slo-ttft-ms": "450", "x-llm-d-slo-tpot-ms": "70"})
    assert (alone.targets.ttft_ms, alone.targets.tbt_ms) == (450, 70)
    assert alone.binding_ttft_ms == 450  # a gateway's TTFT target binds like a client's
    assert bind({"x-slo-tpot-ms": "80"}).targets.tbt_ms == 80
    gateway_stricter = bind(
        {"x-llm-d-slo-ttft-ms": "300", "x-slo-ttft-ms": "900", "x-llm-d-slo-tpot-ms": "40"},
        {"tbt_ms": 60},
    ).targets
    assert (gateway_stricter.ttft_ms, gateway_stricter.tbt_ms) == (300, 40)
    own_stricter = bind(
        {"x-llm-d-slo-ttft-ms": "900", "x-slo-ttft-ms": "250", "x-slo-tpot-ms": "95",
         "x-slo-tbt-ms": "50"},
    ).targets  # fmt: skip
    assert (own_stricter.ttft_ms, own_stricter.tbt_ms) == (250, 50)
    # a gateway's target still overrides the class's default, as an explicit target does
    assert bind({"x-slo-class": "gold", "x-llm-d-slo-tpot-ms": "500"}).targets.tbt_ms == 500


@pytest.mark.parametrize("name", ["x-llm-d-slo-ttft-ms", "x-llm-d-slo-tpot-ms", "x-slo-tpot-ms"])
def test_bad_gateway_header_is_400_naming_it(name):
    with pytest.raises(APIError) as info:
        bind({name: "soon"})
    assert (info.value.status, info.value.code, info.value.param) == (400, "invalid_slo", name)


def test_a_past_deadline_says_so_in_its_reason():
    with pytest.raises(APIError) as info:
        bind({"x-slo-deadline": str(ARRIVAL.wall * 1000 - 1)})
    assert info.value.reason == "deadline_passed"
