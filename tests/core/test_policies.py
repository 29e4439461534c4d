"""Scenario tests of each policy, driven by a fake model and a fake clock."""

from __future__ import annotations

import pytest

from superinfer.core.policies import MemoryState, available_policies
from superinfer.core.policies.rotasched import virtual_lag_time
from superinfer.core.request import RequestStatus
from superinfer.slo import SLOTargets
from tests.factories import (
    fake_model_output,
    make_request,
    make_scheduler,
    run_roomy_and_tight,
    run_to_completion,
)

ALL_POLICIES = ["rotasched", "ddps", "edf", "priority", "fcfs-recompute", "fcfs-swap"]


def step(scheduler, now, pending=None):
    """One engine step: land earlier copies, schedule, 'run', update. Returns the output."""
    if pending is not None:
        scheduler.complete_transfers(pending)
        pending.clear()
    out = scheduler.schedule(now)
    if pending is not None:
        pending.extend(t.transfer_id for t in out.transfers)
    scheduler.update_from_output(out, fake_model_output(out), now)
    scheduler.check_invariants()
    return out


def with_slo(request, ttft_ms=1000.0, tbt_ms=200.0):
    request.slo = SLOTargets(ttft_ms=ttft_ms, tbt_ms=tbt_ms)
    return request


def test_every_policy_is_registered():
    assert set(ALL_POLICIES) <= set(available_policies())


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_outputs_under_memory_pressure_equal_the_unconstrained_run(policy):
    def workload():
        return [
            with_slo(make_request(5 + 3 * i, max_tokens=6 + 2 * i, arrival_time=i * 0.01,
                                  request_id=f"q{i}"), ttft_ms=50 + 10 * i, tbt_ms=30)
            for i in range(10)
        ]  # fmt: skip

    _, tight, reference, pressured = run_roomy_and_tight(policy, workload)
    assert [r.output_token_ids for r in pressured] == [r.output_token_ids for r in reference]
    moved = tight.stats.num_preemptions + tight.stats.num_swap_outs
    assert moved > 0 and all(r.is_finished for r in pressured)


# --- rotasched ------------------------------------------------------------------------------


def test_vlt_follows_the_definition():
    r = with_slo(make_request(arrival_time=1.0), ttft_ms=500, tbt_ms=100)
    assert virtual_lag_time(r, 2.0) == pytest.approx(1.0 - 0.5)  # waiting
    r.output_token_times.append(2.0)
    r.status = RequestStatus.SWAPPED
    assert virtual_lag_time(r, 2.3) == pytest.approx(0.3 - 0.1)  # rotary
    r.status, r.running_since = RequestStatus.RUNNING, 2.1
    assert virtual_lag_time(r, 2.3) == pytest.approx(-0.2)  # running


def test_rotasched_serves_waiting_and_rotary_in_one_largest_vlt_first_queue():
    s = make_scheduler("rotasched")
    fresh = with_slo(make_request(arrival_time=9.9, request_id="fresh"), ttft_ms=1000)
    late = with_slo(make_request(arrival_time=8.0, request_id="late"), ttft_ms=1000)  # VLT +1.0
    rotary = with_slo(make_request(arrival_time=0.0, request_id="rotary"), tbt_ms=100)
    rotary.output_token_times.append(9.5)  # VLT 0.5 - 0.1 = +0.4
    rotary.status = RequestStatus.SWAPPED
    order = s.policy.order_queue([fresh, late], [rotary], now=10.0)
    assert [r.request_id for r in order] == ["late", "rotary", "fresh"]


def test_rotasched_rotates_proactively_before_an_allocation_fails():
    # 20 blocks of 4 tokens, budget 4 blocks. Three requests fill the pool; a fourth waits.
    s = make_scheduler("rotasched", num_device_blocks=20, block_size=4, rotation_budget=4,
                       max_num_batched_tokens=256)  # fmt: skip
    running = [with_slo(make_request(20, max_tokens=40, arrival_time=0.0, request_id=f"r{i}"))
               for i in range(3)]  # fmt: skip
    for r in running:
        s.add_request(r)
    pending: list[int] = []
    step(s, 0.0, pending)  # all three prefill: 15 blocks used, 5 free
    assert s.stats.num_swap_outs == 0
    newcomer = with_slo(make_request(12, max_tokens=4, arrival_time=0.05, request_id="new"))
    s.add_request(newcomer)
    now, rotated = 0.1, None
    for _ in range(10):
        out = step(s, now, pending)
        now += 0.1
        if out.swapped_out_request_ids:
            rotated = out
            break
    assert rotated is not None
    assert s.stats.num_proactive_rotations >= 1
    assert s.stats.num_preemptions == 0  # nothing was dropped: no allocation ever failed
    # the victim is the longest-resident decode request: all entered together, so the first
    # in admission order among equals; it must be one of the running ones, not the newcomer
    assert rotated.swapped_out_request_ids[0].startswith("r")
    run_to_completion(s, pending=pending, now=now)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in running + [newcomer])


def memory(num_device=100, num_free=2, demand=500, host_usage=0.5, num_swapped=0):
    return MemoryState(num_device, num_free, demand, host_usage, num_swapped)


def test_rotasched_guards_on_host_usage():
    s = make_scheduler("rotasched", rotation_budget=10)
    policy = s.policy
    assert policy.rotation_target(memory()) == 10
    assert policy.rotation_target(memory(demand=50)) == 0  # everything fits: no rotation
    assert policy.rotation_target(memory(num_free=10)) == 0  # budget already free
    assert policy.rotation_target(memory(host_usage=0.95)) == 0  # host nearly full
    brand_new = make_request()
    rotary = make_request()
    rotary.status = RequestStatus.SWAPPED
    rotary.output_token_ids.append(5)
    assert policy.may_admit(brand_new, memory(host_usage=0.9))
    assert not policy.may_admit(brand_new, memory(host_usage=0.91))
    assert policy.may_admit(rotary, memory(host_usage=0.99))


