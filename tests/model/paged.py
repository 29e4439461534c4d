"""A minimal stand-in for the engine: drives a model over a paged KV cache whose block
tables hold shuffled, non-consecutive block ids."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence

import torch
from torch import Tensor

from superinfer.model.attention import AttentionMetadata, SeqEntry
from superinfer.model.attention_backend import BACKENDS
from superinfer.model.llama import LlamaForCausalLM


class PagedRun:
    def __init__(
        self,
        model: LlamaForCausalLM,
        num_blocks: int = 64,
        block_size: int = 8,
        seed: int = 0,
        backend: str | None = None,  # an attention backend's name; None: the default path
    ) -> None:
        c = model.config
        self.model, self.block_size = model, block_size
        self.device = model.model.norm.weight.device
        self.kv_cache = torch.zeros(
            num_blocks,
            c.num_layers,
            2,
            block_size,
            c.num_kv_heads,
            c.head_dim,
            dtype=model.dtype,
            device=self.device,
        )
        self.backend = None if backend is None else BACKENDS[backend](block_size, self.device)
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.tokens: list[list[int]] = []
        self.num_cached: list[int] = []
        self.block_tables: list[list[int]] = []

    def add(self, token_ids: Sequence[int]) -> int:
        self.tokens.append(list(token_ids))
        self.num_cached.append(0)
        self.block_tables.append([])
        return len(self.tokens) - 1

    def clone(self) -> PagedRun:
        twin = copy.copy(self)
        twin.kv_cache = self.kv_cache.clone()
        for name in ("free_blocks", "tokens", "num_cached", "block_tables"):
            setattr(twin, name, copy.deepcopy(getattr(self, name)))
        return twin

    def entry(self, seq: int, num_query_tokens: int) -> SeqEntry:
        num_tokens = self.num_cached[seq] + num_query_tokens
        table = self.block_tables[seq]
        while len(table) * self.block_size < num_tokens:
            table.append(self.free_blocks.pop())
        return SeqEntry(num_query_tokens, self.num_cached[seq], list(table))

    def step(self, work: Sequence[tuple[int, int]], all_logits: bool = False) -> Tensor:
        """Run (seq, num_query_tokens) pairs packed in one forward. Returns float32 logits of
        each sequence's last token (S, V), or of every token (T, V) if `all_logits`."""
        entries = [self.entry(seq, n) for seq, n in work]
        input_ids = [
            t
            for (seq, n) in work
            for t in self.tokens[seq][self.num_cached[seq] : self.num_cached[seq] + n]
        ]
        if self.backend is None:
            meta = AttentionMetadata.build(entries, self.block_size, self.device)
        else:
            meta = self.backend.build(entries)
        with torch.inference_mode():
            input_ids = torch.tensor(input_ids, device=self.device)
            hidden = self.model(input_ids, meta.positions, self.kv_cache, meta)
            rows = hidden if all_logits else hidden[meta.logits_indices]
            logits = self.model.compute_logits(rows)
        for seq, n in work:
            self.num_cached[seq] += n
        return logits.cpu()

    def greedy(self, prompt: Sequence[int], num_new_tokens: int) -> list[int]:
        """Prefill `prompt` in one step, then decode greedily one token per step."""
        seq = self.add(prompt)
        out, logits = [], self.step([(seq, len(prompt))])
        for _ in range(num_new_tokens):
            out.append(int(logits[0].argmax()))
            self.tokens[seq].append(out[-1])
            logits = self.step([(seq, 1)])
        return out


def greedy_logits(
    model: LlamaForCausalLM, prompt: Sequence[int], num_tokens: int, block_size: int = 4
) -> tuple[list[int], torch.Tensor]:
    """`PagedRun.greedy`'s tokens, and the logits (num_tokens, vocab) each was taken from."""
    run = PagedRun(model, 64, block_size)
    seq = run.add(prompt)
    logits, tokens, seen = run.step([(seq, len(prompt))])[0], [], []
    for _ in range(num_tokens):
        seen.append(logits)
        tokens.append(int(logits.argmax()))
        run.tokens[seq].append(tokens[-1])
        logits = run.step([(seq, 1)])[0]
    return tokens, torch.stack(seen)
