"""The snapshot's picture of decoding requests, which admission's TBT check reads."""

from __future__ import annotations

from superinfer.engine.snapshot import decoding_requests, prompt_tokens_by_class
from superinfer.slo import SLOTargets
from tests.factories import fake_model_output, make_request, make_scheduler


def test_running_requests_carry_their_tpot_budget_and_progress():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    short = make_request(num_prompt_tokens=8, max_tokens=5)
    long = make_request(num_prompt_tokens=40, max_tokens=9)
    long.slo = SLOTargets(tbt_ms=100.0, slo_class="gold")
    for request in (short, long):
        scheduler.add_request(request)
    for now in (1.0, 2.0):
        output = scheduler.schedule(now)
        scheduler.update_from_output(output, fake_model_output(output), now)
        scheduler.check_invariants()
    by_budget = {d.num_gaps: d for d in decoding_requests(scheduler)}
    first, second = by_budget[4], by_budget[8]
    assert (first.tbt_s, first.slo_class, first.num_prefill_tokens) == (0.2, None, 0)
    assert first.first_token_time == 1.0 and first.num_remaining == 5 - short.num_output_tokens
    # the long prompt is still prefilling in 16-token steps: no first token yet
    assert (second.tbt_s, second.slo_class, second.first_token_time) == (0.1, "gold", None)
    assert second.num_prefill_tokens == 40 - long.num_computed_tokens > 0
    assert second.num_remaining == 9
    assert (first.num_final_tokens, second.num_final_tokens) == (8 + 5, 40 + 9)


def test_a_length_the_client_did_not_bound_is_expected_to_end_soon():
    scheduler = make_scheduler(max_model_len=64)
    unbounded = make_request(num_prompt_tokens=8, max_tokens=64 - 8)  # the server's default
    scheduler.add_request(unbounded)
    output = scheduler.schedule(1.0)
    scheduler.update_from_output(output, fake_model_output(output), 1.0)
    (decoding,) = decoding_requests(scheduler)
    assert decoding.num_final_tokens == 8 + unbounded.num_output_tokens + 1


def test_a_scheduled_steps_prompt_tokens_by_class_leave_out_decodes():
    """What the step in flight computes of the prompts a snapshot built before it still
    counts as to prefill (admission must not count it twice)."""
    scheduler = make_scheduler(max_num_batched_tokens=32)
    decoding = make_request(num_prompt_tokens=8, max_tokens=5)
    gold = make_request(num_prompt_tokens=40, max_tokens=5)
    gold.slo = SLOTargets(tbt_ms=100.0, slo_class="gold")
    scheduler.add_request(decoding)
    output = scheduler.schedule(1.0)
    scheduler.update_from_output(output, fake_model_output(output), 1.0)
    scheduler.add_request(gold)
    output = scheduler.schedule(2.0)  # the decode, and 31 of gold's 40 prompt tokens
    assert prompt_tokens_by_class(scheduler, output) == {"gold": 31}
    scheduler.update_from_output(output, fake_model_output(output), 2.0)
    scheduler.check_invariants()
    output = scheduler.schedule(3.0)  # gold's last 9
    assert prompt_tokens_by_class(scheduler, output) == {"gold": 9}
