"""The synchronous engine: tokenize, schedule, move KV, execute, update, detokenize.

step():  the step protocol (core/step.py: complete finished copies -> schedule(now) ->
         submit copies, wait for the swap-ins -> forward + sample -> update_from_output,
         or its pipelined order) -> detokenize, stop strings -> outputs -> step observers

The contract the server, the cluster and the calibration use: `add_request`, `abort` /
`abort_request`, `step`, `has_unfinished_requests` / `has_work`, `snapshot`,
`add_step_observer`, and for warm-up and the debug route `rotate_out`, `check_invariants`,
`debug_report`. Nothing outside `engine/` reads the scheduler, KV manager or runner.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from superinfer.config import CPU_DEVICE_KV_GIB, GPU_MEMORY_UTILIZATION, EngineConfig
from superinfer.core.factory import build_scheduler
from superinfer.core.outputs import ModelOutput, RequestUpdate, SchedulerOutput, TokenLogprobs
from superinfer.core.request import PLACEHOLDER, Request, RequestStatus
from superinfer.core.step import StepBackend, StepLoop
from superinfer.core.step_time import BatchShape, OnlineStepModel
from superinfer.engine.cuda_graphs import batch_sizes
from superinfer.engine.detokenizer import IncrementalDetokenizer
from superinfer.engine.kv_cache import KVCacheTiers, bytes_per_block, freeable_window
from superinfer.engine.load_report import log_loaded
from superinfer.engine.memory_profile import profile_step_bytes
from superinfer.engine.model_runner import ModelRunner
from superinfer.engine.native_memory import limit_malloc_arenas, raise_mmap_threshold
from superinfer.engine.snapshot import (
    EngineSnapshot,
    ForwardRecord,
    StepRecord,
    build_debug_report,
    build_snapshot,
)
from superinfer.engine.transfer import create_transfer_engine
from superinfer.engine.transfer.link_probe import measure_link
from superinfer.model.attention_backend import select_backend
from superinfer.model.dtype import resolve_dtype
from superinfer.model.loader import load_model
from superinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from superinfer.sampling_params import SamplingParams
from superinfer.slo import SLOTargets
from superinfer.structured import GrammarCompiler

logger = logging.getLogger(__name__)

PromptType = str | Mapping[str, Any]  # text, or {"prompt_token_ids": [...]}


@dataclass
class _Tracked:
    request: Request
    prompt: str | None
    detokenizer: IncrementalDetokenizer
    logprobs: list[TokenLogprobs] | None = None  # of the output tokens, when asked for
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    cumulative_logprob: float = 0.0


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but CUDA is not available")
    return torch.device(name)


def metrics_of(request: Request, with_token_times: bool = True) -> RequestMetrics:
    """A request's timestamps and counters (token times only when asked: they grow)."""
    return RequestMetrics(
        arrival_time=request.arrival_time,
        first_scheduled_time=request.first_scheduled_time,
        first_token_time=request.first_token_time,
        last_token_time=request.last_token_time,
        finished_time=request.finished_time,
        num_preemptions=request.num_preemptions,
        num_swap_outs=request.num_swap_outs,
        num_cached_prompt_tokens=request.num_cached_prompt_tokens,
        token_times=list(request.output_token_times) if with_token_times else [],
        slo=request.slo,
    )


def aborted_output(request: Request) -> RequestOutput:
    """The final output of a request aborted from outside the step loop (a token still
    being sampled when it was aborted is left out)."""
    token_ids = [t for t in request.output_token_ids if t != PLACEHOLDER]
    completion = CompletionOutput(0, "", token_ids, "abort")
    metrics = metrics_of(request)
    return RequestOutput(
        request.request_id, None, request.prompt_token_ids, [completion], finished=True,
        metrics=metrics,
    )  # fmt: skip


StepObserver = Callable[[StepRecord], None]


@dataclass
class _Forward:
    batch: SchedulerOutput
    start: float
    end: float | None = None
    host_s: float = 0.0

    def finish(self, _: object = None) -> None:
        self.end = time.perf_counter()


