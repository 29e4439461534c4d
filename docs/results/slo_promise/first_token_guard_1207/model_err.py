"""How well the engine's step-time model predicts its own steps, by prefill tokens: the
real engine (SmolLM2-135M, bf16, CPU) warmed up as the server does, then 60 prompts of
30-800 tokens arriving every few steps. Prints measured / predicted per bin and the
model's late factor.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/results/slo_promise/first_token_guard_1207/model_err.py
"""

import random
import statistics

from superinfer.config import EngineConfig
from superinfer.core.step_time import BatchShape, step_seconds
from superinfer.engine.llm_engine import LLMEngine
from superinfer.sampling_params import SamplingParams
from superinfer.server.warmup import warm_up

MODEL = "/work/models/smollm2-135m-instruct-hf"  # benchmarks/vs_vllm/export_hf.py writes it

engine = LLMEngine(EngineConfig.from_flat(model=MODEL, dtype="bfloat16", device="cpu",
                                          device_kv_gib=0.125, host_kv_gib=0.125,
                                          max_model_len=2048))  # fmt: skip
warm_up(engine)
rows = []


def observe(record) -> None:
    if record.forward is not None:
        shape = BatchShape.of(record.forward.batch)
        rows.append((shape, record.wall_s, step_seconds(engine.step_model, shape)))


engine.add_step_observer(observe)
rng = random.Random(0)
for i in range(60):
    prompt = [rng.randrange(100, 20000) for _ in range(rng.choice([30, 60, 120, 300, 500, 800]))]
    params = SamplingParams(max_tokens=rng.randint(10, 60), temperature=0.0, ignore_eos=True)
    engine.add_request({"prompt_token_ids": prompt}, params, f"q{i}")
    for _ in range(rng.randint(1, 6)):
        engine.step()
while engine.has_unfinished_requests():
    engine.step()
bins: dict[int, list[float]] = {}
for shape, wall_s, predicted_s in rows:
    bins.setdefault(min(shape.num_prefill_tokens // 100 * 100, 500), []).append(
        wall_s / predicted_s
    )
for key, ratios in sorted(bins.items()):
    ratios.sort()
    print(
        f"prefill tokens >= {key:3}: {len(ratios):3} steps, measured / predicted: median "
        f"{statistics.median(ratios):.2f}, p90 {ratios[int(0.9 * len(ratios))]:.2f}, max {ratios[-1]:.2f}"
    )
print(f"late factor {engine.step_model.late_factor:.2f}")
