"""The shared first-token estimate over hand-built loads: prefill-bound, memory-bound,
deadline and class ordered; and the online correction converging on a biased clock."""

from __future__ import annotations

import dataclasses
import random

import pytest

from superinfer.core.policies import MemoryState
from superinfer.core.step_time import BatchShape
from superinfer.slo.estimate import (
    UNKNOWN_MEMORY_WAIT_S,
    Correction,
    Decoding,
    DrainRate,
    EngineLoad,
    Estimator,
    PrefillCost,
    Queued,
    ReleaseRate,
    TokenRate,
    kv_holds,
)
from tests.factories import make_request, make_scheduler

ESTIMATOR = Estimator(("gold", "silver", "bronze"))


def base(**kwargs) -> EngineLoad:
    defaults = {"step_time_s": 0.05, "prefill_s_per_token": 0.001, "num_batched_tokens": 512,
                    "block_size": 16}  # fmt: skip
    return EngineLoad(**{**defaults, **kwargs})


def test_prefill_bound():
    load = base(queued=(Queued(1.0, 400), Queued(2.0, 300)))
    estimate = ESTIMATOR.first_token(load, 100, None, deadline=5.0)
    assert estimate.compute_s == pytest.approx(0.8 + 2 * 0.05)
    assert estimate.memory_s == 0.0


def test_deadline_ordered_queue_counts_only_what_is_due_first():
    load = base(queued=(Queued(1.0, 400), Queued(9.0, 300)), is_queue_by_deadline=True)
    # 500 tokens ahead and its own in one step, which the one due later fills (12 tokens)
    assert ESTIMATOR.first_token(load, 100, None, deadline=5.0).compute_s == pytest.approx(0.562)
    fifo = base(queued=load.queued)  # a FIFO policy serves all of them first
    assert ESTIMATOR.first_token(fifo, 100, None, deadline=5.0).compute_s == pytest.approx(0.9)


def test_class_order_puts_lower_classes_behind():
    queued = (Queued(0.0, 500, "bronze"), Queued(0.0, 200, "gold"))
    load = base(queued=queued)
    gold = ESTIMATOR.first_token(load, 100, "gold", deadline=5.0)
    bronze = ESTIMATOR.first_token(load, 100, "bronze", deadline=5.0)
    assert gold.compute_s == pytest.approx(0.3 + 0.05 + 0.212)  # bronze fills its step
    assert bronze.compute_s == pytest.approx(0.8 + 2 * 0.05)


def test_shaped_steps_stretch_the_prefill_of_classes_below_the_one_decoding():
    # gold decodes and shapes the steps: 64 prompt tokens a step for what is below gold
    load = base(num_shaped_batched_tokens=64, shaping_class="gold")
    bronze = ESTIMATOR.first_token(load, 640, "bronze", 0.0)
    assert bronze.compute_s == pytest.approx(640 * 0.001 + 10 * 0.05)  # 10 steps, not 2
    # gold's own prompt gets its whole prefill when its TTFT is at risk: the full budget
    gold = ESTIMATOR.first_token(load, 640, "gold", 0.0)
    assert gold.compute_s == pytest.approx(640 * 0.001 + 2 * 0.05)
    assert ESTIMATOR.first_token(base(), 640, "bronze", 0.0).compute_s == gold.compute_s


def test_running_prompts_left_to_prefill_are_ahead_of_a_newcomer_of_their_class_or_below():
    # a running gold request has 300 prompt tokens left; a running bronze one 200
    load = base(decoding=(Decoding(0.1, 10, 10, None, 300, "gold"),
                          Decoding(1.0, 10, 10, None, 200, "bronze")))  # fmt: skip
    gold = ESTIMATOR.first_token(load, 100, "gold", deadline=5.0)
    bronze = ESTIMATOR.first_token(load, 100, "bronze", deadline=5.0)
    # bronze's rest is not ahead of gold: it only fills the step gold's prompt ends in
    assert gold.compute_s == pytest.approx(0.4 + 0.05 + 0.112)
    assert bronze.compute_s == pytest.approx(0.6 + 2 * 0.05)


def test_prompts_arriving_behind_fill_the_rest_of_its_last_step():
    # 700 tokens take two 512-token steps; 300 tokens/s arrive while they run
    load = base(prompt_tokens_per_s_by_class={None: 300.0})
    alone = 0.7 + 2 * 0.05
    estimate = ESTIMATOR.first_token(load, 700, None, deadline=5.0)
    assert estimate.compute_s == pytest.approx(alone + 300 * alone * 0.001)
    flood = base(prompt_tokens_per_s_by_class={None: 1e6})  # at most the 324 tokens left
    assert ESTIMATOR.first_token(flood, 700, None, 5.0).compute_s == pytest.approx(
        alone + 324 * 0.001
    )
    # gold's arrivals stretch a silver request instead; they do not fill its step twice
    gold = base(prompt_tokens_per_s_by_class={"gold": 300.0})
    assert ESTIMATOR.first_token(gold, 700, "silver", 5.0).compute_s == pytest.approx(alone)