class _TimedRunner(StepBackend):
    """The model runner behind the step protocol, timing each non-empty forward and the
    time a step blocks on forwards (for the step record)."""

    def __init__(self, runner: ModelRunner, clock: Callable[[], float]) -> None:
        self.runner, self.clock = runner, clock
        # the last forward started; in flight until its end is stamped (read by other
        # threads: one reference, replaced whole)
        self.running: _Forward | None = None
        self.begin()

    def begin(self) -> None:
        """A step starts."""
        # log-probabilities of the forward whose tokens this step fills in (by request id)
        self.logprobs: dict[str, TokenLogprobs] = {}
        self.prompt_logprobs: dict[str, list[TokenLogprobs | None]] = {}
        self.blocked_s = 0.0
        self.launched: _Forward | None = None  # the forward this step ran or launched
        self.ended: _Forward | None = None  # the forward whose result this step took

    def execute(self, output: SchedulerOutput) -> tuple[ModelOutput, float]:
        start = time.perf_counter()
        forward = None if output.is_empty else _Forward(output, start)
        self.running = forward
        model_output = self._kept(self.runner.execute(output))
        if forward is not None:
            forward.finish()
            self.launched = self.ended = forward
            self.blocked_s = forward.end - start
        return model_output, self.clock()

    def launch(self, output: SchedulerOutput) -> tuple[Future[ModelOutput], _Forward | None]:
        start = time.perf_counter()
        future = self.runner.launch(output)
        forward = None
        if not output.is_empty:  # its end is stamped on the runner's thread
            forward = self.launched = self.running = _Forward(output, start)
            future.add_done_callback(forward.finish)
        return future, forward

    def result(
        self, output: SchedulerOutput, handle: tuple[Future[ModelOutput], _Forward | None]
    ) -> tuple[ModelOutput, float]:
        future, forward = handle
        start = time.perf_counter()
        model_output = self._kept(future.result())
        self.blocked_s += time.perf_counter() - start
        if forward is not None:
            if forward.end is None:  # the done callback has not run yet
                forward.finish()
            self.ended = forward
        return model_output, self.clock()

    def _kept(self, model_output: ModelOutput) -> ModelOutput:
        self.logprobs.update(model_output.logprobs)
        self.prompt_logprobs.update(model_output.prompt_logprobs)
        return model_output

    def record(self, step_index: int, wall_s: float, num_outputs: int) -> StepRecord:
        if self.launched is not None:
            self.launched.host_s = max(0.0, wall_s - self.blocked_s)
        ended = self.ended
        forward = None
        if ended is not None and ended.end is not None:
            forward = ForwardRecord(ended.batch, ended.end - ended.start, ended.host_s)
        return StepRecord(step_index, wall_s, num_outputs, forward)


