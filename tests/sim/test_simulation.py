from __future__ import annotations

from dataclasses import replace

import pytest

from superinfer.config import CacheConfig, SchedulerConfig
from superinfer.core.policies import available_policies
from superinfer.sim.config import SimConfig
from superinfer.sim.models import get_model
from superinfer.sim.results import records_of, result_json, summarize
from superinfer.sim.simulation import build_system
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


# --- the engine's own configs, nested (SimConfig.scheduler, SimConfig.cache) -------------------
CLASSES = """classes:
  - {name: gold, ttft_ms: 2000, tbt_ms: 250, reserved_kv_share: 0.4, reserved_token_share: 0.3}
  - {name: bronze, ttft_ms: 8000, tbt_ms: 1000}
"""


def test_flat_options_fill_the_nested_configs_with_the_simulators_defaults():
    config = SimConfig(hardware="gh200-96", model="qwen2.5-32b", policy="ddps", block_size=32)
    assert (config.scheduler.policy, config.cache.block_size) == ("ddps", 32)
    assert (config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens) == (256, 16384)
    assert config.scheduler.max_model_len == get_model("qwen2.5-32b").max_model_len
    assert config.cache.host_kv_gib == 400.0 and config.pipeline is None
    assert SimConfig(**config.to_flat()) == config
    nested = SimConfig(scheduler=SchedulerConfig(max_num_seqs=8), cache=CacheConfig(block_size=4))
    assert nested.scheduler.max_num_seqs == 8 and nested.scheduler.max_model_len == 2048
    with pytest.raises(TypeError, match="max_num_seq"):
        SimConfig(max_num_seq=8)


def test_pool_flags_size_the_pools_with_the_engines_precedence():
    def pools(**options) -> tuple[int, int]:
        system = build_system(SimConfig(hardware="gh200", model="llama-3-8b", **options))
        return system.num_device_blocks, system.num_host_blocks

    block = 2 * 2**20  # llama-3-8b, 16 tokens
    default_device, default_host = pools()
    assert pools(device_kv_gib=1.0) == (512, default_host)
    assert pools(kv_cache_memory_bytes=100 * block, device_kv_gib=1.0)[0] == 100
    assert pools(num_device_blocks=7, kv_cache_memory_bytes=100 * block)[0] == 7
    assert pools(gpu_memory_utilization=0.5)[0] < default_device / 2
    assert pools(num_host_blocks=33, host_kv_gib=1.0) == (default_device, 33)
    assert pools(host_kv_gib=1.0)[1] == 512


def test_every_scheduler_knob_reaches_the_simulated_scheduler():
    run = run_small(small_workload(num_requests=10), policy="ddps", ddps_margin=3.0,
                    ddps_slack_scale=0.25, min_residency_tokens=7, rotation_budget=5,
                    max_num_seqs=6, enable_prefix_caching=False)  # fmt: skip
    scheduler = run.engine.scheduler
    config = scheduler.policy.config
    assert (config.ddps_margin, config.ddps_slack_scale) == (3.0, 0.25)
    assert config.min_residency_tokens == 7
    assert (config.rotation_budget, config.max_num_seqs) == (5, 6)
    assert not scheduler.kv.device.is_caching and config.pipeline is False  # resolved: cpu


def test_class_order_and_reservations_from_the_slo_config_keep_gold_fast_under_a_bronze_flood(
    tmp_path,
):
    path = tmp_path / "classes.yaml"
    path.write_text(CLASSES)
    workload = small_workload(num_requests=60, rate=12.0)
    workload = [replace(r, slo_class="gold" if i % 4 == 0 else "bronze")
                for i, r in enumerate(workload)]  # fmt: skip
    reserved = run_small(workload, slo_config=str(path))
    ordered = run_small(workload, slo_config=str(path), class_reservations={})  # ranks only
    shared = run_small(workload, slo_config=str(path), class_reservations={}, class_order=())
    assert reserved.engine.scheduler.config.class_reservations == {"gold": (0.4, 0.3)}
    assert reserved.engine.scheduler.reservations.is_enabled
    assert {r.slo.slo_class for r in reserved.requests} == {"gold", "bronze"}
    assert reserved.requests[0].slo.ttft_ms == 2000 and reserved.requests[1].slo.tbt_ms == 1000
    with_, without = result_json(reserved)["classes"], result_json(shared)["classes"]
    assert with_["gold"]["num_requests"] == 15 and with_["gold"]["targets"]["ttft_ms"] == 2000
    assert with_["gold"]["p90_ttft_ms"] < without["gold"]["p90_ttft_ms"] / 2
    assert with_["bronze"]["p90_ttft_ms"] > without["bronze"]["p90_ttft_ms"]
    by_rank = result_json(ordered)["classes"]  # class order alone already puts gold first
    assert by_rank["gold"]["p90_ttft_ms"] < without["gold"]["p90_ttft_ms"] / 2
    with pytest.raises(ValueError, match="silver"):
        run_small([replace(workload[0], slo_class="silver")], slo_config=str(path))


def test_a_class_gives_its_requests_the_servers_priority_which_the_priority_policy_serves(
    tmp_path,
):
    path = tmp_path / "classes.yaml"
    path.write_text(CLASSES)
    workload = [replace(r, slo_class="gold" if i % 4 == 0 else "bronze")
                for i, r in enumerate(small_workload(num_requests=60, rate=12.0))]  # fmt: skip
    flat = {"slo_config": str(path), "class_reservations": {}, "class_order": ()}  # no ranks
    priority = run_small(workload, policy="priority", **flat)
    fcfs = run_small(workload, policy="fcfs-recompute", **flat)
    assert {r.slo.slo_class: r.priority for r in priority.requests} == {"gold": 0, "bronze": 1}
    by_priority, by_arrival = result_json(priority)["classes"], result_json(fcfs)["classes"]
    assert by_priority["gold"]["p90_ttft_ms"] < by_arrival["gold"]["p90_ttft_ms"]
