"""The TBT guard (`--tbt-guard`): a decoding gold request's mean gap stays within its TBT
target while a bronze prompt prefills beside it, a long planned output lets bronze fill
the steps, a less important decode holds back no more important prompt, and every
request finishes (KV invariants checked after every step)."""

from __future__ import annotations

from superinfer.core.request import RequestStatus
from tests.core.test_first_token_guard import MODEL, SILVER, golds_among_bronze
from tests.core.test_step_shaping import BRONZE, CLASSES, GOLD, classed, drive
from tests.factories import make_request, make_scheduler


def scheduler(is_tbt_guarded: bool = True, step_model=MODEL):
    return make_scheduler("rotasched", num_device_blocks=800, max_num_batched_tokens=512,
                          step_model=step_model, class_order=CLASSES,
                          tbt_guard=is_tbt_guarded)  # fmt: skip


def mean_gap_s(request) -> float:
    times = request.output_token_times
    return (times[-1] - times[0]) / (len(times) - 1)


def gold_decoding_beside_a_bronze_prompt(is_tbt_guarded: bool = True, step_model=MODEL,
                                         num_gold_tokens: int = 8):  # fmt: skip
    """A 40-token gold request with a short output; a 1,000-token bronze prompt arrives
    just after gold's first token. Runs until both finish."""
    s = scheduler(is_tbt_guarded, step_model)
    gold = classed(make_request(40, max_tokens=num_gold_tokens, request_id="gold"), GOLD)
    s.add_request(gold)
    now = drive(s, MODEL, 1)  # gold's prefill and first token
    bronze = classed(make_request(1000, max_tokens=4, request_id="bronze",
                                  arrival_time=now), BRONZE)  # fmt: skip
    s.add_request(bronze)
    drive(s, MODEL, 500, now=now)
    assert gold.status is RequestStatus.FINISHED_LENGTH
    assert bronze.status is RequestStatus.FINISHED_LENGTH
    return gold, bronze


def test_a_short_gold_output_keeps_its_mean_gap_beside_a_long_prompt():
    gold, _ = gold_decoding_beside_a_bronze_prompt()
    assert mean_gap_s(gold) <= GOLD.tbt_s
    # switched off, or without a step-time model: bronze's 512-token chunks (0.55 s a step)
    # come between gold's tokens and its mean gap is over the target
    for unguarded in (gold_decoding_beside_a_bronze_prompt(False)[0],
                      gold_decoding_beside_a_bronze_prompt(True, None)[0]):  # fmt: skip
        assert mean_gap_s(unguarded) > GOLD.tbt_s


def test_a_less_important_decode_does_not_hold_back_a_more_important_prompt():
    s = scheduler()
    silver = classed(make_request(40, max_tokens=8, request_id="silver"), SILVER)
    s.add_request(silver)
    now = drive(s, MODEL, 1)
    gold = classed(make_request(1000, max_tokens=4, request_id="gold", arrival_time=now), GOLD)
    s.add_request(gold)
    drive(s, MODEL, 1, now=now)
    assert gold.num_computed_tokens == 511  # the budget silver's decode left, uncapped


def test_a_less_important_prompt_finishing_its_prefill_is_held_back_too():
    """A silver prompt whose whole remainder fits the step sets its own first-token limit,
    but a gold decode's next token outranks it: its last chunk waits for gold's slack."""
    s = scheduler()
    gold = classed(make_request(40, max_tokens=4, request_id="gold"), GOLD)
    s.add_request(gold)
    now = drive(s, MODEL, 1)
    silver = classed(make_request(400, max_tokens=4, request_id="silver", arrival_time=now),
                     SILVER)  # fmt: skip
    s.add_request(silver)
    now = drive(s, MODEL, 1, now=now)
    assert 0 < silver.num_computed_tokens < 400
    drive(s, MODEL, 100, now=now)
    assert mean_gap_s(gold) <= GOLD.tbt_s
    assert silver.status is RequestStatus.FINISHED_LENGTH


def test_a_long_planned_output_sets_no_limit_early():
    """Gold's first gaps may stretch when its planned length leaves room to make them up."""
    gold, _ = gold_decoding_beside_a_bronze_prompt(num_gold_tokens=200)
    assert mean_gap_s(gold) <= GOLD.tbt_s
    first_gaps = [b - a for a, b in zip(gold.output_token_times, gold.output_token_times[1:3])]
    assert max(first_gaps) > 0.5  # bronze's full 512-token chunks, 0.55 s a step


def mean_gaps_over(step_model, seed: int) -> list[float]:
    """Gold requests' mean gaps over `golds_among_bronze` with 3-12 output tokens each."""
    s = scheduler(step_model is not None, step_model or MODEL)
    return [mean_gap_s(r) for r in golds_among_bronze(s, seed, (3, 12))]


def test_mixed_arrivals_all_finish_and_fewer_gold_requests_miss_their_tpot():
    misses = [sum(g > GOLD.tbt_s for g in mean_gaps_over(MODEL, seed)) for seed in range(6)]
    unguarded = [sum(g > GOLD.tbt_s for g in mean_gaps_over(None, seed)) for seed in range(6)]
    assert all(a <= b for a, b in zip(misses, unguarded))
    assert sum(misses) < sum(unguarded)
