"""Real model under heavy rotation: outputs equal the unconstrained run token for token,
invariants hold after every step, nothing is left owned at the end."""

from __future__ import annotations

import pytest

from superinfer import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "List three primary colors:",
    "Once upon a time, in a small village by the mountains, there lived",
    "Translate to French: Good morning!",
    "Explain why the sky is blue.",
] * 2
PARAMS = SamplingParams(max_tokens=24, min_tokens=24, temperature=0)


def run(**options):
    llm = LLM(dtype="float32", device="cpu", block_size=8, max_model_len=128,
              check_invariants=True, **options)  # fmt: skip
    try:
        outputs = llm.generate(PROMPTS, PARAMS)
        engine = llm.engine
        kv = engine.scheduler.kv
        assert not kv.tables and not kv.shadow_of
        assert kv.device.num_free_blocks + kv.device.num_quarantined_blocks == kv.device.num_blocks
        return [o.outputs[0].token_ids for o in outputs], engine.scheduler.stats, engine.transfer.stats
    finally:
        llm.engine.close()


@pytest.fixture(scope="module")
def unconstrained():
    tokens, stats, _ = run(policy="fcfs-recompute", num_device_blocks=512, pipeline=False)
    assert stats.num_preemptions == stats.num_swap_outs == 0
    return tokens


@pytest.mark.parametrize(
    "policy,pipeline",
    [("rotasched", True), ("rotasched", False), ("ddps", True), ("fcfs-swap", True)],
)
def test_heavy_rotation_matches_the_unconstrained_run(unconstrained, policy, pipeline):
    tokens, stats, transfers = run(policy=policy, num_device_blocks=16, pipeline=pipeline)
    assert tokens == unconstrained
    # a request swapped out while its last token was sampled finishes without a swap-in
    assert stats.num_swap_outs >= 5 and 0 < stats.num_swap_ins <= stats.num_swap_outs
    assert transfers.d2h.num_blocks > 0 and transfers.h2d.num_blocks > 0
