"""router.py: the replica ranking by slack on the replicas' own estimates and the merged
rejection (pure, no Ray)."""

from __future__ import annotations

import dataclasses

import pytest

from superinfer.cluster.prefix_index import PrefixIndex
from superinfer.cluster.router import (
    QUEUE_FULL,
    Demand,
    Refusal,
    ReplicaLoad,
    RoutedSince,
    learned_factors,
    merge_rejections,
    on_wall_clock,
    predict,
    rank_replicas,
    slack,
)
from superinfer.server.admission import Admission
from superinfer.server.admission import Demand as AdmissionDemand
from superinfer.slo.estimate import Correction, Decoding, EngineLoad, Queued

STEP, PREFILL = 0.05, 0.001  # seconds per decode step, per prompt token
DEMAND = Demand(num_prompt_tokens=100, max_tokens=20, ttft_s=1.0, tbt_s=0.2)
CLASSES = ("gold", "bronze")


def queue(num_requests: int, num_tokens: int, slo_class: str | None = None) -> tuple[Queued, ...]:
    if not num_requests:
        return ()
    return tuple(Queued(0.0, num_tokens // num_requests, slo_class) for _ in range(num_requests))


def _load(replica_id: str, num_queued: int = 0, num_queued_tokens: int = 0,
          queued: tuple[Queued, ...] = (), **kwargs) -> ReplicaLoad:  # fmt: skip
    engine_keys = {f.name for f in dataclasses.fields(EngineLoad)}
    engine = {"step_time_s": STEP, "prefill_s_per_token": PREFILL,
              **{k: v for k, v in kwargs.items() if k in engine_keys}}  # fmt: skip
    engine["queued"] = queued or queue(num_queued, num_queued_tokens)
    rest = {k: v for k, v in kwargs.items() if k not in engine_keys}
    return ReplicaLoad(replica_id, EngineLoad(**engine), **{"num_running": 4, **rest})


def trained(factor: float) -> Correction:
    """A correction that learned its first tokens come `factor` times the estimate."""
    correction = Correction(min_samples=5)
    for _ in range(10):
        correction.observe(None, 0.5, 0.5 * factor)
    return correction


def test_the_router_picks_the_replica_whose_own_estimate_is_lower():
    """Same queue, same step times: the replica that learned it is slow estimates a later
    first token, and the router sends the request to the other one."""
    slow = dataclasses.replace(_load("a", 1, 300), ttft_factors=learned_factors(trained(3.0), ()),
                               ttft_floor_s=0.1)  # fmt: skip
    fast = dataclasses.replace(_load("b", 1, 300), ttft_factors=learned_factors(trained(1.0), ()),
                               ttft_floor_s=0.1)  # fmt: skip
    assert predict(slow, DEMAND).ttft_s > predict(fast, DEMAND).ttft_s
    assert rank_replicas([slow, fast], DEMAND) == ["b", "a"]
    assert rank_replicas([fast, slow], DEMAND) == ["b", "a"]


@pytest.mark.parametrize("factor", [None, 0.7, 2.5])
def test_the_routers_ttft_is_what_the_replicas_admission_expects(factor):
    correction = trained(factor) if factor else Correction()
    gate = Admission(100, 100_000, CLASSES, correction)
    engine = EngineLoad(queue(3, 600, "gold") + queue(2, 900, "bronze"), STEP, PREFILL,
                        num_batched_tokens=256)  # fmt: skip
    load = ReplicaLoad("a", engine, CLASSES, learned_factors(correction, CLASSES),
                       correction.floor_s)  # fmt: skip
    for slo_class in ("gold", "bronze", None):
        demand = AdmissionDemand(120, 1, slo_class)
        expected = gate.expected_ttft_s(demand, gate.estimate(engine, demand))
        ours = predict(load, Demand(120, 1, slo_class=slo_class)).ttft_s
        assert ours == pytest.approx(expected)


def test_prediction_counts_the_queue_ahead_and_the_rotated_out():
    idle, busy = _load("a"), _load("b", 3, 600, num_swapped=4)
    assert predict(idle, DEMAND).ttft_s == pytest.approx(100 * PREFILL + STEP)
    assert predict(busy, DEMAND).ttft_s == pytest.approx(700 * PREFILL + 2 * STEP)  # 2 steps
    assert predict(idle, DEMAND).tbt_s == STEP * 5 / 4  # joins a batch of 4
    assert predict(busy, DEMAND).tbt_s == STEP * 3  # 4 running, 4 rotated out, 3 queued, it
    # every further token at the batch's pace
    assert predict(idle, DEMAND).e2e_s == pytest.approx(
        predict(idle, DEMAND).ttft_s + 19 * STEP * 5 / 4
    )


def test_a_burst_without_targets_spreads_even_when_one_replica_steps_faster():
    """No targets: ranked by end to end. Idle replicas, one measured 30% faster steps: the
    requests routed to it since its report slow all its tokens, so the burst spreads."""
    demand = Demand(num_prompt_tokens=8, max_tokens=16)
    loads = [_load("a", step_time_s=STEP * 0.7, num_running=0), _load("b", num_running=0)]
    sent: dict[str, list[Queued]] = {"a": [], "b": []}
    for _ in range(6):
        best = rank_replicas(loads, demand, sent)[0]
        sent[best].append(demand.as_queued())
    assert len(sent["a"]) >= len(sent["b"]) >= 2


def test_a_bronze_backlog_is_not_ahead_of_gold_on_the_replica_either():
    # 200 tokens: the backlog's 2 s of prefill, run in gold's steps, costs it 10 ms a gap
    gold = Demand(100, 200, ttft_s=1.0, tbt_s=0.2, slo_class="gold")
    bronze_backlog = dataclasses.replace(_load("a", queued=queue(4, 2000, "bronze")),
                                         class_order=CLASSES)  # fmt: skip
    gold_queue = dataclasses.replace(_load("b", queued=queue(2, 600, "gold")), class_order=CLASSES)
    assert rank_replicas([bronze_backlog, gold_queue], gold) == ["a", "b"]
    bronze = dataclasses.replace(gold, slo_class="bronze")
    assert rank_replicas([bronze_backlog, gold_queue], bronze) == ["b", "a"]


def lane(tbt_s: float, num_running: int, step_s: float, slo_class: str) -> ReplicaLoad:
    """A replica decoding `num_running` requests of one class at `step_s` a step, each 50
    tokens into 100 and on track for its TBT target."""
    on_track = Decoding(tbt_s, 100, 50, -50 * step_s, 0, slo_class)
    return _load(slo_class, step_time_s=step_s, num_running=num_running,
                 decoding=(on_track,) * num_running)  # fmt: skip


def test_requests_sort_themselves_by_their_tbt_instead_of_mixing():
    """A short batch of 100 ms gold requests, a long one of 1 s bronze requests. Bronze
    has more room of its own on the short batch, but it would cost gold its tokens there:
    it goes to the long batch. Gold goes where the batch is short."""
    gold_lane, bronze_lane = lane(0.1, 2, 0.06, "gold"), lane(1.0, 8, 0.16, "bronze")
    bronze = Demand(100, 100, ttft_s=5.0, tbt_s=1.0, slo_class="bronze")
    gold = Demand(100, 100, ttft_s=0.5, tbt_s=0.1, slo_class="gold")
    own = {name: predict(load, bronze) for name, load in
           (("gold", gold_lane), ("bronze", bronze_lane))}  # fmt: skip
    assert own["gold"].tbt_s < own["bronze"].tbt_s  # its own targets alone: the short batch
    assert own["gold"].promise_slack < slack(own["bronze"], bronze)
    assert rank_replicas([gold_lane, bronze_lane], bronze) == ["bronze", "gold"]
    assert rank_replicas([bronze_lane, gold_lane], gold) == ["gold", "bronze"]


def test_the_promises_cross_to_the_router_in_the_report():
    load = lane(0.1, 2, 0.06, "gold")
    back = ReplicaLoad.from_stats("gold", load.to_stats())
    assert back.engine.decoding == load.engine.decoding
    demand = Demand(100, 100, ttft_s=5.0, tbt_s=1.0, slo_class="bronze")
    assert predict(back, demand) == predict(load, demand)


def test_the_replica_with_more_slack_comes_first():
    short, long = _load("a", 1, 50), _load("b", 1, 800)  # 0.8 s of prefill ahead
    assert rank_replicas([long, short], DEMAND) == ["a", "b"]
    assert rank_replicas([short, long], DEMAND) == ["a", "b"]


def test_not_round_robin_the_idle_replica_keeps_winning_until_its_load_shows():
    loads = [_load("a"), _load("b", 2, 400)]
    assert [rank_replicas(loads, DEMAND)[0] for _ in range(3)] == ["a", "a", "a"]
    # requests routed to "a" since its last report join its queue in the estimate
    sent = {"a": [DEMAND.as_queued()] * 5}
    assert rank_replicas(loads, DEMAND, sent)[0] == "b"


def test_slack_is_the_worst_target_relative_to_its_size():
    fast_decode = _load("a", num_queued_tokens=500, queued=(Queued(0.0, 500),))
    rotating = _load("b", num_swapped=12)  # ttft 0.15 s; tbt 0.21 s: no room between tokens
    assert slack(predict(fast_decode, DEMAND), DEMAND) > slack(predict(rotating, DEMAND), DEMAND)
    assert rank_replicas([rotating, fast_decode], DEMAND) == ["a", "b"]


def test_a_deadline_ranks_by_end_to_end_time():
    demand = Demand(100, max_tokens=200, ttft_s=5.0, tbt_s=1.0, deadline_s=12.0)
    slow_steps = _load("a", step_time_s=0.08)  # e2e ~ 16 s: misses the deadline
    long_queue = _load("b", 1, 1000)  # e2e ~ 11.2 s
    assert rank_replicas([slow_steps, long_queue], demand) == ["b", "a"]


def test_a_full_queue_goes_last_whatever_its_slack():
    full = _load("a", 2, 20, max_num_queued_reqs=2)
    loaded = _load("b", 1, 900)
    assert rank_replicas([full, loaded], DEMAND) == ["b", "a"]


def test_ties_break_by_id_for_a_deterministic_order():
    assert rank_replicas([_load("b"), _load("c"), _load("a")], DEMAND) == ["a", "b", "c"]


def test_stats_are_plain_data_that_round_trip_and_an_unreported_replica_is_idle():
    load = dataclasses.replace(
        _load("a", queued=(Queued(12.0, 40, "gold"), Queued(13.0, 7)), device_kv_usage=0.5,
              reported_at=12.5, running_blocks_by_class={"gold": 3}),
        class_order=CLASSES, ttft_factors={"gold": 1.5, None: 1.2}, ttft_floor_s=0.1,
    )  # fmt: skip
    stats = load.to_stats()
    assert stats["engine"]["queued"] == [(12.0, 40, "gold", 0, 0.0), (13.0, 7, None, 0, 0.0)]
    assert ReplicaLoad.from_stats("a", stats) == load
    assert ReplicaLoad.from_stats("z", {}) == ReplicaLoad("z")


def test_the_load_is_exported_on_the_unix_clock():
    """Every time in it moves, so the estimates compare like with like: a queued deadline,
    a decoding request's first token and the load's own "now" (the first-token guard's
    room is a deadline less now)."""
    decoding = (Decoding(0.1, 9, 9, first_token_time=98.0), Decoding(0.1, 9, 9))
    engine = EngineLoad((Queued(105.0, 10),), decoding=decoding, now=100.0)
    wall = on_wall_clock(engine, 100.0, 1_700_000_000.0)
    assert wall.queued[0].deadline == 1_700_000_005.0  # 5 s after now, as on the engine
    assert wall.now == 1_700_000_000.0
    assert wall.decoding[0].first_token_time == 1_699_999_998.0
    assert wall.decoding[1].first_token_time is None  # still prefilling


def test_no_factor_before_the_replica_learned_one():
    assert learned_factors(Correction(), CLASSES) == {}
    assert set(learned_factors(trained(2.0), CLASSES)) == {"gold", "bronze", None}


def test_merged_rejection_prefers_retry_later_when_a_queue_was_the_reason():
    infeasible = Refusal(425, "cannot meet the deadline", "slo_infeasible", {},
                         "deadline_infeasible", 900.0)  # fmt: skip
    full = [Refusal(429, "full", QUEUE_FULL, {"Retry-After": s}, QUEUE_FULL, t)
            for s, t in (("7", 100.0), ("2", 200.0))]  # fmt: skip
    assert merge_rejections([infeasible, infeasible]) == infeasible
    merged = merge_rejections([infeasible, *full])
    assert (merged.status, merged.code, merged.headers["Retry-After"]) == (429, QUEUE_FULL, "2")
    assert (merged.reason, merged.estimated_ttft_ms) == (QUEUE_FULL, 200.0)


# --- the prefix index ---------------------------------------------------------------------
HISTORY = list(range(1000, 1320))  # 20 blocks of 16


def test_the_index_counts_the_leading_blocks_a_replica_was_sent():
    index = PrefixIndex()
    index.add("a", HISTORY, 16, capacity=0)
    follow_up = HISTORY + list(range(7, 107))
    assert index.num_cached_tokens("a", follow_up, 16) == 320
    assert index.num_cached_tokens("b", follow_up, 16) == 0
    # the last token is always computed, so an exact repeat hits all but its last block
    assert index.num_cached_tokens("a", HISTORY, 16) == 304
    # a different first block breaks the chain, whatever follows
    assert index.num_cached_tokens("a", [0] + HISTORY[1:] + [5], 16) == 0


def test_the_index_forgets_the_least_recently_routed_past_the_pool():
    index = PrefixIndex()
    index.add("a", HISTORY, 16, capacity=30)
    index.add("a", list(range(5000, 5320)), 16, capacity=30)  # 20 more: 10 of HISTORY go
    assert index.num_blocks("a") == 30
    assert index.num_cached_tokens("a", HISTORY + [1], 16) == 0  # its first blocks went first
    index.add("a", HISTORY[:160], 16, capacity=30)  # routed again: most recent now
    assert index.num_cached_tokens("a", HISTORY[:160] + [1], 16) == 160


def test_a_refused_request_takes_back_only_the_blocks_it_brought():
    routed = RoutedSince()
    load = _load("a", block_size=16, num_device_blocks=1000)
    routed.add("r1", "a", dataclasses.replace(DEMAND, prompt_token_ids=tuple(HISTORY[:160])),
               0.0, load)  # fmt: skip
    routed.add("r2", "a", dataclasses.replace(DEMAND, prompt_token_ids=tuple(HISTORY)), 0.0, load)
    routed.remove("r2", 1.0, is_refused=True)
    assert routed.prefixes.num_cached_tokens("a", HISTORY + [1], 16) == 160
    routed.remove("r1", 1.0)  # served: its blocks stay
    assert routed.prefixes.num_cached_tokens("a", HISTORY + [1], 16) == 160


def test_a_conversation_goes_back_where_its_history_is_cached():
    """Equal loads: the replica that holds the history estimates a shorter prefill, so
    the next turn goes there; power-of-two would pick either."""
    loads = [_load(name, num_queued=2, num_queued_tokens=400, block_size=16) for name in "ab"]
    index = PrefixIndex()
    index.add("b", HISTORY, 16, capacity=0)
    turn = dataclasses.replace(DEMAND, num_prompt_tokens=420,
                               prompt_token_ids=tuple(HISTORY + list(range(100))))  # fmt: skip
    assert rank_replicas(loads, turn) == ["a", "b"]  # without the index: a tie, by id
    assert rank_replicas(loads, turn, prefixes=index) == ["b", "a"]
    on_b = predict(loads[1], dataclasses.replace(turn, num_cached_tokens=320))
    # 320 tokens less to compute, and the 500 left fit one 512-token step instead of two
    assert predict(loads[1], turn).ttft_s - on_b.ttft_s == pytest.approx(320 * PREFILL + STEP)


def test_the_replicas_admission_and_the_router_agree_on_a_cached_prefix():
    load = _load("a", num_queued=1, num_queued_tokens=300)
    admission = Admission(100, 1 << 30)
    expected = admission.estimate(load.engine, AdmissionDemand(420, 20, num_cached_tokens=320))
    turn = dataclasses.replace(DEMAND, num_prompt_tokens=420, num_cached_tokens=320)
    routed = predict(load, turn)
    assert routed.ttft_s == pytest.approx(expected.raw_s)
