"""Batched sampling with per-request parameters: greedy, temperature, top-k, top-p, seed.

One pass over the whole batch; the only per-request loop draws the noise of requests
that carry their own seed, so that their samples repeat whatever else is in the batch.
Sampling uses the exponential-race form: argmax(p / q) with q ~ Exp(1) draws from p.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from superinfer.core.outputs import ScheduledSequence


class Sampler:
    def __init__(self, device: torch.device, eos_token_ids: Sequence[int] = (), seed: int = 0) -> None:
        self.device = device
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop per-request state of finished requests."""
        for request_id in request_ids:
            self._request_generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> list[int]:
        """Sample one token per row of `logits` (S, vocab), float32."""
        self._suppress_eos_before_min_tokens(logits, seqs)
        greedy = logits.argmax(dim=-1)
        if all(seq.sampling_params.is_greedy for seq in seqs):
            return greedy.tolist()
        probs = self._filtered_probs(logits, seqs)
        noise = self._exponential_noise(probs.shape, seqs)
        sampled = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([s.sampling_params.is_greedy for s in seqs], device=logits.device)
        return torch.where(is_greedy, greedy, sampled).tolist()

    def _suppress_eos_before_min_tokens(
        self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]
    ) -> None:
        """Before `min_tokens` outputs, no token that would stop the request is sampled."""
        for row, seq in enumerate(seqs):
            params = seq.sampling_params
            if seq.num_output_tokens < params.min_tokens:
                logits[row, self.eos_token_ids + params.stop_token_ids] = float("-inf")

    def _filtered_probs(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> torch.Tensor:
        params = [seq.sampling_params for seq in seqs]
        temperature = torch.tensor(
            [p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device
        )
        logits = logits / temperature[:, None]
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            logits = self._apply_top_k_top_p(logits, top_k, top_p)
        return logits.softmax(dim=-1)

    @staticmethod
    def _apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
        vocab = logits.shape[-1]
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (S, V)
        k = torch.tensor([k if k > 0 else vocab for k in top_k], device=logits.device)
        ranks = torch.arange(vocab, device=logits.device)[None, :]
        mask = ranks >= k[:, None]
        probs = sorted_logits.masked_fill(mask, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        p = torch.tensor(top_p, device=logits.device)
        mask |= mass_before >= p[:, None]
        mask[:, 0] = False  # always keep the best token
        sorted_logits = sorted_logits.masked_fill(mask, float("-inf"))
        return torch.empty_like(logits).scatter_(-1, order, sorted_logits)

    def _exponential_noise(self, shape: torch.Size, seqs: Sequence[ScheduledSequence]) -> torch.Tensor:
        noise = torch.empty(shape, device=self.device).exponential_(generator=self.generator)
        for row, seq in enumerate(seqs):
            seed = seq.sampling_params.seed
            if seed is not None:
                generator = self._request_generators.get(seq.request_id)
                if generator is None:
                    generator = torch.Generator(device=self.device).manual_seed(seed)
                    self._request_generators[seq.request_id] = generator
                noise[row].exponential_(generator=generator)
        return noise