def test_prompt_work_behind_a_gold_prompt_fills_its_step():
    """A gold prompt goes first, but the step that carries it carries the bronze prompt
    running and the silver one queued behind it too, up to the budget: its first token
    comes when that whole step ends."""
    bronze = Decoding(1.0, 10, 10, None, num_prefill_tokens=900, slo_class="bronze")
    load = base(decoding=(bronze,), queued=(Queued(9.0, 100, "silver"),))
    gold = ESTIMATOR.first_token(load, 100, "gold", 5.0).compute_s
    assert gold == pytest.approx(0.1 + 0.05 + 412 * 0.001)  # 100 + 412 behind: one step
    assert ESTIMATOR.first_token(base(), 100, "gold", 5.0).compute_s == pytest.approx(0.15)


def test_the_first_token_guard_holds_the_work_behind_to_the_deadline():
    """With the scheduler's first-token guard (a ready step-time model), the prompt work
    behind a gold prompt fills its step only up to the deadline's headroom; a deadline no
    step can meet sets no limit, as in the scheduler."""
    bronze = Decoding(1.0, 10, 10, None, num_prefill_tokens=900, slo_class="bronze")
    load = base(decoding=(bronze,), first_token_headroom=0.9)
    alone = 0.1 + 0.05
    guarded = ESTIMATOR.first_token(load, 100, "gold", deadline=0.5).compute_s
    assert guarded == pytest.approx(0.9 * 0.5)  # 300 of the 412 tokens behind fit
    roomy = ESTIMATOR.first_token(load, 100, "gold", deadline=5.0).compute_s
    assert roomy == pytest.approx(alone + 412 * 0.001)  # the whole step fits its deadline
    late = ESTIMATOR.first_token(load, 100, "gold", deadline=0.1).compute_s
    assert late == pytest.approx(alone + 412 * 0.001)
    unguarded = dataclasses.replace(load, first_token_headroom=0.0)
    assert ESTIMATOR.first_token(unguarded, 100, "gold", 0.5).compute_s == pytest.approx(roomy)


def test_a_learned_factor_does_not_push_a_guarded_first_token_past_the_guards_bound():
    """The guard holds the step that produces the token to 0.9 of its deadline: a factor
    learned over every request scales what the guard cannot hold back (the step in flight,
    this prompt), not the fillers it already bounds; without the guard, the whole."""
    bronze = Decoding(1.0, 10, 10, None, num_prefill_tokens=900, slo_class="bronze")
    load = base(decoding=(bronze,), first_token_headroom=0.9, step_left_s=0.1)
    estimate = ESTIMATOR.first_token(load, 100, "gold", deadline=0.5)
    assert estimate.raw_s == pytest.approx(0.45)
    assert estimate.guard_bound_s == pytest.approx(0.45)
    unheld_s = 0.1 + 0.1 + 0.05  # the step in flight, this prompt, its step's decodes
    assert estimate.filler_s == pytest.approx(0.45 - unheld_s)
    assert estimate.expected_s(lambda s: 1.3 * s) == pytest.approx(0.45)  # not 0.585
    assert estimate.expected_s(lambda s: 2.0 * s) == pytest.approx(2.0 * unheld_s)
    unguarded = ESTIMATOR.first_token(dataclasses.replace(load, first_token_headroom=0.0), 100,
                                      "gold", deadline=0.5)  # fmt: skip
    assert unguarded.expected_s(lambda s: 1.3 * s) == pytest.approx(1.3 * unguarded.raw_s)
    # a wait for memory, or higher classes arriving, are not the guard's to bound
    waiting = dataclasses.replace(estimate, memory_s=0.2)
    assert waiting.expected_s(lambda s: 1.3 * s) == pytest.approx(1.3 * waiting.raw_s)


def test_the_rest_of_the_step_in_flight_comes_first():
    alone = ESTIMATOR.first_token(base(), 100, None, 5.0).compute_s
    busy = ESTIMATOR.first_token(base(step_left_s=0.3), 100, None, 5.0).compute_s
    assert busy == pytest.approx(alone + 0.3)


def test_attention_pairs_price_a_long_prompt_above_its_tokens():
    load = base(prefill_s_per_pair=1e-6)
    short = ESTIMATOR.first_token(load, 100, None, deadline=5.0).compute_s
    long = ESTIMATOR.first_token(load, 1000, None, deadline=5.0).compute_s
    assert short == pytest.approx(0.1 + 100 * 101 / 2 * 1e-6 + 0.05)
    assert long == pytest.approx(1.0 + 1000 * 1001 / 2 * 1e-6 + 2 * 0.05)
    assert long - 2 * 0.05 > 10 * (short - 0.05)  # more than ten times the short one's


