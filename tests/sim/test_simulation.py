from __future__ import annotations

import pytest

from superinfer.core.policies import available_policies
from superinfer.sim.results import records_of, result_json, summarize
from superinfer.sim.workload import SimRequest, synthetic_workload
from superinfer.slo.metrics import ABORTED, FINISHED, REJECTED
from tests.sim.helpers import run_small, small_workload


def outcomes(run) -> dict[str, int]:
    counts = {FINISHED: 0, ABORTED: 0, REJECTED: 0}
    for record in records_of(run):
        counts[record.outcome] += 1
    return counts


def fingerprint(run) -> list[tuple]:
    return [(r.request_id, r.outcome, tuple(r.token_times), r.num_rotations, r.num_preemptions)
            for r in records_of(run)]  # fmt: skip


@pytest.mark.parametrize("pipeline", [True, False])
def test_same_inputs_give_identical_runs(pipeline):
    first, second = run_small(pipeline=pipeline), run_small(pipeline=pipeline)
    assert fingerprint(first) == fingerprint(second)
    assert first.loop.num_events == second.loop.num_events


def test_another_seed_gives_another_run():
    assert fingerprint(run_small(small_workload(seed=1))) != fingerprint(run_small())


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("policy", available_policies())
def test_every_request_finishes_and_invariants_hold(policy, pipeline):
    # check_invariants_every=1: the scheduler's and KV manager's checks after every step
    workload = small_workload(num_requests=30, rate=10.0)
    run = run_small(workload, policy=policy, pipeline=pipeline)
    assert outcomes(run) == {FINISHED: 30, ABORTED: 0, REJECTED: 0}
    for request, spec in zip(run.requests, workload):
        assert len(request.output_token_times) == spec.num_output_tokens
        assert request.arrival_time <= request.output_token_times[0]
        assert request.output_token_times == sorted(request.output_token_times)
    kv = run.engine.scheduler.kv
    assert kv.device.num_free_blocks == kv.device.num_blocks
    assert kv.host.num_free_blocks == kv.host.num_blocks
    assert run.engine.transfer.num_pending == 0


def test_memory_pressure_makes_policies_differ():
    workload = synthetic_workload(40.0, 40, (16, 160), (64, 128), seed=0)
    swap = run_small(workload, policy="rotasched").engine.scheduler.stats
    recompute = run_small(workload, policy="fcfs-recompute").engine.scheduler.stats
    assert swap.num_swap_outs > swap.num_preemptions
    assert recompute.num_preemptions > 0 and recompute.num_swap_outs == 0


def test_naive_copies_make_rotation_slower():
    duplex = run_small(policy="rotasched", link_gbps=0.5)
    naive = run_small(policy="rotasched", link_gbps=0.5, transfer_mode="naive")
    d, n = duplex.engine.transfer.stats, naive.engine.transfer.stats
    assert n.d2h.num_copy_calls > 10 * d.d2h.num_copy_calls
    assert n.d2h.seconds > d.d2h.seconds


def test_prompts_that_cannot_run_are_rejected_not_lost():
    workload = [
        SimRequest(0.0, 40, 8),
        SimRequest(0.1, 600, 8),  # >= max_model_len 512
        SimRequest(0.2, 40, 8),
    ]
    run = run_small(workload)
    assert outcomes(run) == {FINISHED: 2, ABORTED: 0, REJECTED: 1}
    summary = summarize(records_of(run))
    assert summary["num_requests"] == 2  # a prompt the model cannot take is the client's error


def test_requests_still_running_at_the_drain_timeout_are_aborted():
    workload = small_workload(num_requests=30, rate=30.0)
    run = run_small(workload, drain_timeout_s=0.5)
    counts = outcomes(run)
    assert counts[ABORTED] > 0 and counts[FINISHED] + counts[ABORTED] == 30
    summary = summarize(records_of(run))
    assert summary["ttft_attainment"] <= counts[FINISHED] / 30
    run.engine.scheduler.check_invariants()


def test_result_json_has_the_scripted_fields():
    run = run_small(timeline_interval_s=0.5)
    result = result_json(run, {"dataset": "synthetic"})
    for name in ("ttft_attainment", "tpot_attainment", "goodput", "output_throughput",
                 "num_requests", "targets", "records", "p50_ttft_ms", "p90_ttft_ms",
                 "mean_tpot_ms", "num_swap_outs", "kv_gb_d2h", "timeline"):  # fmt: skip
        assert name in result, name
    assert result["targets"] == {"ttft_ms": 2000.0, "tbt_ms": 250.0, "max_latency_ms": None}
    assert len(result["records"]) == 40 and "token_times" not in result["records"][0]
    assert 0 <= result["ttft_attainment"] <= 1
