"""The asyncio driver on the real default model: one thread builds the engine and runs it."""

from __future__ import annotations

import asyncio
import threading

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
