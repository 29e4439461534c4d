"""Warm-up before the server reports healthy: a real request through prefill and decode,
and a KV rotation round trip through the host tier (swapped out mid-decode, swapped back
in, and its greedy tokens must equal the undisturbed run's). It also measures the prefill
cost of a short prompt and of a long prompt's chunks, and the decode step time, that
admission estimates start from. With `--tbt-shaped-steps`, `--first-token-guard` or
`--tbt-guard` it also times a small grid of batches (several sequences decoding at once, a
batched prefill): with the steps above they anchor the step-time model the scheduler
prices those steps by.

Runs on the engine thread (`AsyncEngine.call`), before any user request is accepted, and
uses only the engine's public contract (steps, its step observer, snapshot, rotate_out,
check_invariants, debug_report).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from superinfer.core.step_time import BatchShape
from superinfer.engine.llm_engine import LLMEngine
from superinfer.engine.snapshot import StepRecord
from superinfer.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_NUM_TOKENS = 8
_ROTATE_AFTER = 3  # output tokens before the forced rotation
_MAX_STEPS = 10_000
_TIMING_PROMPT_TOKENS = 256
_GRID_BATCH_SIZES = (4, 16)  # sequences decoding together in the timing grid
_GRID_PROMPT_TOKENS = 20
_LONG_PROMPT_CHUNKS = 2  # the long timing prompt, in full step budgets


Sample = tuple[int, float, float]  # a prefill step's (prompt tokens, attention pairs, seconds)


class WarmupError(RuntimeError):
    """The warm-up found the engine not working."""


@dataclass(frozen=True)
class WarmupReport:
    prefill_s_per_token: float
    step_time_s: float
    seconds: float
    # each timed prefill step's: a short prompt in one step and a long one in full-budget
    # chunks, so pairs are priced apart from tokens
    prefill_samples: tuple[Sample, ...] = ()


def warm_up(engine: LLMEngine) -> WarmupReport:
    """Prefill + decode, then the same request with a rotation; raises WarmupError."""
    start = time.perf_counter()
    prompt = _prompt_ids(engine, 2 * engine.config.cache.block_size + 5)
    logger.info("Warm-up 1/3: a %d-token request through prefill and %d decode steps",
                len(prompt), _NUM_TOKENS)  # fmt: skip
    plain, step_time_s = _generate(engine, "superinfer-warmup-plain", prompt)
    logger.info("Warm-up 2/3: the same request rotated to the host tier and back")
    rotated, _ = _generate(engine, "superinfer-warmup-rotated", prompt, rotate_after=_ROTATE_AFTER)
    if rotated != plain:
        raise WarmupError(f"tokens changed across a KV rotation: {plain} vs {rotated}")
    logger.info("Warm-up 3/3: timing a whole-prompt prefill and a long prompt's chunks")
    _warm_prefill_shapes(engine)
    prefill_s_per_token, samples = _time_prefill(engine)
    samples += _time_long_prefill(engine)
    if engine.config.scheduler.is_step_model_used:
        for num_seqs in _grid_batch_sizes(engine):
            _time_batch(engine, num_seqs)
        fit = engine.anchor_step_model()
        logger.info("Step-time model: %s", ", ".join(
            f"{k} {v:.3g}" for k, v in fit.items() if isinstance(v, float)))  # fmt: skip
    _check_clean(engine)
    seconds = time.perf_counter() - start
    logger.info("Warm-up done in %.1f s: prefill %.2f ms/token, decode step %.1f ms",
                seconds, prefill_s_per_token * 1e3, step_time_s * 1e3)  # fmt: skip
    return WarmupReport(prefill_s_per_token, step_time_s, seconds, tuple(samples))


def _prompt_ids(engine: LLMEngine, num_tokens: int) -> list[int]:
    text = "The quick brown fox jumps over the lazy dog while the clock ticks. " * num_tokens
    ids = engine.tokenizer(text)["input_ids"][:num_tokens]
    return ids


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def _time_prefill(engine: LLMEngine) -> tuple[float, list[Sample]]:
    """Seconds per prompt token of one whole-prompt prefill step, and its step's sample."""
    scheduler_config = engine.config.scheduler
    num_tokens = min(_TIMING_PROMPT_TOKENS, scheduler_config.max_num_batched_tokens,
                     scheduler_config.max_model_len - 2)  # fmt: skip
    # a distinct prompt, so the prefix cache of the runs below cannot shorten it
    prompt = list(reversed(_prompt_ids(engine, num_tokens)))
    start = time.perf_counter()
    samples = _prefill_samples(engine, "superinfer-warmup-prefill", prompt)
    return (time.perf_counter() - start) / len(prompt), samples


