"""router.py: the replica ranking by predicted slack and the merged rejection (pure, no Ray)."""

from __future__ import annotations

from superinfer.cluster.router import (
    QUEUE_FULL,
    Demand,
    Refusal,
    ReplicaLoad,
    Unreported,
    merge_rejections,
    predict,
    rank_replicas,
    slack,
)

STEP, PREFILL = 0.05, 0.001  # seconds per decode step, per prompt token
DEMAND = Demand(num_prompt_tokens=100, max_tokens=20, ttft_s=1.0, tbt_s=0.2)


def _load(replica_id: str, **kwargs: float) -> ReplicaLoad:
    base = {"step_time_s": STEP, "prefill_s_per_token": PREFILL, "num_running": 4}
    return ReplicaLoad(replica_id, **{**base, **kwargs})


def test_prediction_counts_the_queue_ahead_and_the_rotated_out():
    idle, busy = _load("a"), _load("b", num_queued=3, num_queued_tokens=600, num_swapped=4)
    assert predict(idle, DEMAND).ttft_s == 100 * PREFILL + STEP
    assert predict(busy, DEMAND).ttft_s == 700 * PREFILL + STEP
    assert predict(idle, DEMAND).tbt_s == STEP * 5 / 4  # joins a batch of 4
    assert predict(busy, DEMAND).tbt_s == STEP * 3  # 4 running, 4 rotated out, 3 queued, it
    assert predict(idle, DEMAND).e2e_s == predict(idle, DEMAND).ttft_s + 19 * STEP * 5 / 4


def test_the_replica_with_more_slack_comes_first():
    short = _load("a", num_queued=1, num_queued_tokens=50)
    long = _load("b", num_queued=1, num_queued_tokens=800)  # 0.8 s of prefill ahead
    assert rank_replicas([long, short], DEMAND) == ["a", "b"]
    assert rank_replicas([short, long], DEMAND) == ["a", "b"]


def test_not_round_robin_the_idle_replica_keeps_winning_until_its_load_shows():
    loads = [_load("a", num_queued_tokens=0), _load("b", num_queued=2, num_queued_tokens=400)]
    assert [rank_replicas(loads, DEMAND)[0] for _ in range(3)] == ["a", "a", "a"]
    # requests routed to "a" since its last report count against it
    sent = {"a": Unreported(num_requests=5, num_prompt_tokens=500)}
    assert rank_replicas(loads, DEMAND, sent)[0] == "b"


def test_slack_is_the_worst_target_relative_to_its_size():
    fast_decode = _load("a", num_queued_tokens=500)  # ttft 0.65 s of 1 s; tbt 0.06 of 0.2
    rotating = _load("b", num_swapped=12)  # ttft 0.15 s; tbt 0.21 s: no room between tokens
    assert slack(predict(fast_decode, DEMAND), DEMAND) > slack(predict(rotating, DEMAND), DEMAND)
    assert rank_replicas([rotating, fast_decode], DEMAND) == ["a", "b"]


def test_a_deadline_ranks_by_end_to_end_time():
    demand = Demand(100, max_tokens=200, ttft_s=5.0, tbt_s=1.0, deadline_s=16.0)
    slow_steps = _load("a", step_time_s=0.08)  # e2e ~ 20 s: misses the deadline
    long_queue = _load("b", num_queued_tokens=2000)  # e2e ~ 14.6 s
    assert rank_replicas([slow_steps, long_queue], demand) == ["b", "a"]


def test_a_full_queue_goes_last_whatever_its_slack():
    full = _load("a", num_queued=2, max_num_queued_reqs=2)
    loaded = _load("b", num_queued=1, num_queued_tokens=900)
    assert rank_replicas([full, loaded], DEMAND) == ["b", "a"]


def test_ties_break_by_id_for_a_deterministic_order():
    assert rank_replicas([_load("b"), _load("c"), _load("a")], DEMAND) == ["a", "b", "c"]


def test_stats_round_trip_and_an_unreported_replica_is_idle():
    load = _load("a", num_queued=3, device_kv_usage=0.5, reported_at=12.5)
    assert ReplicaLoad.from_stats("a", load.to_stats()) == load
    assert ReplicaLoad.from_stats("z", {}) == ReplicaLoad("z")


def test_merged_rejection_prefers_retry_later_when_a_queue_was_the_reason():
    infeasible = Refusal(425, "cannot meet the deadline", "slo_infeasible", {})
    full = [Refusal(429, "full", QUEUE_FULL, {"Retry-After": s}) for s in ("7", "2")]
    assert merge_rejections([infeasible, infeasible]) == infeasible
    merged = merge_rejections([infeasible, *full])
    assert (merged.status, merged.code, merged.headers["Retry-After"]) == (429, QUEUE_FULL, "2")