def test_prefill_cost_learns_per_token_and_per_pair_from_served_steps():
    rng = random.Random(0)
    cost = PrefillCost(prior_s_per_token=0.0005, min_samples=8, min_tokens=32)
    assert (cost.per_token_s, cost.per_pair_s) == (0.0005, 0.0)  # the warm-up's, until steps
    cost.observe(16, 100.0, 1.0)  # too few prompt tokens to say anything: ignored
    for _ in range(7):
        cost.observe(512, 512 * 256.5, 0.9)
    assert cost.per_token_s == 0.0005  # still fewer than min_samples
    for _ in range(200):  # the served machine: 1.2 ms a token, 1 us a pair, +-5% noise
        tokens = rng.randint(32, 512)
        context = rng.choice((0, 0, 256, 512))
        pairs = tokens * (context + (tokens + 1) / 2)
        cost.observe(tokens, pairs, (1.2e-3 * tokens + 1e-6 * pairs) * rng.uniform(0.95, 1.05))
    assert cost.per_token_s == pytest.approx(1.2e-3, rel=0.1)
    assert cost.per_pair_s == pytest.approx(1e-6, rel=0.2)


def test_warm_up_seeds_price_a_long_prompts_pairs_before_and_after_short_served_steps():
    """The first served prefills are short prompts, one shape each: fitted alone they price
    everything per token and underestimate a 1,000-token prompt. The warm-up's seeds (a
    prompt in one step, a long one's second chunk) keep the pairs in the fit."""
    per_token, per_pair = 0.4e-3, 0.4e-6  # the machine
    def seconds(tokens: int, context: int) -> float:
        return per_token * tokens + per_pair * tokens * (context + (tokens + 1) / 2)
    seeds = [(256, 256 * 128.5, seconds(256, 0)), (512, 512 * 768.5, seconds(512, 512))]
    seeded = PrefillCost(prior_s_per_token=seconds(256, 0) / 256, min_samples=8, seeds=seeds)
    unseeded = PrefillCost(prior_s_per_token=seconds(256, 0) / 256, min_samples=8)
    assert seeded.per_token_s == pytest.approx(per_token)
    assert seeded.per_pair_s == pytest.approx(per_pair)
    for cost in (seeded, unseeded):
        for _ in range(12):  # short prompts served
            cost.observe(60, 60 * 30.5, seconds(60, 0))
    long_prompt = seconds(512, 0) + seconds(512, 512)  # 1,024 tokens in two chunks
    def estimate(cost: PrefillCost) -> float:
        return sum(cost.per_token_s * 512 + cost.per_pair_s * pairs
                   for pairs in (512 * 256.5, 512 * 768.5))  # fmt: skip
    assert estimate(seeded) == pytest.approx(long_prompt, rel=0.02)
    assert estimate(unseeded) < 0.8 * long_prompt


def test_a_served_step_counts_its_time_beyond_its_decodes_as_prefill():
    cost = PrefillCost(min_samples=1, min_tokens=1)
    mixed = BatchShape.of_lists([100, 1, 1], [0, 50, 50])  # a prompt beside two decodes
    cost.observe_step(mixed, 0.15, decode_step_s=0.05)
    assert cost.per_token_s * 100 + cost.per_pair_s * 5050 == pytest.approx(0.10)
    alone = PrefillCost(min_samples=1, min_tokens=1)
    alone.observe_step(BatchShape.of_lists([100], [0]), 0.15, decode_step_s=0.05)
    assert alone.per_token_s * 100 + alone.per_pair_s * 5050 == pytest.approx(0.15)


def test_steps_of_one_shape_price_tokens():
    """Every step the same prompt length: tokens and pairs are proportional, the split is
    not identifiable, and the whole cost goes to tokens (not to pairs by a rounding)."""
    for excess_s in (0.0123456789, 0.0234567891, 0.0345678912, 0.0456789123):
        cost = PrefillCost(min_samples=4, min_tokens=1)
        for _ in range(10):
            cost.observe(64, 64 * 65 / 2, excess_s)
        assert cost.per_pair_s == 0.0
        assert cost.per_token_s == pytest.approx(excess_s / 64)


def test_prefill_cost_is_never_negative():
    cost = PrefillCost(min_samples=2, min_tokens=1)
    for tokens in (100, 200, 400):  # time falls with pairs: no non-negative fit but one term
        cost.observe(tokens, tokens * tokens, max(0.0, 0.5 - 1e-6 * tokens * tokens))
    assert cost.per_token_s >= 0.0 and cost.per_pair_s >= 0.0
    cost.observe(100, 0.0, -1.0)  # a step faster than its decodes alone counts as free
    assert cost.per_token_s >= 0.0 and cost.per_pair_s >= 0.0


def test_memory_bound_waits_for_blocks_to_be_released():
    # 10 free blocks; the queue ahead and this one need 7 + 7 blocks of 16 tokens
    load = base(queued=(Queued(0.0, 100),), num_free_device_blocks=10, release_blocks_per_s=8.0)
    estimate = ESTIMATOR.first_token(load, 100, None, deadline=5.0)
    assert estimate.memory_s == pytest.approx(4 / 8.0)
    unknown = base(queued=load.queued, num_free_device_blocks=10)
    assert ESTIMATOR.first_token(unknown, 100, None, 5.0).memory_s == UNKNOWN_MEMORY_WAIT_S


