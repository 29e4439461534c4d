"""The engine's public contract on the real default model: step records for observers,
the plain-data snapshot, abort's final output, rotation and the debug report, and no
placeholder token in anything the engine hands out."""

from __future__ import annotations

import pytest

from superinfer import SamplingParams
from superinfer.config import EngineConfig
from superinfer.core.request import PLACEHOLDER
from superinfer.engine.llm_engine import LLMEngine
from superinfer.engine.snapshot import StepRecord

pytestmark = pytest.mark.slow


def make_engine(pipeline: bool) -> LLMEngine:
    return LLMEngine(EngineConfig.from_flat(
        dtype="float32", device="cpu", policy="rotasched", pipeline=pipeline, block_size=8,
        max_model_len=128, num_device_blocks=64, num_host_blocks=64, check_invariants=True,
    ))  # fmt: skip


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "pipelined"])
def engine(request):
    engine = make_engine(request.param)
    yield engine
    engine.close()


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run_all(engine: LLMEngine) -> list:
    outputs = []
    while engine.has_work():
        outputs += engine.step()
    return outputs


def test_observers_see_every_step_and_each_forward_once(engine):
    records: list[StepRecord] = []
    remove = engine.add_step_observer(records.append)
    engine.add_request({"prompt_token_ids": list(range(10, 30))}, greedy(4), "obs")
    outputs = run_all(engine)
    remove()
    num_records = len(records)
    engine.step()
    assert len(records) == num_records  # removed: not called
    indexes = [r.step_index for r in records]
    assert indexes == list(range(indexes[0], indexes[0] + len(records)))
    assert sum(r.num_outputs for r in records) == len(outputs) == 4
    forwards = [r.forward for r in records if r.forward is not None]
    assert len(forwards) == 4  # one prefill, three decodes
    assert (forwards[0].num_prefill_tokens, forwards[0].num_decode_tokens) == (20, 0)
    assert all((f.num_sequences, f.num_decode_tokens) == (1, 1) for f in forwards[1:])
    assert all(0 < f.forward_s and 0 <= f.host_s for f in forwards)
    assert all(r.wall_s > 0 for r in records)
    if engine.is_pipelined:  # a forward ends in the step after the one that launched it
        assert records[0].forward is None and records[-1].forward is not None


def test_the_snapshot_is_the_load_picture(engine):
    before = engine.snapshot()
    engine.add_request({"prompt_token_ids": list(range(40, 52))}, greedy(3), "snap")
    waiting = engine.snapshot()
    assert (waiting.num_waiting, waiting.num_running) == (before.num_waiting + 1, 0)
    (queued,) = waiting.waiting
    assert queued.num_tokens == 12 and waiting.is_queue_by_deadline  # rotasched
    assert waiting.num_free_device_blocks == 64 and waiting.block_size == 8
    engine.step()
    running = engine.snapshot()
    assert (running.num_waiting, running.num_running) == (0, 1)
    assert running.num_steps > before.num_steps and running.device_kv_usage > 0
    assert running.running_blocks_by_class == {None: 2}  # 12 tokens, 8 a block
    assert running.running_by_class == {None: 1} and running.swapped_by_class == {}
    assert running.max_num_seqs == engine.config.scheduler.max_num_seqs
    assert running.num_free_device_blocks == 62
    assert running.num_device_blocks == 64 and running.num_host_blocks == 64
    run_all(engine)
    assert engine.snapshot().num_inflight_transfers == 0
    assert engine.snapshot().num_released_blocks - before.num_released_blocks == 2
    assert engine.snapshot().num_finished - before.num_finished == 1  # its seat is free


def test_abort_returns_the_final_output_without_a_placeholder(engine):
    engine.add_request({"prompt_token_ids": list(range(60, 75))}, greedy(20), "gone")
    for _ in range(4):
        engine.step()
    final = engine.abort("gone")
    assert final is not None and final.finished
    assert final.outputs[0].finish_reason == "abort"
    assert final.outputs[0].token_ids and PLACEHOLDER not in final.outputs[0].token_ids
    assert engine.abort("gone") is None
    run_all(engine)
    engine.check_invariants()


def test_a_rotation_round_trip_shows_in_the_snapshot_and_the_report(engine):
    engine.add_request({"prompt_token_ids": list(range(80, 100))}, greedy(6), "rot")
    tokens = []
    while not tokens:
        tokens = [t for o in engine.step() for t in o.outputs[0].token_ids]
    num_swap_ins = engine.snapshot().num_swap_ins
    assert engine.rotate_out("rot") and not engine.rotate_out("rot")
    report = engine.debug_report()
    assert report["num_swapped"] == 1 and report["invariants"] == "ok"
    outputs = run_all(engine)
    assert outputs[-1].finished and PLACEHOLDER not in outputs[-1].outputs[0].token_ids
    assert engine.snapshot().num_swap_ins == num_swap_ins + 1
    report = engine.debug_report()
    assert (report["num_unfinished"], report["num_block_tables"]) == (0, 0)
    assert report["num_inflight_transfers"] == 0 and not engine.has_work()


def test_close_with_a_step_in_flight():
    engine = make_engine(pipeline=True)
    engine.add_request({"prompt_token_ids": list(range(10, 20))}, greedy(8), "late")
    engine.step()
    engine.step()
    assert engine.has_unfinished_requests()
    engine.abort_request("late")
    engine.close()  # waits for the forward and lifts its fence
    engine.check_invariants()


def test_the_step_model_learns_from_every_step_and_shapes_once_anchored(engine):
    engine = LLMEngine(EngineConfig.from_flat(
        dtype="float32", device="cpu", policy="rotasched", pipeline=engine.is_pipelined,
        block_size=8, max_model_len=128, num_device_blocks=64, num_host_blocks=64,
        tbt_shaped_steps=True,
    ))  # fmt: skip
    assert not engine.step_model.is_ready  # no warm-up: steps are not shaped
    for i in range(4):
        engine.add_request({"prompt_token_ids": list(range(200 + i, 220 + i))}, greedy(12), f"m{i}")
    run_all(engine)
    report = engine.anchor_step_model()
    assert engine.step_model.is_ready and report["num_anchors"] >= 8
    from superinfer.core.step_time import BatchShape

    one, four = (engine.step_model.forward_time(BatchShape.of_lists([1] * n, [20] * n))
                 for n in (1, 4))  # fmt: skip
    assert 0 < one <= four
    engine.close()
