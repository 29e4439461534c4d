"""Runs one scheduled batch through the model and samples. It sees only the batch: no
queues, policies or SLOs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from superinfer.core.outputs import ModelOutput, SchedulerOutput
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.sampler import Sampler
from superinfer.model.attention import AttentionMetadata, SeqEntry


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
    ) -> None:
        self.model = model
        self.kv = kv
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler(device, eos_token_ids, seed)
        self.transfer = transfer  # told when a forward was launched (orders D2H copies)

    @torch.inference_mode()
    def execute(self, output: SchedulerOutput) -> ModelOutput:
        self.sampler.forget(output.finished_request_ids)
        if output.is_empty:
            return ModelOutput({})
        seqs = output.sequences
        entries = [SeqEntry(s.num_query_tokens, s.num_context_tokens, s.block_table) for s in seqs]
        meta = AttentionMetadata.build(entries, self.block_size, self.device)
        token_ids = [t for s in seqs for t in s.token_ids]
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        hidden = self.model(input_ids, meta.positions, self.kv.device, meta)
        if self.transfer is not None:
            self.transfer.record_compute()
        sampling = [i for i, s in enumerate(seqs) if s.is_sampling]
        if not sampling:
            return ModelOutput({})
        rows = meta.logits_indices[sampling] if len(sampling) < len(seqs) else meta.logits_indices
        logits = self.model.compute_logits(hidden[rows])
        sampling_seqs = [seqs[i] for i in sampling]
        tokens = self.sampler(logits, sampling_seqs)
        return ModelOutput({s.request_id: t for s, t in zip(sampling_seqs, tokens)})
