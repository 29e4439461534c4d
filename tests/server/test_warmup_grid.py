"""With --tbt-shaped-steps, --first-token-guard or --tbt-guard the warm-up times a grid of
batches and anchors the step-time model the scheduler then prices steps by; without any of
them the grid is skipped."""

from __future__ import annotations

import pytest

from superinfer.config import EngineConfig
from superinfer.core.step_time import BatchShape
from superinfer.core.token_guard import GUARD_HEADROOM
from superinfer.engine.llm_engine import LLMEngine
from superinfer.server.warmup import warm_up

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("is_shaped", "is_guarded", "is_tbt_guarded"),
    [(True, False, False), (False, True, False), (False, False, True), (False, False, False)],
)
def test_the_grid_anchors_the_model_when_the_scheduler_prices_steps(
    is_shaped, is_guarded, is_tbt_guarded
):
    engine = LLMEngine(EngineConfig.from_flat(
        dtype="float32", device="cpu", max_model_len=512, num_device_blocks=128,
        num_host_blocks=64, tbt_shaped_steps=is_shaped, first_token_guard=is_guarded,
        tbt_guard=is_tbt_guarded,
    ))  # fmt: skip
    try:
        warm_up(engine)
        model = engine.step_model
        # else the grid is skipped
        assert model.is_ready is (is_shaped or is_guarded or is_tbt_guarded)
        if model.is_ready:
            one, sixteen = (model.forward_time(BatchShape.of_lists([1] * n, [30] * n))
                            for n in (1, 16))  # fmt: skip
            assert 0 < one <= sixteen
        assert engine.scheduler.is_shaping_steps is is_shaped
        assert engine.scheduler.first_token_headroom() == (GUARD_HEADROOM * is_guarded)
        assert engine.snapshot().first_token_headroom == (GUARD_HEADROOM * is_guarded)
        assert engine.scheduler._step_limit(engine.clock()) is None  # nothing running
    finally:
        engine.close()


def test_the_warm_up_times_a_long_prompts_chunks_for_the_prefill_cost():
    """Besides the one-step prompt, a prompt of two step budgets: its second chunk attends
    to the first, so the samples tell attention pairs apart from tokens."""
    engine = LLMEngine(EngineConfig.from_flat(
        dtype="float32", device="cpu", max_model_len=1024, num_device_blocks=128,
        num_host_blocks=64, max_num_batched_tokens=128,
    ))  # fmt: skip
    try:
        report = warm_up(engine)
        pairs_per_token = [pairs / tokens for tokens, pairs, _ in report.prefill_samples]
        assert [tokens for tokens, _, _ in report.prefill_samples] == [128, 128, 128]
        assert pairs_per_token[2] == pytest.approx(128 + 129 / 2)  # after 128 cached
        assert pairs_per_token[0] == pytest.approx(pairs_per_token[1]) == pytest.approx(129 / 2)
        assert all(seconds > 0 for _, _, seconds in report.prefill_samples)
        engine.check_invariants()
    finally:
        engine.close()
