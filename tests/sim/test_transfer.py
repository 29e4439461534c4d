from __future__ import annotations

import pytest

from superinfer.core.kv.transfer import Direction, TransferSpec
from superinfer.sim.transfer import LinkModel, SimTransferEngine

MIB = 2**20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_engine(mode="duplex", is_full_duplex=True, overhead=3e-6):
    # 2 MiB blocks of 64 pieces (Llama-3-8B) over a 450 GB/s link
    link = LinkModel(450.0, is_full_duplex, overhead, 2 * MIB, 64)
    clock, ends = Clock(), {}
    engine = SimTransferEngine(link, mode, clock, lambda i, end: ends.__setitem__(i, end))
    return engine, clock, ends


def spec(direction, blocks):
    return TransferSpec(direction, tuple(blocks), tuple(blocks))


def test_block_first_copies_reach_the_link_and_naive_ones_do_not():
    duplex, _, ends = make_engine("duplex")
    s = spec(Direction.D2H, range(100))  # one run of 100 blocks
    duplex.submit(s)
    assert duplex.stats.d2h.num_copy_calls == 1
    assert 100 * 2 * MIB / ends[s.transfer_id] / 1e9 == pytest.approx(450, rel=0.01)
    naive, _, ends = make_engine("naive")
    s = spec(Direction.D2H, range(100))
    naive.submit(s)
    assert naive.stats.d2h.num_copy_calls == 6400
    gbps = 100 * 2 * MIB / ends[s.transfer_id] / 1e9
    assert 8 < gbps < 12  # vLLM's swap on C2C: about 10 GB/s


def test_scattered_blocks_cost_one_copy_each():
    engine, _, _ = make_engine()
    engine.submit(spec(Direction.H2D, range(0, 20, 2)))
    assert engine.stats.h2d.num_copy_calls == 10


def test_full_duplex_overlaps_directions_and_half_duplex_serializes():
    full, _, ends = make_engine(is_full_duplex=True)
    out, back = spec(Direction.D2H, range(50)), spec(Direction.H2D, range(50))
    full.submit(out)
    full.submit(back)
    assert ends[out.transfer_id] == pytest.approx(ends[back.transfer_id])
    half, _, ends = make_engine(is_full_duplex=False)
    out, back = spec(Direction.D2H, range(50)), spec(Direction.H2D, range(50))
    half.submit(out)
    half.submit(back)
    assert ends[back.transfer_id] == pytest.approx(2 * ends[out.transfer_id])


def test_one_direction_is_fifo_and_device_to_host_waits_for_the_forward():
    engine, _, ends = make_engine()
    first, second = spec(Direction.H2D, [1]), spec(Direction.H2D, [2])
    engine.submit(first)
    engine.submit(second)
    assert ends[second.transfer_id] == pytest.approx(2 * ends[first.transfer_id])
    engine.record_compute(forward_end=0.5)
    out, back = spec(Direction.D2H, [3]), spec(Direction.H2D, [4])
    engine.submit(out)
    engine.submit(back)
    assert ends[out.transfer_id] > 0.5 > ends[back.transfer_id]


def test_completions_are_polled_once_and_waits_need_the_clock_there():
    engine, clock, _ = make_engine()
    s = spec(Direction.H2D, range(8))
    engine.submit(s)
    assert engine.poll_finished() == []
    with pytest.raises(RuntimeError, match="before it ends"):
        engine.wait([s.transfer_id])
    clock.now = engine.ready_time([s.transfer_id])
    engine.wait([s.transfer_id])
    engine.mark_done(s.transfer_id)  # the completion event arriving too is harmless
    assert engine.poll_finished() == [s.transfer_id]
    assert engine.poll_finished() == [] and engine.num_pending == 0
