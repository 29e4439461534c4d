"""The asyncio driver on the real default model: one thread builds the engine and runs it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from superinfer import SamplingParams
from superinfer.config import EngineConfig
from superinfer.engine.async_engine import AsyncEngine
from superinfer.engine.llm_engine import LLMEngine

pytestmark = pytest.mark.slow


def test_engine_is_built_and_stepped_on_its_own_thread():
    threads: dict[str, threading.Thread] = {}

    def factory() -> LLMEngine:
        threads["build"] = threading.current_thread()
        return LLMEngine(EngineConfig())

    class Recording(AsyncEngine):
        def _step(self) -> None:
            threads["step"] = threading.current_thread()
            super()._step()

    async def run() -> list[int]:
        engine = Recording(factory)
        await engine.start()
        try:
            params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0)
            stream = engine.add_request("r0", [1, 2, 3, 4], params, arrival_time=0.0)
            outputs = [output async for output in stream]
            threads["call"] = await engine.call(lambda _: threading.current_thread())
        finally:
            await engine.shutdown()
        return outputs[-1].outputs[0].token_ids

    token_ids = asyncio.run(run())
    assert len(token_ids) == 4
    assert threads["build"] is not threading.main_thread()
    assert threads["build"] is threads["step"] is threads["call"]


def test_a_failed_build_raises_from_start_and_serves_nothing():
    def factory() -> LLMEngine:
        raise ValueError("no such model")

    async def run() -> AsyncEngine:
        engine = AsyncEngine(factory)
        with pytest.raises(ValueError, match="no such model"):
            await engine.start()
        return engine

    engine = asyncio.run(run())
    assert not engine.is_alive
    with pytest.raises(RuntimeError, match="not built"):
        engine.engine


def test_the_snapshot_publishes_prefill_cost_learned_from_served_steps():
    async def run() -> float:
        engine = AsyncEngine(lambda: LLMEngine(EngineConfig()))
        await engine.start()
        try:
            engine.learn_prefill_cost(1e-9)  # a prior no real prefill is this cheap
            params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
            for i in range(10):  # one by one: ten steps, each a whole 64-token prompt
                prompt = [(7 * i + j) % 500 + 10 for j in range(64)]
                async for _ in engine.add_request(f"r{i}", prompt, params, arrival_time=0.0):
                    pass
            return engine.snapshot.prefill_s_per_token
        finally:
            await engine.shutdown()

    learned = asyncio.run(run())
    assert learned > 1e-6  # a 135M model's prefill costs at least a microsecond a token


def test_a_request_taken_in_stays_queued_for_admission_until_a_snapshot_has_it():
    class SlowStep(AsyncEngine):  # a long step between taking the request in and publishing
        def _step(self) -> None:
            time.sleep(0.3)
            super()._step()

    async def run() -> list[int]:
        engine = SlowStep(lambda: LLMEngine(EngineConfig()))
        await engine.start()
        try:
            params = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
            stream = engine.add_request("r0", list(range(10, 74)), params, arrival_time=0.0)
            first = asyncio.ensure_future(stream.__anext__())
            seen = []  # what admission counts of it, until its first output
            while not first.done():
                snapshot = engine.snapshot
                seen.append(len(engine.queued()) + snapshot.num_running + snapshot.num_swapped)
                await asyncio.sleep(0.01)
            async for _ in stream:
                pass
            return seen
        finally:
            await engine.shutdown()

    seen = asyncio.run(run())
    assert len(seen) > 10  # the slow step kept it waiting for its first output
    assert min(seen) >= 1  # never invisible: queued, then in the snapshot