def test_full_seats_make_a_newcomer_wait_for_requests_to_finish_in_class_order():
    """With memory to spare, `max_num_seqs` binds: the running and rotated-out requests of
    its class and above and the queue ahead take the seats first, lower classes' seats are
    taken from them, and more important newcomers take the seats that free up first."""
    seats = {"max_num_seqs": 4, "num_free_device_blocks": 10_000, "finished_per_s": 2.0}
    load = base(running_by_class={"silver": 3, "bronze": 1}, swapped_by_class={"silver": 1},
                queued=(Queued(0.1, 10, "silver"),), **seats)  # fmt: skip
    # silver: 3 running + 1 rotated out + 1 queued ahead + itself = 6 for 4 seats
    assert ESTIMATOR.first_token(load, 10, "silver", deadline=5.0).memory_s == pytest.approx(1.0)
    # gold takes bronze's and silver's seats: nothing to wait for
    assert ESTIMATOR.first_token(load, 10, "gold", deadline=5.0).memory_s == 0.0
    # gold newcomers at 1.5 a second leave silver 0.5 seats a second
    busy = dataclasses.replace(load, requests_per_s_by_class={"gold": 1.5, "bronze": 9.0})
    assert ESTIMATOR.first_token(busy, 10, "silver", deadline=5.0).memory_s == pytest.approx(4.0)
    flooded = dataclasses.replace(load, requests_per_s_by_class={"gold": 2.0})
    assert ESTIMATOR.first_token(flooded, 10, "silver", 5.0).memory_s == UNKNOWN_MEMORY_WAIT_S
    unlimited = dataclasses.replace(load, max_num_seqs=0)  # no engine: not checked
    assert ESTIMATOR.first_token(unlimited, 10, "silver", deadline=5.0).memory_s == 0.0


def test_a_full_host_tier_holds_a_newcomer_back_as_the_policys_guard_does():
    """rotasched admits no brand-new request while its host tier is over 90% used: device
    room does not help until the host tier drains under the guard, and a host tier that
    rotation keeps full (it drains at no rate) holds it back for an unknown, long time."""
    full = {"num_host_blocks": 100, "num_free_host_blocks": 4, "release_blocks_per_s": 50.0,
            "host_drain_blocks_per_s": 3.0}  # fmt: skip
    load = base(host_admission_guard=0.9, **full)  # 96 used, 90 allowed: 6 blocks to free
    assert ESTIMATOR.first_token(load, 100, None, deadline=5.0).memory_s == pytest.approx(2.0)
    steady = base(host_admission_guard=0.9, **{**full, "host_drain_blocks_per_s": 0.0})
    assert ESTIMATOR.first_token(steady, 100, None, 5.0).memory_s == UNKNOWN_MEMORY_WAIT_S
    under = base(host_admission_guard=0.9, **{**full, "num_free_host_blocks": 10})
    assert ESTIMATOR.first_token(under, 100, None, deadline=5.0).memory_s == 0.0
    no_guard = base(**full)  # a policy without one (fcfs, edf, ddps)
    assert ESTIMATOR.first_token(no_guard, 100, None, deadline=5.0).memory_s == 0.0


def test_the_host_guard_does_not_hold_back_a_class_that_displaces_a_running_lower_one():
    """As the scheduler's guard: gold passes it while bronze runs (it makes room by
    displacing bronze), bronze with nothing below it does not."""
    steady = base(host_admission_guard=0.9, num_host_blocks=100, num_free_host_blocks=4,
                  running_blocks_by_class={"bronze": 10}, num_free_device_blocks=500)  # fmt: skip
    assert ESTIMATOR.first_token(steady, 100, "gold", 5.0).memory_s == 0.0
    assert ESTIMATOR.first_token(steady, 100, "bronze", 5.0).memory_s == UNKNOWN_MEMORY_WAIT_S


def test_the_drain_rate_is_how_fast_a_level_falls():
    drain = DrainRate(window_s=10.0)
    assert drain.update(0.0, 90) == 0.0
    assert drain.update(2.0, 80) == pytest.approx(5.0)
    assert drain.update(4.0, 95) == 0.0  # above where the window started: it filled
    assert drain.update(20.0, 60) == pytest.approx((95 - 60) / 16.0)  # the window moved on


def test_room_counts_lower_classes_running_and_rotated_out_requests_ahead():
    common = {"num_free_device_blocks": 2, "num_free_host_blocks": 100,
                  "running_blocks_by_class": {"bronze": 30, "gold": 30}}  # fmt: skip
    load = base(**common)
    assert ESTIMATOR.first_token(load, 100, "gold", 5.0).memory_s == 0.0  # bronze makes room
    assert ESTIMATOR.first_token(load, 100, "bronze", 5.0).memory_s > 0  # gold is not displaced
    no_host = base(**{**common, "num_free_host_blocks": 0, "is_preempt_by_swap": True})
    assert ESTIMATOR.first_token(no_host, 100, "gold", 5.0).memory_s == 0.0  # recomputed
    # rotated-out requests of its class and above come back first; those below do not
    released = {"release_blocks_per_s": 10.0, "num_free_device_blocks": 20}
    alone = ESTIMATOR.first_token(base(**released), 100, "silver", 5.0)
    behind = base(**released, swapped_blocks_by_class={"gold": 30, "silver": 10, "bronze": 99})
    assert alone.memory_s == 0.0
    assert ESTIMATOR.first_token(behind, 100, "silver", 5.0).memory_s == pytest.approx(
        (7 + 40 - 20) / 10.0
    )