def test_rotasched_falls_back_to_recompute_when_the_host_tier_is_full():
    s = make_scheduler("rotasched", num_device_blocks=14, num_host_blocks=0)
    requests = [make_request(5 + 3 * i, max_tokens=10, arrival_time=i * 0.01) for i in range(8)]
    for r in requests:
        s.add_request(r)
    run_to_completion(s)
    assert s.stats.num_swap_outs == 0 and s.stats.num_preemptions > 0


def test_rotasched_victims_are_never_mid_prefill():
    s = make_scheduler("rotasched")
    prefilling = make_request(40, request_id="p")
    prefilling.num_computed_tokens = 16
    decoding = make_request(8, request_id="d")
    decoding.num_computed_tokens = 8
    for r, since in ((prefilling, 0.0), (decoding, 1.0)):
        r.status, r.running_since = RequestStatus.RUNNING, since
    assert s.policy.pick_victim([prefilling, decoding], now=2.0) is decoding
    assert s.policy.pick_victim([prefilling], now=2.0) is None


def test_rotation_with_eager_writeback_moves_only_tails():
    s = make_scheduler("rotasched", num_device_blocks=20, block_size=4, rotation_budget=4,
                       max_num_batched_tokens=256)  # fmt: skip
    for i in range(6):
        s.add_request(with_slo(make_request(18, max_tokens=30, arrival_time=i * 0.01)))
    run_to_completion(s)
    kv = s.kv.stats
    assert s.stats.num_swap_outs > 0 and kv.num_writeback_blocks > 0
    # each swap-out copies at most its partial tail, the rest went by write-back
    assert kv.num_swap_out_blocks <= s.stats.num_swap_outs


# --- ddps, edf, priority --------------------------------------------------------------------


def test_ddps_urgency_rises_steeply_near_the_deadline():
    s = make_scheduler("ddps")
    r = with_slo(make_request(arrival_time=0.0), ttft_ms=1000)
    early, mid, late, past = (s.policy.urgency(r, t) for t in (0.0, 0.5, 0.9, 1.2))
    assert early < mid < late < past
    assert (late - mid) > (mid - early)  # convex: steeper near zero slack


def test_ddps_urgent_arrival_displaces_a_running_request_and_it_resumes():
    s = make_scheduler("ddps", num_device_blocks=100, max_num_seqs=2, min_residency_tokens=2)
    relaxed = [with_slo(make_request(8, max_tokens=50, request_id=f"bg{i}"), ttft_ms=10_000, tbt_ms=5_000)
               for i in range(2)]  # fmt: skip
    for r in relaxed:
        s.add_request(r)
    pending: list[int] = []
    now = 0.0
    for _ in range(4):
        step(s, now, pending)
        now += 0.01
    urgent = with_slo(make_request(8, max_tokens=3, arrival_time=now, request_id="urgent"), ttft_ms=20)
    s.add_request(urgent)
    out = step(s, now + 0.019, pending)  # slack nearly gone
    assert "urgent" in [q.request_id for q in out.sequences]
    assert len(out.swapped_out_request_ids) == 1  # one background request parked on the host
    run_to_completion(s, pending=pending, now=now + 0.02)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in relaxed + [urgent])


def test_ddps_does_not_thrash():
    s = make_scheduler("ddps", num_device_blocks=200, max_num_seqs=3, min_residency_tokens=4)
    requests = [with_slo(make_request(6, max_tokens=40, arrival_time=i * 0.001), ttft_ms=30, tbt_ms=30)
                for i in range(6)]  # fmt: skip
    for r in requests:
        s.add_request(r)
    pending: list[int] = []
    now = 0.0
    while s.has_unfinished_requests:
        step(s, now, pending)
        now += 0.01
    for r in requests:  # between two preemptions a request always makes progress
        assert r.num_swap_outs <= r.num_output_tokens // 4 + 1


def test_edf_orders_by_deadline_and_does_not_displace():
    s = make_scheduler("edf")
    a = with_slo(make_request(arrival_time=0.0, request_id="a"), ttft_ms=900)  # due 0.9
    b = with_slo(make_request(arrival_time=0.5, request_id="b"), ttft_ms=100)  # due 0.6
    assert [r.request_id for r in s.policy.order_queue([a, b], [], now=0.6)] == ["b", "a"]
    assert s.policy.pick_admission_victim(b, [a], now=0.6) is None


def test_priority_orders_and_preempts_lower_priority():
    s = make_scheduler("priority", num_device_blocks=100, max_num_seqs=1)
    low = make_request(8, max_tokens=20, request_id="low")
    low.priority = 5
    s.add_request(low)
    step(s, 0.0)
    high = make_request(8, max_tokens=2, request_id="high", arrival_time=1.0)
    high.priority = -1
    s.add_request(high)
    out = step(s, 1.0)
    assert out.preempted_request_ids == ["low"] and "high" in [q.request_id for q in out.sequences]
    equal = make_request(8, max_tokens=2, request_id="equal", arrival_time=2.0)
    equal.priority = -1
    s.add_request(equal)
    out = step(s, 2.0)
    assert not out.preempted_request_ids  # equal priority does not preempt
    run_to_completion(s)
