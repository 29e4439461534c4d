"""The first-token guard: the step that finishes a gold prompt carries only as much of a
bronze prompt as keeps gold's first token within its deadline, a deadline no step can
meet holds nothing back, a more important class is never held back for a less important
one, and every prompt still finishes (KV invariants checked after every step)."""

from __future__ import annotations

import random

from superinfer.core.request import RequestStatus
from superinfer.core.token_guard import GUARD_HEADROOM
from superinfer.slo import SLOTargets
from tests.core.test_step_shaping import BRONZE, CLASSES, GOLD, LinearCost, classed, drive
from tests.factories import make_request, make_scheduler

SILVER = SLOTargets(ttft_ms=1000, tbt_ms=200, slo_class="silver")
MODEL = LinearCost(base_s=0.03, seq_s=0.006, token_s=0.001)  # a 512-token step: 0.55 s


def scheduler(step_model=MODEL, is_guarded: bool = True):
    return make_scheduler("rotasched", num_device_blocks=800, max_num_batched_tokens=512,
                          step_model=step_model, class_order=CLASSES,
                          first_token_guard=is_guarded, tbt_guard=False)  # fmt: skip


def gold_behind_a_bronze_prompt(step_model, gold_arrival_s: float | None = None,
                                is_guarded: bool = True):  # fmt: skip
    """A 1,000-token bronze prompt half prefilled, then a 40-token gold prompt arrives
    (at the end of that step unless `gold_arrival_s` says otherwise); the step after."""
    s = scheduler(step_model, is_guarded)
    bronze = classed(make_request(1000, max_tokens=4, request_id="bronze"), BRONZE)
    s.add_request(bronze)
    now = drive(s, MODEL, 1)  # bronze's first 512 tokens
    arrival = now if gold_arrival_s is None else gold_arrival_s
    gold = classed(make_request(40, max_tokens=4, request_id="gold", arrival_time=arrival), GOLD)
    s.add_request(gold)
    drive(s, MODEL, 1, now=now)  # the step that carries gold's prompt
    return gold, bronze


def test_the_step_with_a_gold_prompt_keeps_its_first_token_in_time():
    gold, bronze = gold_behind_a_bronze_prompt(MODEL)
    ttft = gold.first_token_time - gold.arrival_time
    assert ttft <= GUARD_HEADROOM * GOLD.ttft_s + 1e-9
    # bronze still got what fits: 0.03 + 2 x 0.006 + (40 + n) x 0.001 <= 0.45
    assert bronze.num_computed_tokens == 512 + 368
    # switched off, or without a step-time model: bronze fills the step, gold is late
    for late_gold, full_bronze in (gold_behind_a_bronze_prompt(MODEL, is_guarded=False),
                                   gold_behind_a_bronze_prompt(None)):  # fmt: skip
        assert late_gold.first_token_time - late_gold.arrival_time > GOLD.ttft_s
        assert full_bronze.num_computed_tokens == 512 + 472


class OftenLate(LinearCost):
    """The same machine, whose steps may well run 1.5x their prediction."""

    late_factor = 1.5


def test_a_model_that_runs_late_leaves_more_room():
    gold, bronze = gold_behind_a_bronze_prompt(OftenLate(0.03, 0.006, 0.001))
    ttft = gold.first_token_time - gold.arrival_time
    assert ttft <= GUARD_HEADROOM * GOLD.ttft_s / 1.5 + 1e-9
    assert bronze.num_computed_tokens == 512 + 218  # (0.042 + (40 + n) x 0.001) x 1.5 <= 0.45


def test_a_deadline_only_a_step_without_fillers_meets_gets_that_step():
    # the step of gold's 40 tokens alone takes 0.076 s, and 0.08 s are left: 0.9 x 0.08 is
    # less than that, so the bronze chunk sits this step out and gold's first token is in time
    gold, bronze = gold_behind_a_bronze_prompt(MODEL, gold_arrival_s=0.548 - 0.42)
    assert bronze.num_computed_tokens == 512
    assert gold.first_token_time <= gold.arrival_time + GOLD.ttft_s


def test_a_deadline_no_step_can_meet_holds_nothing_back():
    gold, bronze = gold_behind_a_bronze_prompt(MODEL, gold_arrival_s=-1.0)
    assert gold.first_token_time is not None  # served, late
    assert bronze.num_computed_tokens == 512 + 472  # the budget gold's prompt left


def test_a_more_important_prompt_is_not_held_back_for_a_less_important_one():
    s = scheduler()
    gold = classed(make_request(1000, max_tokens=4, request_id="gold"), GOLD)
    s.add_request(gold)
    now = drive(s, MODEL, 1)
    silver = classed(make_request(40, max_tokens=4, request_id="silver",
                                  arrival_time=now - 0.6), SILVER)  # fmt: skip
    s.add_request(silver)
    drive(s, MODEL, 1, now=now)
    assert gold.num_computed_tokens == 1000  # its whole remaining prompt, uncapped


def golds_among_bronze(s, seed: int, max_tokens: tuple[int, int]) -> list:
    """30 Poisson arrivals at 1/s on scheduler `s`, one in three a 10-60-token gold prompt,
    the rest 200-900-token bronze prompts, each with `max_tokens` drawn from the range;
    every request must finish. Returns the gold requests."""
    rng = random.Random(seed)
    arrivals, now = [], 0.0
    for i in range(30):
        now += rng.expovariate(1.0)
        targets = GOLD if i % 3 == 0 else BRONZE
        num_prompt = rng.randint(10, 60) if targets is GOLD else rng.randint(200, 900)
        request = make_request(num_prompt, max_tokens=rng.randint(*max_tokens),
                               request_id=f"r{i}", arrival_time=now)  # fmt: skip
        arrivals.append((now, classed(request, targets)))
    requests = [r for _, r in arrivals]
    drive(s, MODEL, 10000, arrivals=arrivals)
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in requests)
    return [r for r in requests if r.slo is GOLD]


def late_golds(step_model, seed: int) -> tuple[int, int]:
    """(gold prompts whose first token was late, all gold prompts) over `golds_among_bronze`."""
    golds = golds_among_bronze(scheduler(step_model), seed, (2, 20))
    return sum(r.first_token_time - r.arrival_time > GOLD.ttft_s for r in golds), len(golds)


def test_mixed_arrivals_all_finish_and_fewer_gold_first_tokens_are_late():
    """Gold prompts arriving during a long bronze step wait for it either way; the guard
    only keeps the steps that carry them short."""
    late = [late_golds(MODEL, seed) for seed in range(6)]
    late_unguarded = [late_golds(None, seed) for seed in range(6)]
    assert all(a <= b for (a, _), (b, _) in zip(late, late_unguarded))
    assert sum(a for a, _ in late) < sum(b for b, _ in late_unguarded)
