from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superinfer.core.kv.transfer import Direction, TransferSpec, merge_into_runs
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer import (
    MODES,
    CpuTransferEngine,
    KVTransferEngine,
    TransferError,
    create_transfer_engine,
)

NUM_DEVICE_BLOCKS = 24
NUM_HOST_BLOCKS = 32
NUM_LAYERS = 3
PIECES_PER_BLOCK = NUM_LAYERS * 2  # (layer, K/V) pieces


def make_tiers(seed: int = 0, device: str = "cpu") -> KVCacheTiers:
    """Small tiers filled with random values, so a misplaced copy is visible."""
    kv = KVCacheTiers.allocate(
        NUM_DEVICE_BLOCKS, NUM_HOST_BLOCKS, NUM_LAYERS, 2, 2, 4, torch.bfloat16, device
    )
    generator = torch.Generator().manual_seed(seed)
    kv.device.copy_(torch.randn(kv.device.shape, generator=generator))
    kv.host.copy_(torch.randn(kv.host.shape, generator=generator))
    return kv


def spec(direction: Direction, src: list[int], dst: list[int]) -> TransferSpec:
    return TransferSpec(direction, tuple(src), tuple(dst))


def expected_tiers(kv: KVCacheTiers, specs: list[TransferSpec]) -> tuple[torch.Tensor, ...]:
    """Both tiers after `specs`, computed from a snapshot (specs must not conflict)."""
    device, host = kv.device.cpu().clone(), kv.host.cpu().clone()
    before = {Direction.D2H: (device.clone(), host), Direction.H2D: (host.clone(), device)}
    for s in specs:
        src, dst = before[s.direction]
        dst[list(s.dst_blocks)] = src[list(s.src_blocks)]
    return device, host


def assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(actual.cpu().view(torch.int16), expected.view(torch.int16))


def poll_until(engine: KVTransferEngine, ids: set[int], timeout: float = 10.0) -> list[int]:
    seen: list[int] = []
    deadline = time.monotonic() + timeout
    while not ids <= set(seen):
        assert time.monotonic() < deadline, f"timed out, finished so far: {seen}"
        seen += engine.poll_finished()
        time.sleep(0.001)
    return seen


def gate_direction(engine: KVTransferEngine, direction: Direction) -> threading.Event:
    """Make copies of `direction` block until the returned event is set."""
    gate = threading.Event()
    copy = engine._copy

    def gated_copy(s: TransferSpec) -> int:
        if s.direction is direction:
            assert gate.wait(timeout=10)
        return copy(s)

    engine._copy = gated_copy  # type: ignore[method-assign]
    return gate


