"""Admission: the deadline and TTFT checks (425) on the shared estimate, the bounded queue
(429), and the correction it learns from measured first tokens."""

from __future__ import annotations

import pytest

from superinfer.server.admission import Admission, Demand, Load, retry_after_s
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError
from superinfer.slo.estimate import Correction, Decoding, Queued

CLASSES = ("gold", "silver", "bronze")


def admission() -> Admission:
    return Admission(max_num_queued_reqs=4, max_num_queued_tokens=1000, class_order=CLASSES)


def queue(num_requests: int, num_tokens: int, slo_class: str | None = None) -> tuple[Queued, ...]:
    """`num_requests` queued requests with `num_tokens` prompt tokens in all."""
    if not num_requests:
        return ()
    sizes = [num_tokens // num_requests] * num_requests
    sizes[0] += num_tokens - sum(sizes)
    return tuple(Queued(0.0, n, slo_class) for n in sizes)


def load(num_requests: int = 0, num_tokens: int = 0, **kwargs) -> Load:
    return Load(queue(num_requests, num_tokens), step_time_s=0.05, prefill_s_per_token=0.002,
                **kwargs)  # fmt: skip


def check(load=None, prompt=100, max_tokens=10, max_latency_ms=None, elapsed_s=0.0, reject=True,
          ttft_ms=None, slo_class=None, gate=None, tbt_ms=None):  # fmt: skip
    gate = gate or admission()
    tbt_s = None if tbt_ms is None else tbt_ms / 1000
    demand = Demand(prompt, max_tokens, slo_class, 1.0, elapsed_s, tbt_s)
    return gate.check(load or Load(step_time_s=0.05, prefill_s_per_token=0.002), demand,
                      max_latency_ms, reject, ttft_ms)  # fmt: skip


def test_feasible_deadline_is_admitted_and_infeasible_is_425():
    check(max_latency_ms=1000)  # 0.2 + 0.05 to the first token, then 9 x 0.05
    with pytest.raises(APIError) as info:
        check(max_latency_ms=600)
    assert info.value.status == 425 and info.value.code == "slo_infeasible"


def test_time_already_spent_counts_and_a_past_deadline_is_always_425():
    with pytest.raises(APIError):
        check(max_latency_ms=1000, elapsed_s=0.5)
    with pytest.raises(APIError) as info:
        check(max_latency_ms=100, elapsed_s=0.2, reject=False)
    assert info.value.status == 425


def test_best_effort_class_is_not_rejected_on_the_estimate():
    check(max_latency_ms=300, reject=False)
    check(load(3, 900), ttft_ms=100, reject=False)


def test_queue_full_by_count_and_by_tokens():
    with pytest.raises(APIError) as info:
        check(load(4, 10))
    assert info.value.status == 429 and info.value.code == "queue_full"
    assert 1 <= int(info.value.headers["Retry-After"]) <= 60
    with pytest.raises(APIError):
        check(load(1, 950))
    check(load(), prompt=5000)  # an empty queue takes any single prompt


def test_retry_after_is_bounded():
    assert retry_after_s(Load()) == 1
    slow = Load(queue(10, 10**9), step_time_s=1.0, prefill_s_per_token=1.0)
    assert retry_after_s(slow) == 60


def test_a_first_token_that_cannot_come_in_time_is_425():
    backlog = load(3, 900)  # 1,000 tokens at 2 ms, 2 steps of 50 ms: 2.1 s to the first token
    assert check(backlog, ttft_ms=3000).raw_s == pytest.approx(2.1)
    with pytest.raises(APIError) as info:
        check(backlog, ttft_ms=2000)
    assert info.value.status == 425 and info.value.code == "slo_infeasible"
    assert "TTFT" in str(info.value)
    with pytest.raises(APIError):  # time spent before admission counts
        check(backlog, ttft_ms=3000, elapsed_s=1.0)


def test_a_bronze_backlog_is_not_ahead_of_gold():
    backlog = Load(queue(3, 900, "bronze"), step_time_s=0.05, prefill_s_per_token=0.0005)
    # gold's 100 tokens go first, in one step that 412 bronze tokens fill: 0.256 s + 0.05
    assert check(backlog, ttft_ms=500, slo_class="gold").raw_s == pytest.approx(0.306)
    with pytest.raises(APIError):  # 1,000 tokens in two steps: 0.6 s
        check(backlog, ttft_ms=500, slo_class="bronze")


def test_the_learned_correction_refuses_what_the_raw_estimate_would_admit():
    gate = admission()
    backlog = load(2, 300)  # raw: 0.8 s + a step
    assert check(backlog, ttft_ms=1000, gate=gate).raw_s == pytest.approx(0.85)
    for _ in range(30):  # gold's first tokens came 1.5x later than estimated
        gate.observe("gold", 0.6, 0.9)
    with pytest.raises(APIError):  # a class-less request borrows from every class
        check(backlog, ttft_ms=1000, gate=gate)
    silver_backlog = Load(queue(2, 300, "silver"), step_time_s=0.05, prefill_s_per_token=0.002)
    with pytest.raises(APIError):  # silver, without samples, borrows gold's correction
        check(silver_backlog, ttft_ms=1000, slo_class="silver", gate=gate)


def test_a_queue_full_of_bronze_does_not_turn_gold_away():
    full = Load(queue(4, 40, "bronze"), step_time_s=0.05, prefill_s_per_token=0.002)
    with pytest.raises(APIError) as info:
        check(full, slo_class="bronze")
    assert info.value.status == 429
    check(full, slo_class="gold")


def test_a_tbt_target_slower_steps_cannot_meet_is_425():
    steps = Load(step_time_s=0.3, decode_step_s=0.15, prefill_s_per_token=0.002)
    check(steps, tbt_ms=200)  # a decode step of 150 ms fits 90% of 200 ms
    with pytest.raises(APIError) as info:
        check(steps, tbt_ms=160)
    assert (info.value.status, info.value.reason) == (425, "tbt_infeasible")
    assert "TBT" in str(info.value)
    check(steps, tbt_ms=160, reject=False)  # a class that does not reject is served


def test_a_prompt_that_would_break_a_running_tpot_promise_is_425():
    # 100 gaps at 200 ms (20 s, 18 s with headroom), 10 s spent, 50 steps of 100 ms to go
    running = Decoding(0.2, 100, 50, first_token_time=0.0, slo_class="silver")
    busy = Load(step_time_s=0.1, decode_step_s=0.1, prefill_s_per_token=0.002,
                decoding=(running,), now=10.0)  # fmt: skip
    check(busy, prompt=1000, tbt_ms=200, slo_class="silver")  # 2 s of prefill fits
    with pytest.raises(APIError) as info:
        check(busy, prompt=2000, tbt_ms=200, slo_class="silver")  # 4 s does not
    assert (info.value.status, info.value.reason) == (425, "tbt_infeasible")
    assert "running" in str(info.value)
    check(busy, prompt=2000, tbt_ms=200, slo_class="gold")  # a silver promise yields to gold


def test_kv_the_promised_requests_would_need_on_the_device_beyond_the_pool_is_425():
    # steps of 100 ms, TBT 200 ms with 0.9 headroom: each needs its 10 blocks 56% of the time
    def running(slo_class):
        return Decoding(0.2, 100, 50, 0.0, slo_class=slo_class, num_final_tokens=160)

    busy = Load(step_time_s=0.1, decode_step_s=0.1, prefill_s_per_token=0.002, block_size=16,
                decoding=tuple(running("silver") for _ in range(7)), now=10.0,
                num_device_blocks=45)  # fmt: skip
    check(
        busy, prompt=60, max_tokens=100, tbt_ms=200, slo_class="silver"
    )  # 8 x 10 x 0.1 / (0.9 x 0.2) = 44.4 fits
    with pytest.raises(APIError) as info:  # 60 + 150 tokens: 14 blocks, 7 of them promised
        check(busy, prompt=60, max_tokens=150, tbt_ms=200, slo_class="silver")
    assert (info.value.status, info.value.reason) == (425, "tbt_infeasible")
    assert "device KV blocks" in str(info.value)
    check(busy, prompt=60, max_tokens=150, tbt_ms=200, slo_class="gold")  # silver yields


def test_a_higher_admission_quantile_refuses_what_a_lower_one_admits() -> None:
    """`--admission-quantile` scales the estimate by that quantile of the measured/estimated
    ratios: with 1 in 10 first tokens 3x late, the median admits a request the 0.95
    quantile refuses."""
    gates = {q: Admission(4, 1000, CLASSES, Correction(quantile=q)) for q in (0.5, 0.95)}
    for gate in gates.values():
        for i in range(40):
            gate.observe(None, 0.2, 0.6 if i % 10 == 0 else 0.2)
    busy = load(1, 150)  # 250 prompt tokens in all at 2 ms: 0.5 s + a step
    check(busy, ttft_ms=1000, gate=gates[0.5])
    with pytest.raises(APIError) as refused:
        check(busy, ttft_ms=1000, gate=gates[0.95])
    assert refused.value.status == 425


def test_the_admission_quantile_is_checked() -> None:
    assert ServerConfig(admission_quantile=0.98).admission_quantile == 0.98
    for bad in (0.2, 1.0, 1.5):
        with pytest.raises(ValueError, match="admission_quantile"):
            ServerConfig(admission_quantile=bad)


def test_kv_requests_their_promises_end_soon_make_room_for_a_new_one():
    """An admitted request frees its KV when its kept promise ends it: seven requests due
    to finish within a second leave room for a long one beside them, which counting every
    request at its final size refused. Requests without a TBT target count in full."""

    def finishing(tbt_s: float) -> Decoding:  # 150 of its 160 tokens held, 10 to come
        return Decoding(tbt_s, 100, 10, -9.0, slo_class="bronze", num_final_tokens=160)

    tiers = {"step_time_s": 0.05, "prefill_s_per_token": 0.002, "block_size": 16,
             "num_device_blocks": 40, "num_host_blocks": 100, "num_free_host_blocks": 100,
             "host_admission_guard": 0.9, "is_preempt_by_swap": True}  # fmt: skip
    # done by 1 s (first token 9 s ago, 100 gaps of 0.1 s); 85 blocks committable
    soon = Load(**tiers, decoding=tuple(finishing(0.1) for _ in range(7)))
    check(soon, prompt=100, max_tokens=141, ttft_ms=5000, slo_class="gold")  # 70 + 8 at 1 s
    with pytest.raises(APIError) as info:  # 70 + 18 blocks (280 tokens) just before 1 s
        check(soon, prompt=260, max_tokens=141, ttft_ms=5000, slo_class="gold")
    assert (info.value.status, info.value.reason) == (425, "kv_infeasible")
    unbounded = Load(**tiers, decoding=tuple(finishing(0.0) for _ in range(7)))
    with pytest.raises(APIError):  # 70 + 16 blocks: the sum of the final sizes
        check(unbounded, prompt=100, max_tokens=141, ttft_ms=5000, slo_class="gold")


def test_kv_the_admitted_requests_hold_when_done_beyond_both_tiers_is_425():
    """Every admitted request, whatever its class, keeps room for its KV to the end: past
    the device pool plus the committed half of the host tier up to the guard, making room
    would mean dropping one for recompute (or rotating without room to rotate in). A policy
    that does not rotate has only the device pool."""

    def running(slo_class: str) -> Decoding:
        return Decoding(1.0, 100, 50, 0.0, slo_class=slo_class, num_final_tokens=160)  # 10 blocks

    full = Load(step_time_s=0.05, prefill_s_per_token=0.002, block_size=16, num_device_blocks=40,
                num_host_blocks=100, num_free_host_blocks=100, host_admission_guard=0.9,
                is_preempt_by_swap=True,
                decoding=tuple(running("bronze") for _ in range(7)))  # fmt: skip
    # 70 blocks held; the tiers commit 40 + 45 (half the host tier up to its guard, 90 of
    # 100: the rest is room to rotate in): 15 left
    check(full, prompt=100, max_tokens=140, ttft_ms=5000, slo_class="gold")  # 15 blocks
    with pytest.raises(APIError) as info:
        check(full, prompt=100, max_tokens=141, ttft_ms=5000, slo_class="gold")  # 16
    assert (info.value.status, info.value.reason) == (425, "kv_infeasible")
    no_rotation = Load(**{**vars(full), "is_preempt_by_swap": False})
    with pytest.raises(APIError):  # 70 blocks already past the 40 of the device
        check(no_rotation, prompt=10, max_tokens=5, ttft_ms=5000, slo_class="gold")
    check(full, prompt=100, max_tokens=141, ttft_ms=5000, reject=False)  # best effort: admitted
    # with several classes asking: gold, the most important, may also commit the host
    # tier's rotation room (40 + 90 = 130: it makes room by rotating the others out); silver
    # leaves gold 10% of the 85 blocks (76), bronze leaves gold and silver 20% (68): bronze
    # is refused first, gold last
    gate = admission()
    check(full, prompt=60, max_tokens=37, ttft_ms=5000, slo_class="silver", gate=gate)  # 77
    check(full, prompt=100, max_tokens=860, ttft_ms=5000, slo_class="gold", gate=gate)  # 130
    with pytest.raises(APIError):
        check(full, prompt=100, max_tokens=876, ttft_ms=5000, slo_class="gold", gate=gate)  # 131
    check(full, prompt=60, max_tokens=36, ttft_ms=5000, slo_class="silver", gate=gate)  # 76
    with pytest.raises(APIError):  # gold is asking now
        check(full, prompt=60, max_tokens=37, ttft_ms=5000, slo_class="silver", gate=gate)
    with pytest.raises(APIError):  # 7 blocks: 77, past 85 less gold's and silver's 10% each
        check(full, prompt=60, max_tokens=37, ttft_ms=5000, slo_class="bronze", gate=gate)


def test_a_kv_refusal_logs_what_the_check_counted(caplog):
    """At debug level a KV refusal names its parts: what the decoding requests hold now and
    when done, by class, how many a kept promise frees soon, the queue and the tiers."""
    full = Load(step_time_s=0.05, prefill_s_per_token=0.002, block_size=16, num_device_blocks=40,
                num_free_device_blocks=33, now=0.0, decoding=(
                    Decoding(1.0, 99, 90, 0.0, slo_class="bronze", num_final_tokens=140),
                    Decoding(0.1, 9, 5, 0.0, slo_class="gold", num_final_tokens=40),
                ))  # fmt: skip
    caplog.set_level("DEBUG", logger="superinfer.server.admission")
    with pytest.raises(APIError) as info:  # 12 blocks held when done, 32 more: past 40
        check(full, prompt=100, max_tokens=400, ttft_ms=5000, slo_class="gold")
    assert info.value.reason == "kv_infeasible"
    (line,) = [r.getMessage() for r in caplog.records if "KV check" in r.getMessage()]
    # bronze: 50 tokens now (4 blocks), 140 when done (9); gold: 35 (3), 40 (3); the gold
    # request's promise ends within 5 s (its last token by 0.9 s), bronze's does not
    assert "decoding 2 hold {'bronze': 4, 'gold': 3} now, {'bronze': 9, 'gold': 3} when" in line
    assert "1 freed within 5 s" in line and "device 40 (33 free)" in line