def _warm_prefill_shapes(engine: LLMEngine) -> None:
    """An untimed prompt of one and a half step budgets, so the timed prefills below run
    warm: the first step of a new row count builds its kernels (oneDNN primitives) and
    touches fresh buffers (a long prompt's second chunk took 398 against 335 ms warm)."""
    budget = engine.config.scheduler.max_num_batched_tokens
    num_tokens = _fitting_prompt_len(engine, budget + budget // 2)
    prompt = _prompt_ids(engine, num_tokens + 2)[2:]  # shifted: no block in common
    _prefill_samples(engine, "superinfer-warmup-shapes", prompt)


def _time_long_prefill(engine: LLMEngine) -> list[Sample]:
    """The samples of a prompt of `_LONG_PROMPT_CHUNKS` full step budgets (fewer where the
    model length or the device pool is smaller); none if it would fit one step."""
    budget = engine.config.scheduler.max_num_batched_tokens
    num_tokens = _fitting_prompt_len(engine, _LONG_PROMPT_CHUNKS * budget)
    if num_tokens <= budget:
        return []
    # shifted by one token: no block in common with the earlier prompts
    prompt = _prompt_ids(engine, num_tokens + 1)[1:]
    return _prefill_samples(engine, "superinfer-warmup-long-prefill", prompt)


def _fitting_prompt_len(engine: LLMEngine, num_tokens: int) -> int:
    """`num_tokens`, or less where the model length or half the device pool is smaller."""
    config = engine.config
    num_pool_tokens = engine.snapshot().num_device_blocks * config.cache.block_size
    return min(num_tokens, config.scheduler.max_model_len - 2, num_pool_tokens // 2)


def _prefill_samples(engine: LLMEngine, request_id: str, prompt: list[int]) -> list[Sample]:
    """Prefill `prompt` alone (one output token); each step's (prompt tokens, attention
    pairs, seconds)."""
    records: list[StepRecord] = []
    remove_observer = engine.add_step_observer(records.append)
    try:
        engine.add_request({"prompt_token_ids": prompt}, _greedy(1), request_id)
        _run_until_done(engine, request_id)
    finally:
        remove_observer()
    shapes = [(BatchShape.of(r.forward.batch), r.wall_s) for r in records if r.forward]
    return [(s.num_prefill_tokens, s.num_prefill_pairs, wall_s)
            for s, wall_s in shapes if s.num_prefill_tokens and not s.num_decode_tokens]  # fmt: skip


def _grid_batch_sizes(engine: LLMEngine) -> list[int]:
    """The grid's batch sizes that fit the engine's limits (small test pools included)."""
    config = engine.config
    blocks_per_seq = -(-(_GRID_PROMPT_TOKENS + _NUM_TOKENS) // config.cache.block_size)
    most = min(config.scheduler.max_num_seqs,
               engine.snapshot().num_device_blocks // (2 * blocks_per_seq),
               config.scheduler.max_num_batched_tokens // _GRID_PROMPT_TOKENS)  # fmt: skip
    return sorted({min(n, most) for n in _GRID_BATCH_SIZES if min(n, most) > 1})


def _time_batch(engine: LLMEngine, num_seqs: int) -> None:
    """`num_seqs` distinct short prompts prefilled together, then decoded together."""
    base = _prompt_ids(engine, _GRID_PROMPT_TOKENS + num_seqs)
    request_ids = [f"superinfer-warmup-batch{num_seqs}-{i}" for i in range(num_seqs)]
    for i, request_id in enumerate(request_ids):
        prompt = base[i : i + _GRID_PROMPT_TOKENS]  # shifted: no shared prefix blocks
        engine.add_request({"prompt_token_ids": prompt}, _greedy(_NUM_TOKENS), request_id)
    pending = set(request_ids)
    for _ in range(_MAX_STEPS):
        pending -= {o.request_id for o in engine.step() if o.finished}
        if not pending:
            return
    raise WarmupError(f"warm-up batch of {num_seqs} did not finish")


def _generate(
    engine: LLMEngine, request_id: str, prompt: list[int], rotate_after: int | None = None
) -> tuple[list[int], float]:
    """Greedy tokens of `prompt` and the mean decode step time; with `rotate_after`, the
    request is rotated to the host tier after that many tokens and must come back."""
    engine.add_request({"prompt_token_ids": prompt}, _greedy(_NUM_TOKENS), request_id)
    num_swap_ins = engine.snapshot().num_swap_ins
    tokens: list[int] = []
    step_times: list[float] = []
    records: list[StepRecord] = []
    remove_observer = engine.add_step_observer(records.append)
    is_rotated = rotate_after is None
    try:
        for _ in range(_MAX_STEPS):
            outputs = [o for o in engine.step() if o.request_id == request_id]
            if not outputs:
                time.sleep(0.001)  # a KV copy in flight
                continue
            step_times.append(records[-1].wall_s)
            (output,) = outputs
            tokens = output.outputs[0].token_ids
            if output.finished:
                break
            if not is_rotated and len(tokens) >= rotate_after:
                if not engine.rotate_out(request_id):
                    raise WarmupError("could not rotate the warm-up request to the host tier")
                is_rotated = True
        else:
            raise WarmupError(f"warm-up request {request_id} did not finish")
    finally:
        remove_observer()
    if rotate_after is not None and engine.snapshot().num_swap_ins != num_swap_ins + 1:
        raise WarmupError("the warm-up request did not come back from the host tier")
    return tokens, _mean(step_times[1:] or step_times)


def _run_until_done(engine: LLMEngine, request_id: str) -> None:
    for _ in range(_MAX_STEPS):
        if any(o.request_id == request_id and o.finished for o in engine.step()):
            return
    raise WarmupError(f"warm-up request {request_id} did not finish")


def _check_clean(engine: LLMEngine) -> None:
    """Every warm-up block released in both tiers once the copies have landed."""
    for _ in range(_MAX_STEPS):
        if not engine.snapshot().num_inflight_transfers:
            break
        _step_or_wait(engine)
    engine.check_invariants()
    report = engine.debug_report()
    if report["num_unfinished"] or report["num_block_tables"]:
        raise WarmupError("warm-up requests left KV blocks behind")


def _step_or_wait(engine: LLMEngine) -> None:
    """One step; a short sleep when it had nothing to do (a KV copy still in flight)."""
    if not engine.step():
        time.sleep(0.001)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