def test_correction_converges_to_a_high_quantile_of_a_biased_clock():
    rng = random.Random(0)
    correction = Correction(quantile=0.9, window=400, min_samples=20)
    assert correction.corrected_s("gold", 0.3) == 0.3  # nothing learned yet
    for _ in range(400):  # the engine is 1.4x slower than estimated, with +-10% noise
        estimate = rng.uniform(0.2, 1.0)
        correction.observe("gold", estimate, estimate * 1.4 * rng.uniform(0.9, 1.1))
    assert correction.factor("gold") == pytest.approx(1.4 * 1.08, rel=0.03)
    assert correction.corrected_s("gold", 0.5) == pytest.approx(0.5 * 1.4 * 1.08, rel=0.03)
    # a class without samples of its own borrows the pooled factor until it has them
    assert correction.factor("bronze") == correction.factor("gold")
    for _ in range(20):
        correction.observe("bronze", 1.0, 0.6)
    assert correction.factor("bronze") == pytest.approx(0.6)


def test_tiny_estimates_are_compared_at_the_floor():
    correction = Correction(min_samples=1, floor_s=0.1)
    for _ in range(5):
        correction.observe(None, 0.001, 0.3)  # 1 ms estimated, 300 ms real
    assert correction.factor(None) == pytest.approx(3.0)  # not 300x


def test_first_tokens_within_the_floor_do_not_pull_the_factor_down():
    """A near-idle engine's short prompts (served within the floor) count as met estimates,
    not as 0.4x ones: a long prompt's estimate would turn optimistic."""
    correction = Correction(min_samples=5, floor_s=0.1)
    for _ in range(40):
        correction.observe("gold", 0.03, 0.04)
    assert correction.factor("gold") == 1.0  # its own factor, not 0.4
    for _ in range(10):
        correction.observe("gold", 0.4, 0.44)  # long prompts, 10% slower than estimated
    assert correction.factor("gold") == pytest.approx(1.1)


def test_a_class_borrows_only_from_itself_and_the_classes_above_it():
    """Bronze's first tokens also wait for the chunks held back for gold: gold, short of
    samples of its own, does not borrow bronze's factor; bronze and class-less requests
    borrow from everything above them."""
    correction = Correction(min_samples=5, class_order=("gold", "silver", "bronze"))
    for _ in range(10):
        correction.observe("bronze", 0.5, 1.0)  # held back: 2x its estimate
    for _ in range(3):
        correction.observe("gold", 0.5, 0.5)
    assert correction.learned("gold") is None  # 3 samples of its own, none above it
    assert correction.corrected_s("gold", 0.4) == 0.4
    assert correction.factor("silver") == 1.0  # the 3 gold samples: still too few
    assert correction.factor("bronze") == pytest.approx(2.0)  # its own
    assert correction.factor(None) == pytest.approx(2.0)  # all 13, below every class
    for _ in range(2):
        correction.observe("gold", 0.5, 0.55)
    assert correction.factor("gold") == pytest.approx(1.1)
    assert correction.factor("silver") == pytest.approx(1.1)  # borrowed from gold


def test_higher_classes_arriving_stretch_the_wait_of_lower_ones():
    # gold prompts arrive at 300 tokens/s; at 1 ms a token they take 30% of the engine
    load = base(queued=(Queued(0.0, 400, "bronze"),),
                prompt_tokens_per_s_by_class={"gold": 300.0, "bronze": 900.0})  # fmt: skip
    bronze = ESTIMATOR.first_token(load, 100, "bronze", deadline=5.0)
    assert bronze.stretch == pytest.approx(1 / 0.7)
    # bronze's own 900 tokens/s fill the 12 tokens its one step has left of the budget
    assert bronze.raw_s == pytest.approx((0.5 + 0.05 + 12 * 0.001) / 0.7)
    assert ESTIMATOR.first_token(load, 100, "gold", deadline=5.0).stretch == 1.0  # none above
    flood = base(prompt_tokens_per_s_by_class={"gold": 5000.0})
    assert ESTIMATOR.first_token(flood, 100, "silver", 5.0).stretch == pytest.approx(10.0)


def test_token_rate_counts_the_window_by_class():
    rate = TokenRate(window_s=10.0)
    rate.add(0.0, "gold", 100)
    rate.add(5.0, "gold", 200)
    rate.add(6.0, None, 50)
    assert rate.rates(9.0) == {"gold": 300 / 9.0, None: 50 / 9.0}  # 9 s seen, not 10
    assert rate.rates(12.0) == {"gold": 20.0, None: 5.0}  # the first fell out of the window
    fresh = TokenRate(window_s=20.0)
    fresh.add(100.0, "gold", 100)
    assert fresh.rates(100.5) == {"gold": 20.0}  # at least a quarter of the window: 5 s


def test_release_rate_is_blocks_freed_over_the_window():
    rate = ReleaseRate(window_s=10.0)
    assert rate.update(0.0, 0) == 0.0
    assert rate.update(5.0, 50) == pytest.approx(10.0)
    assert rate.update(20.0, 50) == pytest.approx(0.0)  # nothing freed in the last 15 s


