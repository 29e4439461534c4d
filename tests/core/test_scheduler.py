"""The token-budget scheduler with fcfs-recompute and fcfs-swap, driven by a fake model."""

from __future__ import annotations

import pytest

from superinfer.core.policies import available_policies, create_policy
from superinfer.core.request import RequestStatus
from tests.factories import (
    EOS,
    fake_model_output,
    make_request,
    make_scheduler,
    run_roomy_and_tight,
    run_to_completion,
)


def outputs_of(requests):
    return {r.request_id: r.output_token_ids for r in requests}


def workload(n=8):
    return [
        make_request(num_prompt_tokens=5 + 3 * i, max_tokens=6 + 2 * i, arrival_time=i * 1e-3,
                     request_id=f"q{i}")
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("policy", ["fcfs-recompute", "fcfs-swap"])
def test_memory_pressure_gives_the_same_outputs(policy):
    roomy, tight, reference, pressured = run_roomy_and_tight(policy, workload)
    assert outputs_of(pressured) == outputs_of(reference)
    assert roomy.stats.num_preemptions == roomy.stats.num_swap_outs == 0
    if policy == "fcfs-recompute":
        assert tight.stats.num_preemptions > 0 and tight.stats.num_swap_outs == 0
    else:
        assert tight.stats.num_swap_outs > 0 and tight.stats.num_swap_ins == tight.stats.num_swap_outs
        assert tight.kv.stats.num_swap_out_blocks > 0


def test_fcfs_recompute_preempts_the_most_recently_admitted():
    s = make_scheduler("fcfs-recompute", num_device_blocks=6, block_size=4)
    a, b = make_request(8, max_tokens=20, request_id="a"), make_request(8, max_tokens=20, request_id="b")
    s.add_request(a)
    s.add_request(b)
    out = s.schedule(0.0)
    assert [q.request_id for q in out.sequences] == ["a", "b"]
    s.update_from_output(out, fake_model_output(out), 0.0)
    for step in range(1, 20):  # both grow until the 6 blocks run out
        out = s.schedule(step)
        s.update_from_output(out, fake_model_output(out), step)
        s.check_invariants()
        if out.preempted_request_ids:
            break
    assert out.preempted_request_ids == ["b"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert a.status is RequestStatus.RUNNING


def test_fcfs_swap_resumes_swapped_before_new_requests():
    s = make_scheduler("fcfs-swap", num_device_blocks=6, block_size=4)
    a = make_request(8, max_tokens=12, request_id="a", arrival_time=0.0)
    b = make_request(8, max_tokens=12, request_id="b", arrival_time=0.1)
    s.add_request(a)
    s.add_request(b)
    swapped_at = None
    for step in range(40):
        out = s.schedule(step)
        s.complete_transfers([t.transfer_id for t in out.transfers])
        s.update_from_output(out, fake_model_output(out), step)
        s.check_invariants()
        if out.swapped_out_request_ids and swapped_at is None:
            swapped_at = step
            assert out.swapped_out_request_ids == ["b"]
            s.add_request(make_request(4, max_tokens=2, request_id="late", arrival_time=1.0))
        if swapped_at is not None and b.status is RequestStatus.RUNNING:
            late = s.requests["late"]
            assert late.status is RequestStatus.WAITING or late.admission_seq > b.admission_seq
            break
    assert swapped_at is not None and b.num_swap_outs == 1


def test_swap_falls_back_to_recompute_when_the_host_tier_is_full():
    s = make_scheduler("fcfs-swap", num_device_blocks=14, num_host_blocks=0)
    requests = workload()
    for r in requests:
        s.add_request(r)
    run_to_completion(s)
    assert s.stats.num_swap_outs == 0 and s.stats.num_preemptions > 0


def test_chunked_prefill_respects_the_token_budget():
    s = make_scheduler(max_num_batched_tokens=16, num_device_blocks=64)
    long = make_request(40, max_tokens=3, request_id="long")
    s.add_request(long)
    budgets = []
    for step in range(3):
        out = s.schedule(step)
        budgets.append(out.num_batched_tokens)
        assert out.sequences[0].is_sampling == (step == 2)  # only the last chunk samples
        s.update_from_output(out, fake_model_output(out), step)
    assert budgets == [16, 16, 8]
    assert long.num_output_tokens == 1  # the last chunk sampled the first token


def test_decode_and_prefill_share_one_step():
    s = make_scheduler(max_num_batched_tokens=20)
    a = make_request(6, max_tokens=10, request_id="a")
    s.add_request(a)
    out = s.schedule(0)
    s.update_from_output(out, fake_model_output(out), 0)
    s.add_request(make_request(30, max_tokens=3, request_id="b"))
    out = s.schedule(1)
    counts = {q.request_id: q.num_query_tokens for q in out.sequences}
    assert counts == {"a": 1, "b": 19}


def test_max_num_seqs_caps_the_running_batch():
    s = make_scheduler(max_num_seqs=3)
    for r in workload(6):
        s.add_request(r)
    out = s.schedule(0)
    assert len(out.sequences) == 3 and len(s.running) == 3


def test_abort_frees_blocks_in_both_tiers():
    s = make_scheduler("fcfs-swap", num_device_blocks=10)
    requests = workload(5)
    for r in requests:
        s.add_request(r)
    for step in range(6):
        out = s.schedule(step)
        s.update_from_output(out, fake_model_output(out), step)
    for r in list(s.requests.values()):
        s.abort_request(r.request_id, 10.0)
    out = s.schedule(11)  # finished ids are reported to the runner
    s.complete_transfers([t.transfer_id for t in out.transfers])
    s.kv.complete_transfers(list(s.kv._inflight))
    s.check_invariants()
    assert s.kv.device.num_free_blocks == s.kv.device.num_blocks
    assert s.kv.host.num_free_blocks == s.kv.host.num_blocks
    assert all(r.is_finished for r in requests)


def test_stop_conditions():
    s = make_scheduler()
    eos = make_request(4, max_tokens=50, request_id="eos")
    ignore = make_request(4, max_tokens=5, request_id="ignore", ignore_eos=True)
    for r in (eos, ignore):
        s.add_request(r)
    out = s.schedule(0)
    model_output = fake_model_output(out)
    model_output.sampled_token_ids["eos"] = EOS
    model_output.sampled_token_ids["ignore"] = EOS
    s.update_from_output(out, model_output, 0)
    assert eos.status is RequestStatus.FINISHED_STOPPED
    assert ignore.status is RequestStatus.RUNNING
    run_to_completion(s)
    assert ignore.status is RequestStatus.FINISHED_LENGTH and ignore.num_output_tokens == 5


def test_prompt_longer_than_the_model_allows_is_refused():
    s = make_scheduler(max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(make_request(16))


def test_unknown_policy_names_the_choices():
    assert {"fcfs-recompute", "fcfs-swap"} <= set(available_policies())
    with pytest.raises(ValueError, match="fcfs-swap"):
        create_policy("nope")


@pytest.mark.parametrize("policy", sorted(available_policies()))
def test_pipelined_steps_give_the_same_outputs(policy):
    from tests.factories import run_pipelined

    reference, pipelined = workload(10), workload(10)
    plain = make_scheduler(policy, num_device_blocks=256)
    ahead = make_scheduler(policy, num_device_blocks=14)
    for r in reference:
        plain.add_request(r)
    for r in pipelined:
        ahead.add_request(r)
    run_to_completion(plain)
    run_pipelined(ahead)
    assert outputs_of(pipelined) == outputs_of(reference)
    assert ahead.kv.device.num_free_blocks == ahead.kv.device.num_blocks


def test_pipelined_abort_mid_flight_quarantines_its_blocks():
    from tests.factories import run_pipelined

    s = make_scheduler("rotasched", num_device_blocks=20)
    requests = workload(6)
    for r in requests:
        s.add_request(r)
    run_pipelined(s, abort_at={3: ["q0", "q1"], 5: ["q4"]})
    assert requests[0].status is RequestStatus.FINISHED_ABORTED
    assert s.kv.device.num_free_blocks == s.kv.device.num_blocks
