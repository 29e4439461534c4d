"""The snapshot's picture of decoding requests, which admission's TBT check reads."""

from __future__ import annotations

from superinfer.engine.snapshot import decoding_requests
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