# --- between tokens ---------------------------------------------------------------------------
def decoding(remaining: int, spent_s: float, tbt_s: float = 0.2, gaps: int = 100,
             slo_class: str | None = None, prefill: int = 0) -> Decoding:  # fmt: skip
    """A request `spent_s` into its decode at now = 10 s, `remaining` tokens to go."""
    return Decoding(tbt_s, gaps, remaining, 10.0 - spent_s, prefill, slo_class)


def test_tpot_of_a_new_request_is_a_decode_step_plus_the_prefill_behind_it():
    load = base(decode_step_s=0.06, now=10.0)
    assert ESTIMATOR.tpot(load, 100, 51, None, 5.0).tpot_s == pytest.approx(0.06)
    # 2,000 tokens queued behind it (bronze, later) run in its 50 steps: 2 s over 50 gaps
    behind = base(decode_step_s=0.06, now=10.0, queued=(Queued(9.0, 2000, "bronze"),))
    assert ESTIMATOR.tpot(behind, 100, 51, "gold", 5.0).tpot_s == pytest.approx(0.06 + 0.04)
    # what is ahead of it is prefilled before its first token, not during its decode
    assert ESTIMATOR.tpot(behind, 100, 51, "bronze", 99.0).tpot_s == pytest.approx(0.06)
    # at most one step's budget (512 tokens at 1 ms) in each of its steps
    assert ESTIMATOR.tpot(behind, 100, 3, "gold", 5.0).tpot_s == pytest.approx(0.06 + 0.512)
    # a length unknown (max_tokens 1): a step
    assert ESTIMATOR.tpot(behind, 100, 1, "gold", 5.0).tpot_s == pytest.approx(0.06)


def test_a_prompt_that_would_break_a_running_promise_is_counted():
    # 100 gaps at 200 ms: a 20 s budget; 10 s spent, 50 tokens at 100 ms to go: 5 s of slack
    tight = decoding(remaining=50, spent_s=10.0)
    load = base(decode_step_s=0.1, now=10.0, decoding=(tight,))
    assert ESTIMATOR.tpot(load, 4000, 11, None, 5.0).num_broken == 0  # 4 s of prefill fits
    assert ESTIMATOR.tpot(load, 6000, 11, None, 5.0).num_broken == 1  # 6 s does not
    # what is already pending counts first: 2 s queued leaves room for 3 s more
    queued = base(decode_step_s=0.1, now=10.0, decoding=(tight,), queued=(Queued(0.0, 2000),))
    assert ESTIMATOR.tpot(queued, 4000, 11, None, 5.0).num_broken == 1
    # one step carries at most 512 tokens: 3 steps to go cannot take 6 s of prefill
    short = base(decode_step_s=0.1, now=10.0, decoding=(decoding(3, 18.0),))
    assert ESTIMATOR.tpot(short, 6000, 11, None, 5.0).num_broken == 0
    # a promise already lost (over budget without this prompt) does not refuse others
    lost = base(decode_step_s=0.1, now=10.0, decoding=(decoding(50, 18.0),))
    assert ESTIMATOR.tpot(lost, 6000, 11, None, 5.0).num_broken == 0


def test_lower_classes_decoding_do_not_hold_back_higher_ones():
    bronze = decoding(remaining=50, spent_s=10.0, slo_class="bronze")
    load = base(decode_step_s=0.1, now=10.0, decoding=(bronze,))
    assert ESTIMATOR.tpot(load, 6000, 11, "gold", 5.0).num_broken == 0
    assert ESTIMATOR.tpot(load, 6000, 11, "bronze", 5.0).num_broken == 1
    # with headroom 0.9 the budget is 18 s: 10 + 5 + 4 is over it
    assert ESTIMATOR.tpot(load, 4000, 11, "bronze", 5.0, headroom=0.9).num_broken == 1


def test_a_promise_inside_its_budget_but_past_the_headroom_refuses_any_slowdown():
    # a 20 s budget, 18 s with headroom 0.9; 50 tokens at 100 ms to go
    marginal = base(decode_step_s=0.1, now=10.0, decoding=(decoding(50, 13.5),))  # 18.5 s
    assert ESTIMATOR.tpot(marginal, 10, 11, None, 5.0, headroom=0.9).num_broken == 1
    assert ESTIMATOR.tpot(marginal, 10, 11, None, 5.0, headroom=1.0).num_broken == 0
    # past the whole budget it is lost wherever the newcomer goes: it refuses no one
    lost = base(decode_step_s=0.1, now=10.0, decoding=(decoding(50, 15.5),))  # 20.5 s
    assert ESTIMATOR.tpot(lost, 6000, 11, None, 5.0, headroom=0.9).num_broken == 0


