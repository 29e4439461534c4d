"""`GET /debug/engine` (only with --enable-debug-routes): KV ownership per tier and per
class, queue lengths, and the scheduler's invariant check (`LLMEngine.debug_report`). Runs
on the engine thread between steps, so it sees a consistent state. For tests; never expose
it in production.
"""

from __future__ import annotations

from typing import Any

from superinfer.engine.llm_engine import LLMEngine


def engine_report(engine: LLMEngine) -> dict[str, Any]:
    """The engine's debug report; call it on the engine thread (`AsyncEngine.call`)."""
    return engine.debug_report()