@st.composite
def disjoint_specs(draw: st.DrawFn) -> tuple[TransferSpec, TransferSpec]:
    """A D2H and an H2D spec on disjoint blocks of each tier, safe to run at once."""
    device_blocks = draw(st.permutations(range(NUM_DEVICE_BLOCKS)))
    host_blocks = draw(st.permutations(range(NUM_HOST_BLOCKS)))
    num_out = draw(st.integers(0, NUM_DEVICE_BLOCKS // 2))
    num_in = draw(st.integers(0, NUM_DEVICE_BLOCKS // 2))
    out_src, in_dst = device_blocks[:num_out], device_blocks[num_out : num_out + num_in]
    out_dst, in_src = host_blocks[:num_out], host_blocks[num_out : num_out + num_in]
    if draw(st.booleans()):  # sorted sets form runs of consecutive blocks
        out_src, out_dst, in_src, in_dst = map(sorted, (out_src, out_dst, in_src, in_dst))
    return spec(Direction.D2H, out_src, out_dst), spec(Direction.H2D, in_src, in_dst)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(specs=disjoint_specs(), mode=st.sampled_from(MODES), seed=st.integers(0, 2**16))
def test_random_blocks_both_directions_at_once_arrive_byte_identical(
    specs: tuple[TransferSpec, TransferSpec], mode: str, seed: int
) -> None:
    kv = make_tiers(seed)
    expected_device, expected_host = expected_tiers(kv, list(specs))
    with CpuTransferEngine(kv, mode) as engine:
        for s in specs:
            engine.submit(s)
        engine.wait([s.transfer_id for s in specs])
        stats = engine.stats
    assert_same_bytes(kv.device, expected_device)
    assert_same_bytes(kv.host, expected_host)
    for s in specs:
        num_runs = len(merge_into_runs(s.src_blocks, s.dst_blocks))
        expected_calls = num_runs if mode == "duplex" else s.num_blocks * PIECES_PER_BLOCK
        assert stats.of(s.direction).num_copy_calls == expected_calls


def test_consecutive_blocks_are_copied_with_one_call_per_run() -> None:
    kv = make_tiers()
    out = spec(Direction.D2H, [5, 3, 4, 9, 10, 0], [12, 10, 11, 1, 2, 30])  # runs 3-5, 9-10, 0
    back = spec(Direction.H2D, [20, 21, 22, 23], [16, 17, 18, 19])  # one run
    expected_device, expected_host = expected_tiers(kv, [out, back])
    with CpuTransferEngine(kv) as engine:
        engine.submit(out)
        engine.submit(back)
        engine.wait()
        stats = engine.stats
    assert (stats.d2h.num_copy_calls, stats.h2d.num_copy_calls) == (3, 1)
    assert_same_bytes(kv.device, expected_device)
    assert_same_bytes(kv.host, expected_host)


def test_naive_mode_moves_the_same_bytes_with_more_copy_calls() -> None:
    out = spec(Direction.D2H, [0, 1, 2, 7], [4, 5, 6, 0])
    back = spec(Direction.H2D, [10, 11, 12], [20, 21, 22])
    results = {}
    for mode in MODES:
        kv = make_tiers(seed=7)
        with CpuTransferEngine(kv, mode) as engine:
            engine.submit(out)
            engine.submit(back)
            engine.wait()
            results[mode] = (kv, engine.stats.num_copy_calls)
    (duplex_kv, duplex_calls), (naive_kv, naive_calls) = results["duplex"], results["naive"]
    assert_same_bytes(naive_kv.device, duplex_kv.device)
    assert_same_bytes(naive_kv.host, duplex_kv.host)
    assert duplex_calls == 2 + 1
    assert naive_calls == (4 + 3) * PIECES_PER_BLOCK


def test_poll_finished_reports_each_id_exactly_once() -> None:
    with CpuTransferEngine(make_tiers()) as engine:
        specs = [
            spec(Direction.D2H if i % 2 else Direction.H2D, [i], [i]) for i in range(20)
        ]
        for s in specs:
            engine.submit(s)
        seen = poll_until(engine, {s.transfer_id for s in specs})
        engine.wait()
        assert sorted(seen) == sorted(s.transfer_id for s in specs)
        assert engine.poll_finished() == []


def test_wait_none_waits_for_all_and_poll_still_reports_them() -> None:
    kv = make_tiers()
    specs = [spec(Direction.D2H, [i, i + 1], [2 * i, 2 * i + 1]) for i in range(0, 12, 2)]
    specs += [spec(Direction.H2D, [i + 12], [i]) for i in range(12, 20)]  # host 24..31
    expected_device, expected_host = expected_tiers(kv, specs)
    with CpuTransferEngine(kv) as engine:
        for s in specs:
            engine.submit(s)
        engine.wait()
        assert_same_bytes(kv.device, expected_device)
        assert_same_bytes(kv.host, expected_host)
        assert sorted(engine.poll_finished()) == sorted(s.transfer_id for s in specs)
        assert engine.poll_finished() == []


def test_wait_for_some_ids_returns_once_they_are_done() -> None:
    with CpuTransferEngine(make_tiers()) as engine:
        gate = gate_direction(engine, Direction.D2H)
        slow = spec(Direction.D2H, [1], [1])
        fast = spec(Direction.H2D, [2], [2])
        engine.submit(slow)
        engine.submit(fast)
        engine.wait([fast.transfer_id])
        assert engine.poll_finished() == [fast.transfer_id]
        gate.set()
        engine.wait([slow.transfer_id, 12345])  # an id never submitted does not block
        assert engine.poll_finished() == [slow.transfer_id]


def test_duplex_lanes_copy_while_the_other_direction_is_stuck() -> None:
    with CpuTransferEngine(make_tiers(), "duplex") as engine:
        gate = gate_direction(engine, Direction.D2H)
        out, back = spec(Direction.D2H, [0], [0]), spec(Direction.H2D, [1], [1])
        engine.submit(out)
        engine.submit(back)
        assert poll_until(engine, {back.transfer_id}) == [back.transfer_id]
        gate.set()
        assert poll_until(engine, {out.transfer_id}) == [out.transfer_id]


def test_naive_mode_has_one_fifo_lane_for_both_directions() -> None:
    with CpuTransferEngine(make_tiers(), "naive") as engine:
        gate = gate_direction(engine, Direction.D2H)
        out, back = spec(Direction.D2H, [0], [0]), spec(Direction.H2D, [1], [1])
        engine.submit(out)
        engine.submit(back)
        time.sleep(0.05)
        assert engine.poll_finished() == []  # H2D is queued behind the stuck D2H
        gate.set()
        engine.wait()
        assert engine.poll_finished() == [out.transfer_id, back.transfer_id]


@pytest.mark.parametrize(
    ("src", "dst", "error"),
    [
        ([NUM_DEVICE_BLOCKS], [0], IndexError),
        ([0], [NUM_HOST_BLOCKS], IndexError),
        ([-1], [0], IndexError),
        ([NUM_DEVICE_BLOCKS - 1, NUM_DEVICE_BLOCKS], [0, 1], IndexError),  # run past the end
        ([0, 1], [3, 3], ValueError),
    ],
)
def test_invalid_block_ids_raise_in_submit_and_copy_nothing(
    src: list[int], dst: list[int], error: type[Exception]
) -> None:
    kv = make_tiers()
    host_before = kv.host.clone()
    with CpuTransferEngine(kv) as engine:
        with pytest.raises(error):
            engine.submit(spec(Direction.D2H, src, dst))
        engine.wait()
        assert engine.poll_finished() == []
        assert_same_bytes(kv.host, host_before)
        ok = spec(Direction.D2H, [0], [0])
        engine.submit(ok)  # the engine stays usable
        engine.wait()


def fail_direction(engine: KVTransferEngine, direction: Direction) -> None:
    copy = engine._copy

    def failing_copy(s: TransferSpec) -> int:
        if s.direction is direction:
            raise RuntimeError("copy exploded")
        return copy(s)

    engine._copy = failing_copy  # type: ignore[method-assign]


def test_an_error_in_a_worker_surfaces_in_the_caller() -> None:
    engine = CpuTransferEngine(make_tiers())
    fail_direction(engine, Direction.H2D)
    bad = spec(Direction.H2D, [0], [0])
    engine.submit(bad)
    with pytest.raises(TransferError) as raised:
        engine.wait([bad.transfer_id])
    assert raised.value.transfer_id == bad.transfer_id
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "copy exploded" in str(raised.value.__cause__)
    with pytest.raises(TransferError):
        engine.poll_finished()
    with pytest.raises(TransferError):
        engine.submit(spec(Direction.D2H, [0], [0]))
    engine.close()  # already reported: closes quietly
    engine.close()


def test_an_unreported_worker_error_is_raised_by_close() -> None:
    engine = CpuTransferEngine(make_tiers())
    fail_direction(engine, Direction.D2H)
    engine.submit(spec(Direction.D2H, [0], [0]))
    with pytest.raises(TransferError):
        engine.close()


def kv_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kv-transfer")]


@pytest.mark.parametrize("mode", MODES)
def test_close_drains_queued_transfers_stops_threads_and_is_idempotent(mode: str) -> None:
    kv = make_tiers()
    threads_before = len(kv_threads())
    specs = [spec(Direction.D2H, [i], [i]) for i in range(8)]
    expected_device, expected_host = expected_tiers(kv, specs)
    engine = CpuTransferEngine(kv, mode)
    assert len(kv_threads()) == threads_before + (2 if mode == "duplex" else 1)
    for s in specs:
        engine.submit(s)
    engine.close()
    engine.close()
    assert len(kv_threads()) == threads_before
    assert sorted(engine.poll_finished()) == sorted(s.transfer_id for s in specs)
    assert_same_bytes(kv.host, expected_host)
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit(spec(Direction.H2D, [0], [0]))


def test_context_manager_closes_and_keeps_the_original_exception() -> None:
    threads_before = len(kv_threads())
    with pytest.raises(KeyError):
        with CpuTransferEngine(make_tiers()) as engine:
            fail_direction(engine, Direction.D2H)
            engine.submit(spec(Direction.D2H, [0], [0]))
            raise KeyError("in the body")
    assert len(kv_threads()) == threads_before


def test_stats_count_blocks_bytes_calls_and_time() -> None:
    kv = make_tiers()
    with CpuTransferEngine(kv) as engine:
        engine.submit(spec(Direction.D2H, [0, 1, 2, 5, 6], [0, 1, 2, 3, 4]))
        engine.wait()
        stats = engine.stats
        stats.d2h.num_bytes = 0  # a snapshot: changing it changes nothing in the engine
        stats = engine.stats
    assert stats.d2h.num_transfers == 1
    assert stats.d2h.num_blocks == 5
    assert stats.d2h.num_bytes == 5 * kv.bytes_per_block
    assert stats.d2h.num_copy_calls == 2
    assert stats.d2h.seconds > 0 and stats.d2h.gb_per_s > 0
    assert stats.h2d.num_transfers == stats.h2d.num_bytes == 0


def test_device_to_host_copies_wait_for_the_recorded_compute_fence() -> None:
    kv = make_tiers()
    with CpuTransferEngine(kv) as engine:
        fence = threading.Event()
        engine.record_compute(fence)  # a forward is running on another thread
        out = spec(Direction.D2H, [0, 1], [2, 3])
        back = spec(Direction.H2D, [5], [6])
        engine.submit(out)
        engine.submit(back)
        assert poll_until(engine, {back.transfer_id}) == [back.transfer_id]
        time.sleep(0.05)
        assert out.transfer_id not in engine.poll_finished()  # held until the forward ends
        fence.set()
        engine.wait([out.transfer_id])
        engine.record_compute(None)
        later = spec(Direction.D2H, [4], [7])
        engine.submit(later)
        engine.wait([later.transfer_id])  # no fence: runs at once


def test_create_transfer_engine_picks_cpu_and_checks_the_mode() -> None:
    kv = make_tiers()
    for mode in MODES:
        with create_transfer_engine(kv, mode) as engine:
            assert isinstance(engine, CpuTransferEngine) and engine.mode == mode
            engine.record_compute()  # a no-op on the CPU, callable unconditionally
            engine.synchronize()
    with pytest.raises(ValueError, match="mode"):
        create_transfer_engine(kv, "fast")


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@requires_cuda
@pytest.mark.parametrize("mode", MODES)
def test_cuda_engine_copies_both_directions_byte_identical(mode: str) -> None:
    kv = make_tiers(seed=3, device="cuda")
    assert kv.host.is_pinned()
    out = spec(Direction.D2H, [5, 3, 4, 9, 10, 0], [12, 10, 11, 1, 2, 30])
    back = spec(Direction.H2D, [20, 21, 22, 23], [16, 17, 18, 19])
    expected_device, expected_host = expected_tiers(kv, [out, back])
    with create_transfer_engine(kv, mode) as engine:
        engine.submit(out)
        engine.submit(back)
        engine.synchronize()
        assert sorted(engine.poll_finished()) == sorted([out.transfer_id, back.transfer_id])
        calls = engine.stats.num_copy_calls
    assert calls == (4 if mode == "duplex" else 10 * PIECES_PER_BLOCK)
    assert_same_bytes(kv.device, expected_device)
    assert_same_bytes(kv.host, expected_host)


@requires_cuda
def test_cuda_d2h_waits_for_the_recorded_forward_and_wait_orders_the_compute_stream() -> None:
    kv = make_tiers(device="cuda")
    with create_transfer_engine(kv) as engine:
        torch.cuda.synchronize()
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(20):  # keep the compute stream busy before the write
            big = big @ big / 4096
        kv.device[3].fill_(7.0)  # "the forward" writes block 3
        engine.record_compute()
        out = spec(Direction.D2H, [3], [9])
        engine.submit(out)
        engine.synchronize([out.transfer_id])
        assert torch.all(kv.host[9] == 7.0)

        kv.host[4].fill_(5.0)
        back = spec(Direction.H2D, [4], [6])
        engine.submit(back)
        engine.wait([back.transfer_id])  # the next kernels on this stream see block 6
        seen = kv.device[6].clone()
        torch.cuda.synchronize()
        assert torch.all(seen == 5.0)
        assert sorted(engine.poll_finished()) == sorted([out.transfer_id, back.transfer_id])
