"""`superinfer calibrate`: time the real engine's steps and fit the simulator's predictor.

Runs the real `LLMEngine` over a grid of batches: lone prompts of several lengths
(prefill, and chunks after cached context past the token budget), batches of 1 to 64
requests at every knot of the fit's token axis with short and long contexts (chunked
prefill, decodes), and prompts that join running decodes (mixed steps, as a served engine
mostly runs them); each pass ends with a served mix of requests arriving in real time,
whose scatter around the fit gives the step-time noise (`sim/noise.py`). Each step gives one
sample (batch shape, forward seconds, host
seconds; see `StepTimer` for how each is timed with the step pipeline on, the engine's
default, and off); the repeats of a shape are reduced to their median and fitted by
`FittedPredictor.fit`. The KV link is timed too (one long run of blocks and many
one-block runs, each direction alone and both at once) and saved with the fit.

On this CPU: `OMP_NUM_THREADS=1 superinfer calibrate` writes
`superinfer/sim/profiles/cpu_smollm2.json` (one thread: on the shared 2-core machine, two
OpenMP threads made a step 10-30x slower whenever another job held the other core). On a
GPU, the same command with `--device cuda` times that GPU.
"""

from __future__ import annotations

import logging
import math
import platform
import random
import statistics
import time
from dataclasses import dataclass

from superinfer.sim.fitted import FittedPredictor, StepSample
from superinfer.sim.noise import NoiseParams
from superinfer.sim.predictor import BatchShape

logger = logging.getLogger(__name__)

# knots and counts between them: a CPU's linear layers pad rows up to buckets, so a count
# past a knot can cost 10-15% more than the line through the knots (37 tokens against 32)
PREFILL_LENGTHS = (16, 24, 32, 37, 48, 64, 85, 100, 128, 133, 192, 200, 256, 300, 384, 450,
                   512, 700, 1000)  # fmt: skip
# (context, batch sizes): every knot of `token_knots` up to 64 at a short context, fewer
# at longer ones (which add the decode-context slope and cost a long prefill each)
DECODE_GRID = (
    (32, (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)),
    (256, (1, 2, 4, 8, 16, 32, 64)),
    (640, (1, 4, 12)),
)
DECODE_STEPS = 6
# (running decodes, their context, the joining prompt's lengths)
MIXED_GRID = ((2, 64, (32, 45, 128, 170, 320)), (6, 64, (32, 90, 128, 320)), (12, 64, (64, 256)))
# the served mix: requests of random lengths arriving in real time (see `run_served_mix`)
SERVED_MIX_REQUESTS = 60  # over all passes
SERVED_MIX_RATE = 2.0  # arrivals per second


@dataclass
class CalibrationOptions:
    model: str | None = None  # default: SmolLM2-135M-Instruct
    dtype: str = "bfloat16"
    device: str = "cpu"
    repeats: int = 3
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 1024
    block_size: int = 16
    seed: int = 0
    pipeline: bool | None = None  # None: as the engine runs by default (off on a CPU)


