"""The engine on CUDA end to end (runs whenever a GPU is present, skipped otherwise): the
default model's greedy tokens through the Triton backend, decode graphs and the pipelined
step equal the CPU reference's, in float32."""

from __future__ import annotations

import pytest
import torch

from superinfer import LLM, SamplingParams

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,"]
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


def _tokens(**options) -> list[list[int]]:
    llm = LLM(dtype="float32", quantization="none", max_model_len=256, **options)
    try:
        return [out.outputs[0].token_ids for out in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.engine.close()


@pytest.fixture(scope="module")
def cpu_reference() -> list[list[int]]:
    return _tokens(device="cpu", attention_backend="reference", pipeline=False)


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "plain"])
def test_cuda_greedy_tokens_equal_the_cpu_reference(cpu_reference, enforce_eager, pipeline):
    got = _tokens(device="cuda", attention_backend="triton", enforce_eager=enforce_eager,
                  pipeline=pipeline, device_kv_gib=0.25)  # fmt: skip
    assert got == cpu_reference