def test_the_prefill_in_a_promise_s_steps_counts_its_attention_pairs():
    """A long prompt's later chunks attend to all of its earlier tokens: the TBT check
    prices those pairs as the first-token estimate does (less a cached prefix's)."""
    tight = decoding(remaining=50, spent_s=10.0)  # 5 s of slack, as above
    load = base(decode_step_s=0.1, now=10.0, decoding=(tight,), prefill_s_per_pair=1e-6)
    # 3,000 tokens: 3 s of tokens and 4.5 s of pairs
    assert ESTIMATOR.tpot(load, 3000, 11, None, 5.0).num_broken == 1
    assert ESTIMATOR.tpot(base(decode_step_s=0.1, now=10.0, decoding=(tight,)), 3000, 11,
                          None, 5.0).num_broken == 0  # fmt: skip
    # the last 500 of them new: 0.5 s of tokens, 1.4 s of their pairs with the prefix
    assert ESTIMATOR.tpot(load, 3000, 11, None, 5.0, num_cached_tokens=2500).num_broken == 0
    # a queued prompt's pairs are in the prefill its decode steps carry
    queued = base(decode_step_s=0.1, now=10.0, prefill_s_per_pair=1e-6,
                  queued=(Queued(9.0, 2000, "bronze"),))  # fmt: skip
    behind = (2.0 + 2000 * 2001 / 2 * 1e-6) / 50  # over its 50 gaps
    assert ESTIMATOR.tpot(queued, 100, 51, "gold", 5.0).tpot_s == pytest.approx(0.1 + behind)


def test_the_room_left_to_promises_counts_every_class_still_on_track():
    # budgets 20 s (gold, 200 ms) and 100 s (bronze, 1 s); 10 s spent, 50 tokens of 100 ms
    gold = decoding(remaining=50, spent_s=10.0, slo_class="gold")
    bronze = decoding(remaining=50, spent_s=10.0, tbt_s=1.0, slo_class="bronze")
    lost = decoding(remaining=50, spent_s=18.0, slo_class="gold")  # over budget already
    load = base(decode_step_s=0.1, now=10.0, decoding=(gold, bronze, lost))
    # 2,000 tokens: 2 s of prefill in their steps; no per-row cost is known (0)
    estimate = ESTIMATOR.tpot(load, 2000, 11, "bronze", 5.0)
    assert estimate.min_promise_slack == pytest.approx((20 - 17) / 20)  # gold's, not lost's
    assert estimate.num_broken == 0
    # a gold newcomer is weighed against the bronze promise too (a router's harm), though
    # only its own class and above can refuse it
    only_bronze = base(decode_step_s=0.1, now=10.0, decoding=(bronze,))
    estimate = ESTIMATOR.tpot(only_bronze, 2000, 11, "gold", 5.0)
    assert estimate.min_promise_slack == pytest.approx((100 - 17) / 100)
    assert ESTIMATOR.tpot(base(), 2000, 11, "gold", 5.0).min_promise_slack == float("inf")


def test_committed_device_memory_weighs_each_request_by_its_tbt_duty():
    # blocks of 16; each request ends with 160 tokens: 10 blocks
    done = 160
    running = Decoding(0.2, 100, 50, 0.0, 0, "gold", num_final_tokens=done)
    loose = Decoding(1.0, 100, 50, 0.0, 0, "bronze", num_final_tokens=done)
    queued = Queued(9.0, 60, "gold", num_final_tokens=done, tbt_s=0.2)
    load = base(decode_step_s=0.1, now=10.0, decoding=(running, loose), queued=(queued,))
    # steps of 100 ms: a 200 ms TBT needs the device half of the time, a 1 s TBT a tenth
    gold = ESTIMATOR.tpot(load, 60, 100, "gold", 5.0, tbt_s=0.2)
    assert gold.num_committed_blocks == pytest.approx(3 * 0.5 * 10)  # bronze not counted
    bronze = ESTIMATOR.tpot(load, 60, 100, "bronze", 5.0, tbt_s=1.0)
    assert bronze.num_committed_blocks == pytest.approx(2 * 0.5 * 10 + 2 * 0.1 * 10)
    # a TBT no step can meet needs the device for every step; a classless request ranks
    # below every class, so all of them count
    assert ESTIMATOR.tpot(load, 60, 100, None, 5.0, tbt_s=0.05).num_committed_blocks == (
        pytest.approx(10 + 5 + 1 + 5)
    )


def test_the_step_is_priced_at_the_batch_the_queued_requests_and_this_one_make():
    # 20 ms a row: two queued requests and this one make the 100 ms step 160 ms
    load = base(decode_step_s=0.1, decode_row_s=0.02, now=10.0,
                queued=(Queued(0.0, 0), Queued(0.0, 0)))  # fmt: skip
    assert ESTIMATOR.tpot(load, 10, 1, None, 5.0).tpot_s == pytest.approx(0.16)
    # a running request with 5 s of slack over 50 steps: 100 ms more per step breaks it
    tight = decoding(remaining=50, spent_s=10.0)
    slow_rows = base(decode_step_s=0.1, decode_row_s=0.1, now=10.0, decoding=(tight,))
    assert ESTIMATOR.tpot(slow_rows, 10, 11, None, 5.0).num_broken == 1
    assert ESTIMATOR.tpot(base(decode_step_s=0.1, now=10.0, decoding=(tight,)), 10, 11, None,
                          5.0).num_broken == 0  # fmt: skip