class LLMEngine:
    def __init__(self, config: EngineConfig | None = None, clock=time.monotonic) -> None:
        self.config = config = config or EngineConfig()
        self.clock = clock
        self.device = resolve_device(config.model.device)
        pipeline = config.scheduler.pipeline
        self.is_pipelined = self.device.type == "cuda" if pipeline is None else pipeline
        dtype = resolve_dtype(config.model.dtype, config.model.model, self.device)
        self.dtype = dtype
        if self.device.type == "cpu":
            limit_malloc_arenas()
            raise_mmap_threshold()
        loaded = load_model(
            config.model.model, dtype, self.device, quantization=config.model.quantization
        )
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.checkpoint = loaded.checkpoint
        self._check_model_len()
        loaded.model.fit_context(config.scheduler.max_model_len)
        self.attention = select_backend(
            config.model.attention_backend, config.cache.block_size, self.device
        )
        num_device_blocks, num_host_blocks = self._pool_sizes(dtype, loaded.model)
        self.kv_tiers = KVCacheTiers.allocate(
            num_device_blocks, num_host_blocks, self.model_config.num_layers,
            config.cache.block_size, self.model_config.num_kv_heads,
            self.model_config.head_dim, dtype, self.device,
        )  # fmt: skip
        self.transfer = create_transfer_engine(self.kv_tiers, config.cache.transfer_mode)
        # fitted to this engine's own steps (the warm-up's grid, then every step served)
        # when the scheduler prices steps by it (shaped steps, the first-token guard)
        self.step_model = OnlineStepModel()
        self.scheduler = build_scheduler(
            config.scheduler, config.cache, num_device_blocks, num_host_blocks, self.step_model,
            sliding_window=freeable_window(self.model_config),
        )  # fmt: skip
        self.runner = ModelRunner(
            loaded.model, self.kv_tiers, config.cache.block_size, self.device,
            eos_token_ids=self.eos_token_ids, seed=config.model.seed, transfer=self.transfer,
            attention_backend=self.attention,
            graph_batch_sizes=self._graph_batch_sizes(),
            max_blocks_per_seq=-(-config.scheduler.max_model_len // config.cache.block_size),
        )  # fmt: skip
        self.runner.capture_graphs()  # before any request holds a block
        self._timed = _TimedRunner(self.runner, clock)
        self._steps = StepLoop(self.scheduler, self.transfer, self._timed, self.is_pipelined)
        self._step_observers: list[StepObserver] = []
        self._num_steps = 0
        self._tracked: dict[str, _Tracked] = {}
        self._request_ids = itertools.count()
        self._grammars: GrammarCompiler | None = None  # structured output, built when asked
        log_loaded(self)

    # --- setup ----------------------------------------------------------------------------
    def _check_model_len(self) -> None:
        limit = self.model_config.max_position_embeddings
        if self.config.scheduler.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.config.scheduler.max_model_len} exceeds the model's "
                f"limit of {limit} positions"
            )

    def _pool_sizes(self, dtype: torch.dtype, model: torch.nn.Module) -> tuple[int, int]:
        cache = self.config.cache
        mc = self.model_config
        block_bytes = bytes_per_block(
            mc.num_layers, cache.block_size, mc.num_kv_heads, mc.head_dim, dtype
        )
        num_device = cache.num_device_blocks or int(self._device_pool_bytes(model) // block_bytes)
        num_host = cache.num_host_blocks
        if num_host is None:
            num_host = int(cache.host_kv_gib * 2**30 // block_bytes)
        max_blocks_per_seq = -(-self.config.scheduler.max_model_len // cache.block_size)
        if num_device < max_blocks_per_seq:
            raise ValueError(
                f"the device KV pool ({num_device} blocks of {cache.block_size} tokens) cannot "
                f"hold one sequence of max_model_len={self.config.scheduler.max_model_len}; "
                "raise --device-kv-gib or lower --max-model-len"
            )
        return num_device, num_host

    def _graph_batch_sizes(self) -> tuple[int, ...]:
        """Decode batch sizes to capture CUDA graphs for: none on a CPU or when eager."""
        if self.device.type != "cuda" or self.config.model.enforce_eager:
            return ()
        return batch_sizes(self.config.scheduler.max_num_seqs)

    def _device_pool_bytes(self, model: torch.nn.Module) -> float:
        """Bytes of the device KV pool: --kv-cache-memory-bytes, else what
        --gpu-memory-utilization leaves on a GPU, else --device-kv-gib, else on a GPU what
        0.9 of its memory leaves and on a CPU 0.125 GiB."""
        cache = self.config.cache
        if cache.kv_cache_memory_bytes is not None:
            return cache.kv_cache_memory_bytes
        utilization = cache.gpu_memory_utilization
        if utilization is None and cache.device_kv_gib is None and self.device.type == "cuda":
            utilization = GPU_MEMORY_UTILIZATION
        device_gib = CPU_DEVICE_KV_GIB if cache.device_kv_gib is None else cache.device_kv_gib
        if utilization is None:
            return device_gib * 2**30
        if self.device.type != "cuda":
            logger.warning(
                "--gpu-memory-utilization sizes the KV pool from GPU memory and has no effect "
                "on a CPU: the device pool is --device-kv-gib (%.3g GiB)",
                device_gib,
            )
            return device_gib * 2**30
        return gpu_kv_budget(self.device, utilization, self._activation_bytes(model))

    def _activation_bytes(self, model: torch.nn.Module) -> int:
        """Peak of the largest step beyond the weights (activations, logits, sampling),
        measured by running it (`memory_profile.py`)."""
        sched = self.config.scheduler
        num_bytes = profile_step_bytes(
            model, self.attention, self.config.cache.block_size,
            sched.max_num_batched_tokens, min(sched.max_num_batched_tokens, sched.max_num_seqs),
            self.device,
        )  # fmt: skip
        logger.info("profiled the largest step (%d tokens): %.2f GiB of activations",
                    sched.max_num_batched_tokens, num_bytes / 2**30)  # fmt: skip
        return num_bytes

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.model_config.eos_token_ids
        return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)

    # --- requests -------------------------------------------------------------------------
    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer(prompt)["input_ids"]
        if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
            token_ids = [int(t) for t in prompt["prompt_token_ids"]]
            vocab_size = self.model_config.vocab_size
            if any(not 0 <= t < vocab_size for t in token_ids):
                raise ValueError(f"prompt_token_ids must lie in [0, {vocab_size})")
            return prompt.get("prompt"), token_ids
        raise TypeError("a prompt is a string or a dict with 'prompt_token_ids'")

    def apply_chat_template(self, conversation: Sequence[Mapping[str, str]]) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; use generate() with a prompt")
        return self.tokenizer.apply_chat_template(
            list(conversation), tokenize=False, add_generation_prompt=True
        )

    def add_request(
        self,
        prompt: PromptType,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        slo: SLOTargets | None = None,
    ) -> Request:
        """Queue a request; `arrival_time` is on this engine's clock (default: now)."""
        params = params or SamplingParams()
        text, token_ids = self.tokenize(prompt)
        params.update_from_tokenizer(self.tokenizer)
        if params.structured is not None and params.structured.matcher is None:
            self._grammar_compiler().compile(params.structured)  # offline: the server did
        request = Request(
            request_id=request_id if request_id is not None else str(next(self._request_ids)),
            prompt_token_ids=token_ids,
            sampling_params=params,
            arrival_time=self.clock() if arrival_time is None else arrival_time,
            eos_token_ids=self.eos_token_ids,
            priority=priority,
            slo=slo or SLOTargets(),
        )
        self.scheduler.add_request(request)
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, params.stop, params.skip_special_tokens,
            params.include_stop_str_in_output,
        )  # fmt: skip
        tracked = self._tracked[request.request_id] = _Tracked(request, text, detokenizer)
        if params.logprobs is not None:
            tracked.logprobs = []
        self.runner.sampler.add_request(request.request_id, params, token_ids)
        return request

    def _grammar_compiler(self) -> GrammarCompiler:
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size)
        return self._grammars

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id, self.clock())
        self._tracked.pop(request_id, None)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Abort a request (its blocks are freed in both tiers); returns its final output,
        finish_reason "abort", or None if it was not unfinished."""
        request = self.scheduler.requests.get(request_id)
        self.abort_request(request_id)
        return aborted_output(request) if request is not None else None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests or self._steps.inflight is not None

    def has_work(self) -> bool:
        """Unfinished requests, or KV copies whose landing a step must record."""
        return self.has_unfinished_requests() or self.scheduler.kv.num_inflight_transfers > 0

    # --- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step; returns the outputs of requests that advanced."""
        start = time.perf_counter()
        self._timed.begin()
        outputs = self._processed(self._steps.step(self.clock()))
        self._observe(time.perf_counter() - start, len(outputs))
        return outputs

    def _observe(self, wall_s: float, num_outputs: int) -> None:
        self._num_steps += 1
        record = self._timed.record(self._num_steps, wall_s, num_outputs)
        if record.forward is not None and self.config.scheduler.is_step_model_used:
            self.step_model.observe(BatchShape.of(record.forward.batch), wall_s)
        for observer in tuple(self._step_observers):
            observer(record)

    def add_step_observer(self, observer: StepObserver) -> Callable[[], None]:
        """Call `observer(record)` after every step (on the engine's thread); returns the
        function that removes it. An observer's error propagates from `step`."""
        self._step_observers.append(observer)
        return lambda: self._step_observers.remove(observer)

    # --- state, for the server, warm-up and tests ----------------------------------------
    def forward_in_flight(self) -> BatchShape | None:
        """The shape of the forward running now; None between forwards. Safe to call from
        another thread than the engine's."""
        forward = self._timed.running
        return None if forward is None or forward.end is not None else BatchShape.of(forward.batch)

    def num_cached_tokens(self, token_ids: list[int]) -> int:
        """Tokens of a prompt the device's prefix cache holds now (admission's estimate).
        Safe to call from another thread than the engine's: it only reads."""
        return self.scheduler.kv.num_cached_tokens(token_ids)

    def snapshot(self) -> EngineSnapshot:
        """The load picture now, as plain data (step time and the served token counts are
        the async engine's to add)."""
        return build_snapshot(self.scheduler, self.transfer.stats)

    def anchor_step_model(self) -> dict[str, Any]:
        """Keep the steps timed so far for good in the step-time model the scheduler shapes
        steps by (the end of the warm-up's grid of batch shapes); returns its fit."""
        self.step_model.keep_as_anchors()
        return self.step_model.describe()

    def rotate_out(self, request_id: str) -> bool:
        """Rotate a running request to the host tier now (warm-up, tests); False if it is
        not running or the host tier has no room."""
        return self.scheduler.rotate_out(request_id)

    def measure_kv_link(self, num_blocks: int = 256, repeats: int = 3) -> dict[str, Any]:
        """Time KV copies between the tiers (calibration): GB/s per direction, per-copy
        cost, and whether the two directions overlap. Only while no request runs."""
        if self.has_work():
            raise RuntimeError("measure_kv_link needs an idle engine")
        return measure_link(self.transfer, self.kv_tiers, num_blocks, repeats)

    def check_invariants(self) -> None:
        """Raise KVInvariantError if the queues, block tables or pools disagree."""
        self.scheduler.check_invariants()

    def debug_report(self) -> dict[str, Any]:
        """KV ownership per tier and per class, queues and the invariant check (the debug
        route; call it between steps, on the engine's thread)."""
        return build_debug_report(self.scheduler)

    def _processed(self, updates: list[RequestUpdate]) -> list[RequestOutput]:
        if self.config.check_invariants:
            self.scheduler.check_invariants()
        return [self._process(update) for update in updates]

    def _process(self, update: RequestUpdate) -> RequestOutput:
        tracked = self._tracked[update.request_id]
        request = tracked.request
        detokenizer = tracked.detokenizer
        self._add_logprobs(tracked, update.request_id)
        new_text = detokenizer.add_tokens(update.new_token_ids)
        finish_reason, stop_reason = update.finish_reason, update.stop_reason
        if detokenizer.stop_string is not None and finish_reason is None:
            self.scheduler.finish_request(
                request.request_id, RequestStatus.FINISHED_STOPPED, self.clock()
            )
            finish_reason, stop_reason = "stop", detokenizer.stop_string
        if finish_reason is not None:
            del self._tracked[request.request_id]
        return self._request_output(
            tracked, new_text, update.new_token_ids, finish_reason, stop_reason
        )

    def _add_logprobs(self, tracked: _Tracked, request_id: str) -> None:
        prompt_logprobs = self._timed.prompt_logprobs.pop(request_id, None)
        if prompt_logprobs is not None:
            tracked.prompt_logprobs = prompt_logprobs
        entry = self._timed.logprobs.pop(request_id, None)
        if entry is not None and tracked.logprobs is not None:
            tracked.logprobs.append(entry)
            tracked.cumulative_logprob += entry.logprob

    @staticmethod
    def _request_output(
        tracked: _Tracked,
        new_text: str,
        new_token_ids: list[int],
        finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> RequestOutput:
        request = tracked.request
        completion = CompletionOutput(
            0,
            tracked.detokenizer.text,
            list(tracked.detokenizer.token_ids),
            finish_reason,
            stop_reason,
        )  # the detokenizer's ids: the request's own may end in the next step's placeholder
        if tracked.logprobs is not None:
            completion.logprobs = list(tracked.logprobs)
            completion.cumulative_logprob = tracked.cumulative_logprob
        metrics = metrics_of(request, with_token_times=finish_reason is not None)
        return RequestOutput(
            request.request_id, tracked.prompt, request.prompt_token_ids, [completion],
            finished=finish_reason is not None, metrics=metrics, new_text=new_text,
            new_token_ids=new_token_ids, prompt_logprobs=tracked.prompt_logprobs,
        )  # fmt: skip

    def close(self) -> None:
        """Finish the step in flight and stop the worker threads."""
        self._steps.abandon()
        self.runner.close()
        self.transfer.close()


def gpu_kv_budget(device: torch.device, utilization: float, activation_bytes: int) -> int:
    """vLLM's --gpu-memory-utilization: of `utilization` x the GPU's memory, what is not
    yet in use (weights, other processes) nor needed for activations."""
    free, total = torch.cuda.mem_get_info(device)
    budget = int(utilization * total) - (total - free) - activation_bytes
    if budget <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {utilization} leaves no memory for the KV cache: "
            f"{(total - free) / 2**30:.2f} GiB of {total / 2**30:.2f} GiB are in use and "
            f"activations need about {activation_bytes / 2**30:.2f} GiB; raise it"
        )
    return budget
