"""Blocks out of a sliding window (every layer windowed, Mistral) are freed as decoding
proceeds: a long decode holds about window / block_size + 1 device blocks, rotation moves
only the live blocks, prefix caching and the invariants hold."""

from __future__ import annotations

import pytest

from superinfer.config import CacheConfig, SchedulerConfig
from superinfer.core.factory import build_scheduler
from superinfer.core.kv import FREED_BLOCK, TwoTierKVManager
from superinfer.core.kv.transfer import Direction
from superinfer.core.request import RequestStatus
from superinfer.core.scheduler import Scheduler
from tests.factories import fake_model_output, make_request, run_pipelined, run_to_completion

BS, WINDOW = 4, 16
BOUND = -(-WINDOW // BS) + 1  # blocks a decoding request holds at most


def scheduler(window: int | None = WINDOW, policy: str = "fcfs-recompute",
              num_device_blocks: int = 128, num_host_blocks: int = 256,
              caching: bool = True) -> Scheduler:  # fmt: skip
    config = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=1024,
                             policy=policy)  # fmt: skip
    cache = CacheConfig(block_size=BS, enable_prefix_caching=caching)
    return build_scheduler(config, cache, num_device_blocks, num_host_blocks,
                           sliding_window=window)  # fmt: skip


def decode_peaks(s: Scheduler, requests, max_steps: int = 10_000) -> dict[str, int]:
    """Run to completion checking invariants every step; the most device blocks each
    request held once its prompt was computed."""
    peaks = {r.request_id: 0 for r in requests}
    pending: list[int] = []
    for _ in range(max_steps):
        if not s.has_unfinished_requests:
            break
        s.complete_transfers(pending)
        out = s.schedule(0.0)
        pending = [spec.transfer_id for spec in out.transfers]
        s.update_from_output(out, fake_model_output(out), 0.0)
        s.check_invariants()
        for r in requests:
            if not r.status.is_finished and r.is_prefill_done:
                peaks[r.request_id] = max(peaks[r.request_id], s.kv.num_device_blocks_of(r))
    s.complete_transfers(pending)
    s.check_invariants()
    assert not s.has_unfinished_requests
    return peaks