@pytest.mark.parametrize("policy_name", ["rotasched", "fcfs-recompute", "edf", "ddps"])
def test_the_host_wait_is_expected_exactly_when_the_policy_holds_a_newcomer_back(policy_name):
    """The estimate reads the policy's guard from the snapshot, and applies the same rule."""
    policy = make_scheduler(policy_name).policy
    brand_new = make_request()
    for num_used in range(300, 365):
        load = base(num_host_blocks=364, num_free_host_blocks=364 - num_used,
                    host_admission_guard=policy.host_admission_guard, host_drain_blocks_per_s=1.0)  # fmt: skip
        memory = MemoryState(100, 100, 10, num_used / 364)
        is_held_back = not policy.may_admit(brand_new, memory)
        is_wait = ESTIMATOR.first_token(load, 16, None, deadline=5.0).memory_s > 0
        assert is_wait == is_held_back, num_used


def test_a_token_rate_nobody_reads_keeps_only_its_window():
    """Admission counts every request it sees, binding or not, but reads the rates only for
    binding ones: what it keeps must not grow with a server's lifetime."""
    rate = TokenRate(window_s=10.0)
    for second in range(1000):
        rate.add(float(second), None, 5)
    assert len(rate._admitted) <= 11
    assert rate.rates(999.0) == {None: pytest.approx(5.5)}  # 11 x 5 tokens over 10 s


def test_kv_holds_end_each_request_when_its_kept_promise_does():
    load = base(now=100.0, step_time_s=0.1, prefill_s_per_token=0.001, decoding=(
        # first token 2 s ago, 10 gaps of 0.5 s: done 3 s from now
        Decoding(0.5, 10, 4, 98.0, num_final_tokens=60),
        # past its promise (due 1 s ago): freed no sooner than a step per token left
        Decoding(0.1, 10, 20, 98.0, num_final_tokens=60),
        # still prefilling 300 tokens: its first token in 0.3 s + a step, then 10 gaps
        Decoding(0.2, 10, 11, None, num_prefill_tokens=300, num_final_tokens=400),
        Decoding(0.0, 10, 11, 99.0, num_final_tokens=60),  # no TBT target: no bound
    ))  # fmt: skip
    queued = (Queued(101.0, 50, num_final_tokens=70, tbt_s=0.2),)  # first token by 1 s
    holds = kv_holds(load, queued)
    assert [(h.num_tokens, h.num_final_tokens) for h in holds] == [
        (56, 60), (40, 60), (389, 400), (49, 60), (50, 70)]  # fmt: skip
    finishes = [h.finish_s for h in holds]
    assert finishes[:3] == pytest.approx([3.0, 2.0, 0.4 + 10 * 0.2])
    assert finishes[3] == float("inf")
    assert finishes[4] == pytest.approx(1.0 + 19 * 0.2)


def test_a_steps_time_at_the_learned_costs_inverts_what_it_learned():
    """`step_s` prices a step as `observe_step` took it apart: its decodes' step (none
    without decodes), then its prompt tokens and pairs."""
    cost = PrefillCost(min_samples=1, min_tokens=1)
    mixed = BatchShape.of_lists([100, 1, 1], [0, 50, 50])
    cost.observe_step(mixed, 0.15, decode_step_s=0.05)
    assert cost.step_s(mixed, decode_step_s=0.05) == pytest.approx(0.15)
    prefill_only = BatchShape.of_lists([100], [0])
    assert cost.step_s(prefill_only, decode_step_s=0.05) == pytest.approx(0.10)
    decodes = BatchShape.of_lists([1, 1], [50, 50])
    assert cost.step_s(decodes, decode_step_s=0.05) == 0.05


def test_a_cached_prefix_is_read_not_computed():
    """The prompt's prefix in the prefix cache costs no prefill: its tokens and the pairs
    among them leave the estimate, the pairs of the new tokens with it stay."""
    load = base(prefill_s_per_pair=1e-6)
    full = ESTIMATOR.first_token(load, 400, None, deadline=5.0)
    cached = ESTIMATOR.first_token(load, 400, None, deadline=5.0, num_cached_tokens=320)
    new_pairs = 400 * 401 / 2 - 320 * 321 / 2  # queries 320..399, each over its prefix
    assert cached.compute_s == pytest.approx(0.05 + 80 * 0.001 + new_pairs * 1e-6)
    assert full.compute_s - cached.compute_s == pytest.approx(320 * 0.001 + 320 * 321 / 2 * 1e-6)


def test_a_cached_prefix_pushes_no_decoding_promise_with_its_tokens():
    decoding = (Decoding(tbt_s=0.1, num_gaps=10, num_remaining=5, first_token_time=0.0),)
    load = base(decoding=decoding, now=0.5, decode_step_s=0.05, prefill_s_per_token=0.002)
    full = ESTIMATOR.tpot(load, 400, 20, None, deadline=5.0)
    cached = ESTIMATOR.tpot(load, 400, 20, None, deadline=5.0, num_cached_tokens=384)
    assert full.num_broken == 1 and cached.num_broken == 0
