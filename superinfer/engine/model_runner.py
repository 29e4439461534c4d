"""Runs one scheduled batch through the model and samples. It sees only the batch: no
queues, policies or SLOs.

`execute` runs a step to the end. `launch` starts one and returns a future, so the engine
can schedule the next step meanwhile: on a CPU the forward runs on a worker thread and
sets a fence when done (device->host copies of the blocks it wrote wait for the fence);
on CUDA the forward is queued on the stream from the calling thread, an event is recorded
behind it, and only sampling's wait for the result happens on the worker thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from superinfer.core.outputs import ModelOutput, ScheduledSequence, SchedulerOutput
from superinfer.engine.cuda_graphs import DecodeGraphs
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.sampler import Sampler
from superinfer.model.attention import SeqEntry
from superinfer.model.attention_backend import AttentionBackend, TritonBackend, select_backend

logger = logging.getLogger(__name__)
NO_GRAPHS = {"num_graphs": 0, "capture_s": 0.0, "graph_memory_bytes": 0}


class ModelRunner:
    def __init__(
        self,
        model: nn.Module,
        kv: KVCacheTiers,
        block_size: int,
        device: torch.device,
        eos_token_ids: Sequence[int] = (),
        seed: int = 0,
        transfer=None,
        attention_backend: str | AttentionBackend = "auto",
        graph_batch_sizes: Sequence[int] = (),
        max_blocks_per_seq: int = 0,
    ) -> None:
        self.model = model
        self.kv = kv
        self.block_size = block_size
        self.device = device
        if isinstance(attention_backend, str):
            attention_backend = select_backend(attention_backend, block_size, device)
        self.attention = attention_backend
        # decode graphs: captured by `capture_graphs` (CUDA and the Triton backend only)
        self.graph_batch_sizes, self.max_blocks_per_seq = (
            tuple(graph_batch_sizes),
            max_blocks_per_seq,
        )
        self.graphs: DecodeGraphs | None = None
        self.sampler = Sampler(device, eos_token_ids, seed)
        self.transfer = transfer  # told when a forward is launched (orders D2H copies)
        self._worker: ThreadPoolExecutor | None = None

    def capture_graphs(self) -> dict[str, float]:
        """Capture the decode graphs (before any request holds a KV block: capture writes
        into block 0). Returns what was captured; nothing where graphs cannot run (not CUDA,
        another backend, no sizes), with the reason logged; a failed capture leaves every
        step eager."""
        reason = self._graphs_unavailable_reason()
        if reason is not None:
            logger.info("CUDA graphs off: %s", reason)
            return dict(NO_GRAPHS)
        graphs = DecodeGraphs(self.model, self.kv.device, self.attention, self.graph_batch_sizes,
                              self.max_blocks_per_seq)  # fmt: skip
        try:
            report = graphs.capture()
        except Exception as error:  # noqa: BLE001 - e.g. a host sync in a forward: stay eager
            logger.warning("CUDA graph capture failed, every step runs eagerly: %s", error)
            return dict(NO_GRAPHS)
        self.graphs = graphs
        logger.info(
            "CUDA graphs: %d decode batch sizes up to %d captured in %.1f s, %.0f MiB",
            report["num_graphs"], graphs.sizes[-1], report["capture_s"],
            report["graph_memory_bytes"] / 2**20,
        )  # fmt: skip
        return report

    def _graphs_unavailable_reason(self) -> str | None:
        if not self.graph_batch_sizes:
            return "no batch size to capture (--enforce-eager, or not on CUDA)"
        if self.device.type != "cuda":
            return f"graphs are CUDA's, the model runs on {self.device}"
        if not isinstance(self.attention, TritonBackend):
            return f"decode graphs need the triton attention backend, not {self.attention.name}"
        if self.max_blocks_per_seq < 1:
            return "max_blocks_per_seq is not set"
        return None

    def execute(self, output: SchedulerOutput) -> ModelOutput:
        """Run the step and return its sampled tokens."""
        with torch.inference_mode():
            self.sampler.forget(output.finished_request_ids)
            if output.is_empty:
                return ModelOutput({})
            hidden, meta = self._forward(output.sequences)
            if self.transfer is not None:
                self.transfer.record_compute()
            return self._sample(output.sequences, hidden, meta)

    def launch(self, output: SchedulerOutput) -> Future[ModelOutput]:
        """Start the step; the future holds its sampled tokens."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="superinfer-runner")
        if self.device.type == "cuda":
            with torch.inference_mode():
                hidden, meta = (
                    self._forward(output.sequences) if not output.is_empty else (None, None)
                )
            if self.transfer is not None:
                self.transfer.record_compute()
            return self._worker.submit(self._finish, output, hidden, meta)
        fence = threading.Event()
        if self.transfer is not None:
            self.transfer.record_compute(fence)
        return self._worker.submit(self._run_fenced, output, fence)

    def _run_fenced(self, output: SchedulerOutput, fence: threading.Event) -> ModelOutput:
        try:
            with torch.inference_mode():
                hidden, meta = (
                    self._forward(output.sequences) if not output.is_empty else (None, None)
                )
        finally:
            fence.set()  # also on failure, so queued copies do not hang
        return self._finish(output, hidden, meta)

    def _finish(self, output: SchedulerOutput, hidden, meta) -> ModelOutput:
        with torch.inference_mode():
            self.sampler.forget(output.finished_request_ids)
            if hidden is None:
                return ModelOutput({})
            return self._sample(output.sequences, hidden, meta)

    def _forward(self, seqs: list[ScheduledSequence]) -> tuple[torch.Tensor, Any]:
        entries = [SeqEntry(s.num_query_tokens, s.num_context_tokens, s.block_table) for s in seqs]
        token_ids = [t for s in seqs for t in s.token_ids]
        if self.graphs is not None and self.graphs.can_run(entries):
            return self.graphs.run(entries, token_ids)
        meta = self.attention.build(entries)
        input_ids = torch.tensor(token_ids, dtype=torch.long).to(self.device, non_blocking=True)
        return self.model(input_ids, meta.positions, self.kv.device, meta), meta

    def _sample(
        self, seqs: list[ScheduledSequence], hidden: torch.Tensor, meta: Any
    ) -> ModelOutput:
        self._score_prompts(seqs, hidden)
        sampling = [i for i, s in enumerate(seqs) if s.is_sampling]
        if not sampling:
            return ModelOutput({})
        rows = meta.logits_indices if len(sampling) == len(seqs) else meta.logits_indices[sampling]
        logits = self.model.compute_logits(hidden[rows])
        sampling_seqs = [seqs[i] for i in sampling]
        out = self.sampler.sample(logits, sampling_seqs)
        tokens = {s.request_id: t for s, t in zip(sampling_seqs, out.token_ids)}
        return ModelOutput(tokens, out.logprobs, out.prompt_logprobs)

    def _score_prompts(self, seqs: list[ScheduledSequence], hidden: torch.Tensor) -> None:
        """Prompt log-probabilities (echo) of the requests that asked: the logits of every
        query row of theirs, not only the last."""
        start = 0
        for seq in seqs:
            if seq.sampling_params.prompt_logprobs is not None:
                rows = hidden[start : start + seq.num_query_tokens]
                self.sampler.record_prompt_logprobs(
                    seq, lambda a, b, rows=rows: self.model.compute_logits(rows[a:b])
                )
            start += seq.num_query_tokens

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None
