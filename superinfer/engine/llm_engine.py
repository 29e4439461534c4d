"""The synchronous engine: tokenize, schedule, move KV, execute, update, detokenize.

step():  complete finished copies -> schedule(now) -> submit copies, wait for the
         swap-ins -> forward + sample -> update_from_output(now) -> outputs
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from superinfer.config import EngineConfig
from superinfer.core.kv.manager import TwoTierKVManager
from superinfer.core.outputs import ModelOutput, RequestUpdate, SchedulerOutput
from superinfer.core.policies import create_policy
from superinfer.core.request import Request, RequestStatus
from superinfer.core.scheduler import Scheduler
from superinfer.engine.detokenizer import IncrementalDetokenizer
from superinfer.engine.kv_cache import KVCacheTiers, bytes_per_block
from superinfer.engine.load_report import log_loaded
from superinfer.engine.model_runner import ModelRunner
from superinfer.engine.native_memory import limit_malloc_arenas
from superinfer.engine.transfer import create_transfer_engine
from superinfer.model.dtype import resolve_dtype
from superinfer.model.loader import load_model
from superinfer.outputs import CompletionOutput, RequestMetrics, RequestOutput
from superinfer.sampling_params import SamplingParams
from superinfer.slo import SLOTargets

logger = logging.getLogger(__name__)

PromptType = str | Mapping[str, Any]  # text, or {"prompt_token_ids": [...]}



@dataclass
class _Tracked:
    request: Request
    prompt: str | None
    detokenizer: IncrementalDetokenizer


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
        loaded = load_model(config.model.model, dtype, self.device)
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.checkpoint = loaded.checkpoint
        self._check_model_len()
        num_device_blocks, num_host_blocks = self._pool_sizes(dtype)
        self.kv_tiers = KVCacheTiers.allocate(
            num_device_blocks, num_host_blocks, self.model_config.num_layers,
            config.cache.block_size, self.model_config.num_kv_heads,
            self.model_config.head_dim, dtype, self.device,
        )  # fmt: skip
        self.transfer = create_transfer_engine(self.kv_tiers, config.cache.transfer_mode)
        kv = TwoTierKVManager(
            num_device_blocks, num_host_blocks, config.cache.block_size,
            config.cache.enable_prefix_caching,
        )  # fmt: skip
        policy = create_policy(config.scheduler.policy, config.scheduler)
        self.scheduler = Scheduler(config.scheduler, kv, policy)
        self.runner = ModelRunner(
            loaded.model, self.kv_tiers, config.cache.block_size, self.device,
            eos_token_ids=self.eos_token_ids, seed=config.model.seed, transfer=self.transfer,
        )  # fmt: skip
        self._tracked: dict[str, _Tracked] = {}
        self._inflight: tuple[SchedulerOutput, Future[ModelOutput]] | None = None
        self._request_ids = itertools.count()
        log_loaded(self)

    # --- setup ----------------------------------------------------------------------------
    def _check_model_len(self) -> None:
        limit = self.model_config.max_position_embeddings
        if self.config.scheduler.max_model_len > limit:
            raise ValueError(
                f"max_model_len={self.config.scheduler.max_model_len} exceeds the model's "
                f"limit of {limit} positions"
            )

    def _pool_sizes(self, dtype: torch.dtype) -> tuple[int, int]:
        cache = self.config.cache
        mc = self.model_config
        block_bytes = bytes_per_block(
            mc.num_layers, cache.block_size, mc.num_kv_heads, mc.head_dim, dtype
        )
        num_device = cache.num_device_blocks or int(self._device_pool_bytes() // block_bytes)
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

    def _device_pool_bytes(self) -> float:
        """Bytes of the device KV pool: --kv-cache-memory-bytes, else what
        --gpu-memory-utilization leaves on a GPU, else --device-kv-gib."""
        cache = self.config.cache
        if cache.kv_cache_memory_bytes is not None:
            return cache.kv_cache_memory_bytes
        if cache.gpu_memory_utilization is None:
            return cache.device_kv_gib * 2**30
        if self.device.type != "cuda":
            logger.warning(
                "--gpu-memory-utilization sizes the KV pool from GPU memory and has no effect "
                "on a CPU: the device pool is --device-kv-gib (%.3g GiB)", cache.device_kv_gib
            )
            return cache.device_kv_gib * 2**30
        return gpu_kv_budget(self.device, cache.gpu_memory_utilization, self._activation_bytes())

    def _activation_bytes(self) -> int:
        """Activation peak of the largest step (hidden states, MLP, logits), doubled for the
        allocator's slack: an estimate until the GPU path profiles a real forward."""
        mc, sched = self.model_config, self.config.scheduler
        num_tokens = sched.max_num_batched_tokens
        per_token = (4 * mc.hidden_size + 3 * mc.intermediate_size) * self.dtype.itemsize
        logits = min(num_tokens, sched.max_num_seqs) * mc.vocab_size * 4
        return 2 * (num_tokens * per_token + logits)

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
            self.tokenizer, params.stop, params.skip_special_tokens
        )
        self._tracked[request.request_id] = _Tracked(request, text, detokenizer)
        return request

    def abort_request(self, request_id: str) -> None:
        self.scheduler.abort_request(request_id, self.clock())
        self._tracked.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests or self._inflight is not None

    # --- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduler step; returns the outputs of requests that advanced."""
        if self.is_pipelined:
            return self._step_pipelined()
        self.scheduler.complete_transfers(self.transfer.poll_finished())
        output = self.scheduler.schedule(self.clock())
        self._move_kv(output)
        model_output = self.runner.execute(output)
        updates = self.scheduler.update_from_output(output, model_output, self.clock())
        return self._processed(updates)

    def _step_pipelined(self) -> list[RequestOutput]:
        """Schedule step k+1 and start its copies while step k computes, then finish step k
        and launch step k+1."""
        self.scheduler.complete_transfers(self.transfer.poll_finished())
        output = self.scheduler.schedule(self.clock())
        for spec in output.transfers:
            self.transfer.submit(spec)
        updates = self._finish_inflight()
        self.scheduler.prune(output)
        if output.swap_in_transfer_ids:
            self.transfer.wait(output.swap_in_transfer_ids)
        if output.sequences or output.finished_request_ids:
            self._inflight = (output, self.runner.launch(output))
            self.scheduler.advance(output)
        return self._processed(updates)

    def _finish_inflight(self) -> list[RequestUpdate]:
        if self._inflight is None:
            return []
        output, future = self._inflight
        self._inflight = None
        return self.scheduler.fill(output, future.result(), self.clock())

    def _move_kv(self, output: SchedulerOutput) -> None:
        for spec in output.transfers:
            self.transfer.submit(spec)
        if output.swap_in_transfer_ids:
            self.transfer.wait(output.swap_in_transfer_ids)

    def _processed(self, updates: list[RequestUpdate]) -> list[RequestOutput]:
        if self.config.check_invariants:
            self.scheduler.check_invariants()
        return [self._process(update) for update in updates]

    def _process(self, update: RequestUpdate) -> RequestOutput:
        tracked = self._tracked[update.request_id]
        request = tracked.request
        detokenizer = tracked.detokenizer
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
        metrics = metrics_of(request, with_token_times=finish_reason is not None)
        return RequestOutput(
            request.request_id, tracked.prompt, request.prompt_token_ids, [completion],
            finished=finish_reason is not None, metrics=metrics, new_text=new_text,
            new_token_ids=new_token_ids,
        )  # fmt: skip

    def close(self) -> None:
        """Finish the step in flight and stop the worker threads."""
        if self._inflight is not None:
            self._inflight[1].result()
            self._inflight = None
            self.scheduler.kv.end_step_fence()
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