@pytest.mark.parametrize("window", [WINDOW, None])
def test_long_decode_holds_a_window_of_blocks(window):
    s = scheduler(window)
    request = make_request(num_prompt_tokens=10, max_tokens=120, request_id="long")
    s.add_request(request)
    peaks = decode_peaks(s, [request])
    if window is None:  # without freeing the table grows with the generation
        assert peaks["long"] >= 120 // BS
        assert s.kv.stats.num_window_freed_blocks == 0
    else:
        assert peaks["long"] <= BOUND
        assert s.kv.stats.num_window_freed_blocks >= -(-130 // BS) - BOUND
    assert s.kv.device.num_free_blocks == s.kv.device.num_blocks


def test_freed_entries_keep_their_positions():
    s = scheduler()
    request = make_request(num_prompt_tokens=10, max_tokens=60, request_id="a")
    s.add_request(request)
    for _ in range(40):
        out = s.schedule(0.0)
        s.update_from_output(out, fake_model_output(out), 0.0)
        s.check_invariants()
    table = s.kv.block_table(request)
    computed = request.num_computed_tokens
    num_dead = (computed - WINDOW + 1) // BS  # all of block i before the first visible key
    assert table[:num_dead] == [FREED_BLOCK] * num_dead
    assert FREED_BLOCK not in table[num_dead:]
    # every key the next query (at `computed`) sees is in a live block
    assert all(table[p // BS] != FREED_BLOCK for p in range(computed - WINDOW + 1, computed + 1))
    assert len(table) * BS >= computed


def test_many_requests_under_pressure_need_less_memory_with_freeing():
    def workload():
        return [make_request(num_prompt_tokens=6 + i, max_tokens=80, request_id=f"w{i}")
                for i in range(6)]  # fmt: skip

    bounded, unbounded = scheduler(num_device_blocks=40), scheduler(None, num_device_blocks=40)
    for s in (bounded, unbounded):
        requests = workload()
        for r in requests:
            s.add_request(r)
        run_to_completion(s)
    assert bounded.stats.num_preemptions == 0  # 6 * BOUND blocks fit in 40
    assert unbounded.stats.num_preemptions > 0


@pytest.mark.parametrize("policy", ["rotasched", "fcfs-swap"])
def test_rotation_under_pressure_moves_only_live_blocks(policy):
    s = scheduler(policy=policy, num_device_blocks=14)
    requests = [make_request(num_prompt_tokens=8 + 3 * i, max_tokens=40 + 5 * i,
                             request_id=f"s{i}") for i in range(5)]  # fmt: skip
    for r in requests:
        s.add_request(r)
    moved = []
    pending: list[int] = []
    while s.has_unfinished_requests:
        s.complete_transfers(pending)
        out = s.schedule(0.0)
        pending = [spec.transfer_id for spec in out.transfers]
        moved += [spec for spec in out.transfers if spec.direction is Direction.H2D]
        s.update_from_output(out, fake_model_output(out), 0.0)
        s.check_invariants()
        for r in s.swapped:
            host = s.kv.tables[r.request_id].host
            assert len(host) == s.kv.num_blocks_for(r.num_computed_tokens)
    s.complete_transfers(pending)
    s.check_invariants()
    assert s.stats.num_swap_outs > 0 and s.stats.num_swap_ins == s.stats.num_swap_outs
    assert moved and all(spec.num_blocks <= BOUND for spec in moved)
    assert s.kv.stats.num_window_freed_blocks > 0
    assert s.kv.device.num_free_blocks == s.kv.device.num_blocks
    assert s.kv.host.num_free_blocks == s.kv.host.num_blocks


def test_pipelined_steps_fence_the_freed_blocks():
    s = scheduler()
    for i in range(3):
        s.add_request(make_request(num_prompt_tokens=7 + i, max_tokens=50, request_id=f"p{i}"))
    run_pipelined(s)  # checks invariants between launch and fill, where frees are fenced
    assert s.kv.stats.num_window_freed_blocks > 0


def test_prefix_cache_hits_survive_freeing():
    s = scheduler()
    prompt = [100 + i for i in range(30)]  # 7 full blocks of 4, more than the window
    a = make_request(prompt_token_ids=prompt, max_tokens=30, request_id="a")
    s.add_request(a)
    out = s.schedule(0.0)
    s.update_from_output(out, fake_model_output(out), 0.0)
    shared = [b for b in s.kv.block_table(a) if b != FREED_BLOCK]
    # b arrives while a holds its blocks: it shares the ones still live
    b = make_request(prompt_token_ids=prompt, max_tokens=30, request_id="b")
    s.add_request(b)
    out = s.schedule(0.0)
    assert b.num_computed_tokens == 28  # every full block of the prompt: hits revive freed ones
    assert set(shared[:3]) <= set(s.kv.block_table(b))
    s.update_from_output(out, fake_model_output(out), 0.0)
    s.check_invariants()
    for block in s.kv.block_table(b):
        if block != FREED_BLOCK:  # b's reference keeps its blocks alive whatever a freed
            assert s.kv.device.ref_counts[block] >= 1
    run_to_completion(s)
    assert a.output_token_ids and b.output_token_ids
    assert s.kv.stats.num_prefix_hit_tokens == 28


def test_swap_out_and_in_of_a_request_with_freed_blocks():
    kv = TwoTierKVManager(16, 32, BS, sliding_window=8)
    kv.is_eager_writeback = False
    request = make_request(num_prompt_tokens=30)  # blocks 0..7
    kv.allocate_slots(request, 30)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = 30
    kv.on_tokens_computed(request)  # keys 23.. stay visible: blocks 0..4 freed
    assert kv.block_table(request)[:5] == [FREED_BLOCK] * 5
    assert kv.num_device_blocks_of(request) == 3 and kv.device.num_used_blocks == 3
    assert kv.num_swap_out_copies(request) == 3
    assert kv.num_blocks_freed_by_swap_out(request) == 3
    kv.swap_out(request)
    request.status = RequestStatus.SWAPPED
    (d2h,) = kv.take_planned_transfers()
    assert d2h.num_blocks == 3
    host = kv.tables[request.request_id].host
    assert host[:5] == [FREED_BLOCK] * 5 and FREED_BLOCK not in host[5:]
    kv.check_invariants([request])
    kv.complete_transfers([d2h.transfer_id])
    assert kv.can_swap_in(request, 1)
    spec = kv.swap_in(request)
    request.status = RequestStatus.RUNNING
    assert spec.num_blocks == 3 and kv.device.num_used_blocks == 3
    assert kv.block_table(request)[:5] == [FREED_BLOCK] * 5
    kv.complete_transfers([spec.transfer_id])
    kv.check_invariants([request])
    kv.free(request)
    request.status = RequestStatus.FINISHED_ABORTED
    kv.check_invariants([request])
    assert kv.device.num_free_blocks == 16 and kv.host.num_free_blocks == 32


def test_no_window_frees_nothing():
    s = scheduler(None)
    request = make_request(num_prompt_tokens=10, max_tokens=60)
    s.add_request(request)
    run_to_completion(s)
    assert s.kv.stats.num_window_freed_blocks == 0


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        TwoTierKVManager(4, 4, BS, sliding_window=0)
