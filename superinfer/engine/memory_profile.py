"""What the largest step needs on a GPU beyond the weights: measured by running it, as
vLLM's profile run does, so `--gpu-memory-utilization` gives the KV pool the rest."""

from __future__ import annotations

import torch
from torch import nn

from superinfer.model.attention import SeqEntry
from superinfer.model.attention_backend import AttentionBackend

SAMPLER_COPIES = 3  # the sampler's float32 passes over the logits (penalties, softmax, noise)


def profile_step_bytes(
    model: nn.Module,
    backend: AttentionBackend,
    block_size: int,
    num_tokens: int,
    num_seqs: int,
    device: torch.device,
) -> int:
    """Peak bytes a forward of `num_tokens` prompt tokens (the step budget) allocates on
    `device`, its own scratch KV cache excluded, plus the logits and the sampler's copies
    for `num_seqs` sampled rows."""
    config = model.config
    num_blocks = -(-num_tokens // block_size)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device)
    cache = torch.zeros(num_blocks, config.num_layers, 2, block_size, config.num_kv_heads,
                        config.head_dim, dtype=model.dtype, device=device)  # fmt: skip
    meta = backend.build([SeqEntry(num_tokens, 0, list(range(num_blocks)))])
    with torch.inference_mode():
        input_ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
        hidden = model(input_ids, meta.positions, cache, meta)
        logits = model.compute_logits(hidden[:num_seqs])
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - held - cache.numel() * cache.element_size()
    sampler = SAMPLER_COPIES * logits.numel() * logits.element_size()
    del cache, hidden, logits
    torch.cuda.empty_cache()
    return peak + sampler
