"""Class isolation: a class's reserved blocks and token budget are kept from lower classes."""

from __future__ import annotations

import pytest

from superinfer.core.request import RequestStatus
from superinfer.slo import SLOTargets
from tests.core.test_policies import step
from tests.factories import make_request, make_scheduler, run_to_completion

RESERVATIONS = {"gold": (0.5, 0.5), "silver": (0.0, 0.0), "bronze": (0.0, 0.0)}


def classed(request, name):
    request.slo = SLOTargets(slo_class=name)
    return request


@pytest.mark.parametrize("policy", ["rotasched", "fcfs-recompute", "priority"])
def test_bronze_flood_leaves_gold_its_reserved_blocks(policy):
    s = make_scheduler(policy, num_device_blocks=40, block_size=4, max_num_batched_tokens=512,
                       class_reservations=RESERVATIONS)  # fmt: skip
    for i in range(30):
        s.add_request(classed(make_request(12, max_tokens=30, arrival_time=i * 1e-3), "bronze"))
    pending: list[int] = []
    for t in range(10):
        step(s, t * 0.01, pending)
        bronze_blocks = sum(s.kv.num_device_blocks_of(r) for r in s.running)
        assert bronze_blocks <= 20  # half the pool is gold's
    gold = [classed(make_request(12, max_tokens=5, arrival_time=0.1, request_id=f"g{i}"), "gold")
            for i in range(3)]  # fmt: skip
    for g in gold:
        s.add_request(g)
    out = step(s, 0.1, pending)
    assert {g.request_id for g in gold} <= {q.request_id for q in out.sequences}
    run_to_completion(s, pending=pending, now=0.2)
    assert all(g.status is RequestStatus.FINISHED_LENGTH for g in gold)


def test_token_budget_share_is_kept_for_a_class_with_work():
    s = make_scheduler(num_device_blocks=200, max_num_batched_tokens=40,
                       class_reservations={"gold": (0.0, 0.5)})  # fmt: skip
    s.add_request(classed(make_request(100, request_id="b"), "bronze"))
    out = s.schedule(0.0)
    assert out.num_batched_tokens == 40  # no gold work: bronze may take the whole budget
    s.add_request(classed(make_request(100, request_id="g"), "gold"))
    s.update_from_output(out, type("M", (), {"sampled_token_ids": {}})(), 0.0)
    out = s.schedule(0.1)
    counts = {q.request_id: q.num_query_tokens for q in out.sequences}
    assert counts.get("b", 0) <= 20 and counts["g"] >= 20


def test_proactive_rotation_takes_lower_classes_first():
    s = make_scheduler("rotasched", num_device_blocks=20, block_size=4, rotation_budget=4,
                       max_num_batched_tokens=256,
                       class_reservations={"gold": (0.0, 0.0), "bronze": (0.0, 0.0)})  # fmt: skip
    gold = classed(make_request(20, max_tokens=40, arrival_time=0.0, request_id="gold"), "gold")
    bronze = [classed(make_request(20, max_tokens=40, arrival_time=0.01, request_id=f"b{i}"), "bronze")
              for i in range(2)]  # fmt: skip
    for r in [gold, *bronze]:
        s.add_request(r)
    pending: list[int] = []
    step(s, 0.0, pending)  # gold entered first: it is the longest resident
    s.add_request(classed(make_request(12, max_tokens=4, arrival_time=0.05, request_id="new"), "bronze"))
    rotated: list[str] = []
    for t in range(1, 12):
        rotated += step(s, t * 0.1, pending).swapped_out_request_ids
    assert rotated and "gold" not in rotated
    run_to_completion(s, pending=pending, now=2.0)