class StepTimer:
    """The forward of each batch and the host work around it, from the engine's step
    observer (`LLMEngine.add_step_observer`; see `ForwardRecord`).

    Without the pipeline, forward = the runner's `execute`, host = the rest of the step.
    With the pipeline, a forward runs from its launch until its result is ready, on the
    runner's thread, while the engine schedules the next step, so the time includes
    whatever that overlap costs; host = the time the launching step spent not blocked on
    a forward.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.is_pipelined = engine.is_pipelined
        self._samples: list[StepSample] = []
        engine.add_step_observer(self._observe)

    def _observe(self, record) -> None:
        forward = record.forward
        if forward is not None:
            self._samples.append(
                StepSample(BatchShape.of(forward.batch), forward.forward_s, forward.host_s)
            )

    def step(self) -> list:
        """One `engine.step()`; returns its outputs."""
        return self.engine.step()

    @property
    def samples(self) -> list[StepSample]:
        return list(self._samples)

    def clear(self) -> None:
        self._samples = []


def build_engine(options: CalibrationOptions):
    from superinfer.config import EngineConfig
    from superinfer.engine.llm_engine import LLMEngine

    blocks_per_seq = -(-options.max_model_len // options.block_size)
    config = EngineConfig.from_flat(
        model=options.model, dtype=options.dtype, device=options.device, policy="fcfs-recompute",
        pipeline=options.pipeline, max_num_seqs=options.max_num_seqs, block_size=options.block_size,
        max_num_batched_tokens=options.max_num_batched_tokens, max_model_len=options.max_model_len,
        num_device_blocks=options.max_num_seqs * blocks_per_seq, num_host_blocks=4 * blocks_per_seq,
        enable_prefix_caching=False,
    )  # fmt: skip
    return LLMEngine(config)


def add_random(timer: StepTimer, rng: random.Random, num_prompt: int, max_tokens: int):
    from superinfer.sampling_params import SamplingParams

    engine = timer.engine
    prompt = [rng.randrange(engine.model_config.vocab_size) for _ in range(num_prompt)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return engine.add_request({"prompt_token_ids": prompt}, params)


def run_batch(
    timer: StepTimer, rng: random.Random, num_prompt: int, num_requests: int, max_tokens: int
) -> None:
    for _ in range(num_requests):
        add_random(timer, rng, num_prompt, max_tokens)
    while timer.engine.has_unfinished_requests():
        timer.step()


def run_mixed(
    timer: StepTimer, rng: random.Random, num_running: int, context: int, num_prompt: int
) -> None:
    """`num_running` requests decode; then a prompt joins them (mixed steps)."""
    running = [add_random(timer, rng, context, 4 + DECODE_STEPS) for _ in range(num_running)]
    while not all(r.num_output_tokens for r in running):
        timer.step()
    add_random(timer, rng, num_prompt, 1)
    while timer.engine.has_unfinished_requests():
        timer.step()


def run_served_mix(
    timer: StepTimer, rng: random.Random, num_requests: int, rate: float, max_model_len: int
) -> None:
    """Requests of random lengths (prompts 8-600 tokens, log-uniform; 8-128 output tokens)
    arriving by a Poisson process in real time, as a server sees them: prompts join
    running decodes at any token count, and a step after an idle gap starts cold (a lone
    prompt after 1 s idle: 0-23% slower here than back to back, typically 5%). The grid
    alone missed both: fitted to it, the predictor was 8-18% fast on the prefill steps a
    served run made."""
    gaps = [rng.expovariate(rate) for _ in range(num_requests)]
    start, due = time.perf_counter(), 0.0
    pending = []
    for gap in gaps:
        due += gap
        num_prompt = min(int(math.exp(rng.uniform(math.log(8), math.log(600)))), max_model_len // 2)
        pending.append((due, num_prompt, rng.randint(8, 128)))
    engine = timer.engine
    while pending or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while pending and pending[0][0] <= now:
            _, num_prompt, max_tokens = pending.pop(0)
            add_random(timer, rng, num_prompt, max_tokens)
        if engine.has_unfinished_requests():
            timer.step()
        elif pending:
            time.sleep(max(0.0, pending[0][0] - (time.perf_counter() - start)))


def collect_samples(
    engine, options: CalibrationOptions
) -> tuple[list[StepSample], list[StepSample]]:
    """The grid's samples and the served mix's (in step order). Every pass ends with a
    share of the served mix, so its samples, like the grid's, span the calibration rather
    than one window of it (this machine's speed drifted by about 9% within 25 minutes)."""
    rng = random.Random(options.seed)
    timer = StepTimer(engine)
    run_batch(timer, rng, 64, 4, 4)  # warm-up
    timer.clear()
    grid: list[StepSample] = []
    served: list[StepSample] = []
    num_served = max(10, SERVED_MIX_REQUESTS // options.repeats)
    for repeat in range(options.repeats):
        for num_prompt in PREFILL_LENGTHS:
            run_batch(timer, rng, min(num_prompt, options.max_model_len - 2), 1, 1)
        for context, batches in DECODE_GRID:
            context = min(context, options.max_model_len - DECODE_STEPS - 2)
            for batch in sorted({min(b, options.max_num_seqs) for b in batches}):
                run_batch(timer, rng, context, batch, DECODE_STEPS)
        for num_running, context, prompts in MIXED_GRID:
            for num_prompt in prompts:
                run_mixed(timer, rng, min(num_running, options.max_num_seqs), context, num_prompt)
        grid += timer.samples
        timer.clear()
        run_served_mix(timer, rng, num_served, SERVED_MIX_RATE, options.max_model_len)
        served += timer.samples
        timer.clear()
        logger.info("calibration pass %d: %d grid, %d served samples", repeat + 1, len(grid),
                    len(served))  # fmt: skip
    return grid, served



def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def calibrate(options: CalibrationOptions) -> FittedPredictor:
    engine = build_engine(options)
    try:
        started = time.perf_counter()
        grid, served = collect_samples(engine, options)
        link = engine.measure_kv_link()
    finally:
        engine.close()
    meta = {
        "model": engine.model_config.name or options.model,
        "dtype": options.dtype, "device": str(engine.device), "machine": platform.machine(),
        "processor": platform.processor() or platform.platform(),
        "engine": {"max_num_seqs": options.max_num_seqs, "block_size": options.block_size,
                   "max_num_batched_tokens": options.max_num_batched_tokens,
                   "pipeline": engine.is_pipelined},
        "link": link, "calibration_s": round(time.perf_counter() - started, 1),
        "torch_threads": torch_threads(),
        "date": time.strftime("%Y-%m-%d"),
        "note": "timed on a shared 2-core machine; other jobs add noise",
    }  # fmt: skip
    fit = FittedPredictor.fit(median_samples(grid + served), options.max_num_batched_tokens, meta)
    noise = NoiseParams.estimate(
        [s.forward_s for s in served], [fit.forward_time(s.batch) for s in served]
    )
    fit.meta["step_noise"] = {**noise.to_dict(), "num_steps": len(served)}
    return fit


def median_samples(samples: list[StepSample]) -> list[StepSample]:
    """One sample per distinct batch shape, with the median times of its repeats.

    The grid is deterministic, so each pass times the same shapes; the median keeps a
    step slowed by another job on a shared machine from pulling the fit. The served mix's
    shapes rarely repeat; they stay single samples, and the least-squares fit averages
    them, slow spells included, as a served run meets them."""
    groups: dict[BatchShape, list[StepSample]] = {}
    for sample in samples:
        groups.setdefault(sample.batch, []).append(sample)
    return [
        StepSample(batch, statistics.median(s.forward_s for s in group),
                   statistics.median(s.host_s for s in group))
        for batch, group in groups.items()
    ]  # fmt: skip
