"""Batched sampling with per-request parameters, in vLLM's order:

    logits -> grammar bitmask (structured output; vLLM applies it before its sampler)
      --(log-probabilities to report, vLLM's default raw mode)
      -> allowed_token_ids, bad_words, min_tokens, logit_bias
      -> repetition / frequency / presence penalties           (greedy: argmax here)
      -> temperature, min_p, top-k, top-p -> inverse CDF       (sampled)

Every stage is one pass over the rows that use it (a tensor op over the batch, index
lists built from the requests' parameters); nothing loops over the vocabulary. The only
per-request torch work draws the number of requests that carry their own seed, so that
their samples repeat whatever else is in the batch. A row is sampled by inverting its
cumulative distribution at one uniform number: one random number a row, not one a token
(vLLM's exponential race, argmax(p / q) with q ~ Exp(1) for every token, drew 1.5 million
exponentials a step at batch 32 on this model: 31-38 ms of CPU time, longer than the forward).

The sampler keeps the tokens of requests that need them (penalties, multi-token bad
words, prompt log-probabilities), registered by `add_request` and dropped by `forget`:
it sees every token it samples, so the history needs nothing from the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from superinfer.core.outputs import ScheduledSequence, TokenLogprobs
from superinfer.model.cpu_argmax import argmax
from superinfer.sampling_params import SamplingParams

_NEG_INF = float("-inf")
_PROMPT_LOGPROBS_ROWS = 256  # logits rows per pass when scoring a prompt (bounds memory)
_TOP_CANDIDATES = 1024  # top-k / top-p rank this many best tokens, unless a row needs more
_CDF_BLOCK = 64  # tokens per block of the two-level inverse CDF

LogitsOf = Callable[[int, int], torch.Tensor]  # (start, end) query rows -> (end-start, V)


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[TokenLogprobs | None]] = field(default_factory=dict)


@dataclass
class _History:
    """What the sampler keeps of one request that needs it."""

    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    is_prompt_logprobs_sent: bool = False
    prompt_mask: torch.Tensor | None = None  # (V,) bool: tokens of the prompt


class Sampler:
    def __init__(
        self, device: torch.device, eos_token_ids: Sequence[int] = (), seed: int = 0
    ) -> None:
        self.device = device
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._request_generators: dict[str, torch.Generator] = {}
        self._histories: dict[str, _History] = {}
        self._matchers: dict[str, Any] = {}  # structured output: request id -> matcher

    # --- per-request state ----------------------------------------------------------------
    def add_request(
        self, request_id: str, params: SamplingParams, prompt_token_ids: Sequence[int]
    ) -> None:
        """A request enters the engine: keep its tokens if its parameters need them."""
        if params.needs_history:
            history = _History(list(prompt_token_ids))
            if params.prompt_logprobs is not None:
                history.prompt_logprobs = [None] * len(prompt_token_ids)
            self._histories[request_id] = history
        if params.structured is not None:
            if params.structured.matcher is None:
                raise ValueError("the structured output constraint is not compiled")
            self._matchers[request_id] = params.structured.matcher

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop per-request state of finished requests."""
        for request_id in request_ids:
            self._request_generators.pop(request_id, None)
            self._histories.pop(request_id, None)
            self._matchers.pop(request_id, None)

    # --- one step -------------------------------------------------------------------------
    def __call__(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> list[int]:
        """Sample one token per row of `logits` (S, vocab), float32."""
        return self.sample(logits, seqs).token_ids

    def sample(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> SamplerOutput:
        """Sample one token per row of `logits` (S, vocab), float32 (changed in place), with
        the log-probabilities the requests asked for."""
        matchers = [self._matchers.get(s.request_id) for s in seqs] if self._matchers else []
        if any(m is not None for m in matchers):
            _apply_bitmask(logits, matchers)
        wanted = [i for i, s in enumerate(seqs) if s.sampling_params.logprobs is not None]
        raw = logits[wanted].log_softmax(dim=-1) if wanted else None  # before any processing
        self._process(logits, seqs)
        tokens = self._pick(logits, seqs)
        token_ids = tokens.tolist()
        output = SamplerOutput(token_ids)
        if raw is not None:
            ks = [seqs[i].sampling_params.logprobs or 0 for i in wanted]
            entries = _entries(raw, tokens[wanted], ks)
            output.logprobs = {seqs[i].request_id: e for i, e in zip(wanted, entries)}
        for matcher, token in zip(matchers, token_ids):
            if matcher is not None:
                matcher.consume_token(token)
        for seq, token in zip(seqs, token_ids):
            history = self._histories.get(seq.request_id)
            if history is None:
                continue
            history.output_token_ids.append(token)
            if history.prompt_logprobs is not None and not history.is_prompt_logprobs_sent:
                output.prompt_logprobs[seq.request_id] = history.prompt_logprobs
                history.is_prompt_logprobs_sent = True
        return output

    def record_prompt_logprobs(self, seq: ScheduledSequence, logits_of: LogitsOf) -> None:
        """Score the prompt tokens this step's query rows predict (`logits_of(start, end)`:
        the logits of query rows start..end-1): row j, at position c + j, predicts prompt
        token c + j + 1. Run for every step of a request that asked, before `sample`."""
        history = self._histories.get(seq.request_id)
        if history is None or history.prompt_logprobs is None or history.is_prompt_logprobs_sent:
            return
        prompt = history.prompt_token_ids
        first = seq.num_context_tokens
        end = min(first + seq.num_query_tokens, len(prompt) - 1)  # last position predicting
        k = seq.sampling_params.prompt_logprobs or 0
        for start in range(first, end, _PROMPT_LOGPROBS_ROWS):
            stop = min(start + _PROMPT_LOGPROBS_ROWS, end)
            lp = logits_of(start - first, stop - first).log_softmax(dim=-1)
            targets = torch.tensor(prompt[start + 1 : stop + 1], device=lp.device)
            history.prompt_logprobs[start + 1 : stop + 1] = _entries(
                lp, targets, [k] * len(targets)
            )

    # --- logits processing (in place) -----------------------------------------------------
    def _process(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> None:
        self._apply_allowed_token_ids(logits, seqs)
        banned = self._banned_tokens(seqs)
        if banned[0]:
            rows, cols = (torch.tensor(x, device=logits.device) for x in banned)
            logits.index_put_((rows, cols), torch.tensor(_NEG_INF, device=logits.device))
        self._apply_logit_bias(logits, seqs)
        self._apply_penalties(logits, seqs)

    def _apply_allowed_token_ids(
        self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]
    ) -> None:
        restricted, rows, cols = [], [], []
        for row, seq in enumerate(seqs):
            allowed = seq.sampling_params.allowed_token_ids
            if allowed:
                rows.extend([len(restricted)] * len(allowed))
                restricted.append(row)
                cols.extend(allowed)
        if not restricted:
            return
        device = logits.device
        index = torch.tensor(restricted, device=device)
        banned = torch.ones((len(restricted), logits.shape[1]), dtype=torch.bool, device=device)
        banned[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = False
        logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(banned, _NEG_INF))

    def _banned_tokens(self, seqs: Sequence[ScheduledSequence]) -> tuple[list[int], list[int]]:
        """(rows, tokens) set to -inf: bad words whose prefix the output just completed
        (single-token ones always), and stop tokens before `min_tokens` outputs."""
        rows: list[int] = []
        cols: list[int] = []
        for row, seq in enumerate(seqs):
            params = seq.sampling_params
            for word in params.bad_words_token_ids:
                if len(word) == 1 or self._output_ends_with(seq.request_id, word[:-1]):
                    rows.append(row)
                    cols.append(word[-1])
            if seq.num_output_tokens < params.min_tokens:
                stops = self.eos_token_ids + params.stop_token_ids
                rows.extend([row] * len(stops))
                cols.extend(stops)
        return rows, cols

    def _output_ends_with(self, request_id: str, prefix: list[int]) -> bool:
        history = self._histories.get(request_id)
        if history is None:
            return False
        output = history.output_token_ids
        return len(output) >= len(prefix) and output[len(output) - len(prefix) :] == prefix

    @staticmethod
    def _apply_logit_bias(logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> None:
        rows, cols, values = [], [], []
        for row, seq in enumerate(seqs):
            bias = seq.sampling_params.logit_bias
            if bias:
                rows.extend([row] * len(bias))
                cols.extend(bias)
                values.extend(bias.values())
        if rows:
            index = (
                torch.tensor(rows, device=logits.device),
                torch.tensor(cols, device=logits.device),
            )
            logits.index_put_(index, torch.tensor(values, device=logits.device), accumulate=True)

    def _apply_penalties(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> None:
        """vLLM's definitions: repetition divides a positive logit (multiplies a negative
        one) of every token seen in the prompt or the output; frequency subtracts
        penalty x count in the output; presence subtracts the penalty once if present."""
        rows = [i for i, s in enumerate(seqs) if s.sampling_params.has_penalties]
        if not rows:
            return
        device = logits.device
        histories = [self._histories.get(seqs[i].request_id) or _History([]) for i in rows]
        counts = torch.zeros((len(rows), logits.shape[1]), device=device)  # (R, V)
        lengths = [len(h.output_token_ids) for h in histories]
        if sum(lengths):
            row_index = torch.repeat_interleave(torch.arange(len(rows)), torch.tensor(lengths)).to(
                device
            )
            token_index = torch.tensor(
                [t for h in histories for t in h.output_token_ids], device=device
            )
            counts.index_put_(
                (row_index, token_index),
                torch.ones(len(token_index), device=device),
                accumulate=True,
            )
        params = [seqs[i].sampling_params for i in rows]
        index = torch.tensor(rows, device=device)
        sub = logits.index_select(0, index)
        repetition = torch.tensor([p.repetition_penalty for p in params], device=device)[:, None]
        if any(p.repetition_penalty != 1.0 for p in params):
            seen = (counts > 0) | torch.stack(
                [self._prompt_mask(h, logits.shape[1], device) for h in histories]
            )
            penalized = torch.where(sub > 0, sub / repetition, sub * repetition)
            sub = torch.where(seen, penalized, sub)
        frequency = torch.tensor([p.frequency_penalty for p in params], device=device)[:, None]
        presence = torch.tensor([p.presence_penalty for p in params], device=device)[:, None]
        sub = sub - frequency * counts - presence * (counts > 0)
        logits.index_copy_(0, index, sub)

    @staticmethod
    def _prompt_mask(history: _History, vocab: int, device: torch.device) -> torch.Tensor:
        if history.prompt_mask is None:
            mask = torch.zeros(vocab, dtype=torch.bool, device=device)
            mask[torch.tensor(history.prompt_token_ids, dtype=torch.long, device=device)] = True
            history.prompt_mask = mask
        return history.prompt_mask

    # --- picking --------------------------------------------------------------------------
    def _pick(self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]) -> torch.Tensor:
        is_greedy = [seq.sampling_params.is_greedy for seq in seqs]
        if all(is_greedy):
            return argmax(logits)
        probs = self._filtered_probs(logits, seqs)
        sampled = self._invert_cdf(probs, self._uniforms(seqs))
        if not any(is_greedy):
            return sampled
        greedy = argmax(logits)
        return torch.where(torch.tensor(is_greedy, device=logits.device), greedy, sampled)

    def _filtered_probs(
        self, logits: torch.Tensor, seqs: Sequence[ScheduledSequence]
    ) -> torch.Tensor:
        params = [seq.sampling_params for seq in seqs]
        temperatures = [p.temperature if p.temperature > 0 else 1.0 for p in params]
        if any(t != 1.0 for t in temperatures):
            logits = logits / torch.tensor(temperatures, device=logits.device)[:, None]
        if any(p.min_p > 0 for p in params):
            logits = self._apply_min_p(logits, [p.min_p for p in params])
        top_k = [p.top_k for p in params]
        top_p = [p.top_p for p in params]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            logits = self._apply_top_k_top_p(logits, top_k, top_p)
        return logits.softmax(dim=-1)

    @staticmethod
    def _apply_min_p(logits: torch.Tensor, min_p: list[float]) -> torch.Tensor:
        """Drop tokens less likely than min_p x the most likely one's probability."""
        probs = logits.softmax(dim=-1)
        threshold = (
            probs.amax(dim=-1, keepdim=True) * torch.tensor(min_p, device=logits.device)[:, None]
        )
        return logits.masked_fill(probs < threshold, _NEG_INF)

    @staticmethod
    def _apply_top_k_top_p(
        logits: torch.Tensor, top_k: list[int], top_p: list[float]
    ) -> torch.Tensor:
        """Mask all but each row's top_k tokens (0: all) and, of those, all but the fewest
        best whose probability reaches top_p. Only each row's _TOP_CANDIDATES best are
        ranked (`topk`); the rows that would keep more are sorted whole. A full sort of a
        50k vocabulary took 54 ms at 32 rows on 2 cores, `topk` 6 ms; on the default model
        at temperature 0.8 and top_p 0.95, 1 token in 377 needed the sort (at 1.0: 1 in
        12)."""
        vocab = logits.shape[-1]
        ks = [k if 0 < k < vocab else vocab for k in top_k]
        num_ranked = min(vocab, _TOP_CANDIDATES)
        if any(num_ranked < k < vocab for k in ks):
            num_ranked = vocab  # a top_k beyond the candidates: rank them all
        kept, fits = Sampler._top_k_top_p_among(logits, ks, top_p, num_ranked)
        if bool(fits.all()):
            return kept
        rows = (~fits).nonzero().squeeze(-1)
        rest = rows.tolist()
        kept[rows] = Sampler._top_k_top_p_among(
            logits[rows], [ks[i] for i in rest], [top_p[i] for i in rest], vocab
        )[0]
        return kept

    @staticmethod
    def _top_k_top_p_among(
        logits: torch.Tensor, ks: list[int], top_p: list[float], num_ranked: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The masked logits ranking each row's `num_ranked` best, and per row whether
        that was enough (rows that would keep more come out wrong). A row with neither
        top_k nor top_p keeps its logits."""
        device = logits.device
        if num_ranked < logits.shape[-1]:
            sorted_logits, order = logits.topk(num_ranked, dim=-1)  # best first
        else:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
        k = torch.tensor(ks, device=device)
        ranks = torch.arange(num_ranked, device=device)[None, :]
        mask = ranks >= k[:, None]
        # probabilities over all the row's tokens left by top_k, ranked or not
        masked = sorted_logits.masked_fill(mask, _NEG_INF)
        within_k = k <= num_ranked
        total = torch.where(within_k, masked.logsumexp(-1), logits.logsumexp(-1))
        probs = (masked - total[:, None]).exp()
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        p = torch.tensor(top_p, device=device)
        keeps_all = ~within_k & (p >= 1.0)
        fits = (mass_before[:, -1] + probs[:, -1] >= p) | within_k | keeps_all
        mask |= mass_before >= p[:, None]
        mask[:, 0] = False  # always keep the best token
        kept = sorted_logits.masked_fill(mask, _NEG_INF)
        ranked = torch.full_like(logits, _NEG_INF).scatter_(-1, order, kept)
        return torch.where(keeps_all[:, None], logits, ranked), fits

    def _uniforms(self, seqs: Sequence[ScheduledSequence]) -> torch.Tensor:
        """One number in [0, 1) per row (float64): from the request's own generator where
        it carries a seed, else from the sampler's."""
        uniforms = torch.rand(len(seqs), generator=self.generator, device=self.device,
                              dtype=torch.float64)  # fmt: skip
        for row, seq in enumerate(seqs):
            seed = seq.sampling_params.seed
            if seed is not None:
                generator = self._request_generators.get(seq.request_id)
                if generator is None:
                    generator = torch.Generator(device=self.device).manual_seed(seed)
                    self._request_generators[seq.request_id] = generator
                uniforms[row] = torch.rand((), generator=generator, device=self.device,
                                           dtype=torch.float64)  # fmt: skip
        return uniforms

    @staticmethod
    def _invert_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """Per row, the first token whose cumulative probability exceeds u x the row's
        total: token t with probability p_t / total. Two levels, so nothing of the
        vocabulary's size is copied: the block of _CDF_BLOCK tokens where the sum crosses,
        from the blocks' sums, then the token within it. The running sums are float64: a
        float32 sum over 50k-150k tokens would blur the shares of tokens below about 1e-5.
        A zero-probability token is never picked (only where float64 rounding lands u x
        total on the total itself, about 1e-16 of draws, is the last token taken)."""
        num_rows, vocab = probs.shape
        if vocab % _CDF_BLOCK:
            probs = torch.nn.functional.pad(probs, (0, _CDF_BLOCK - vocab % _CDF_BLOCK))
        blocks = probs.view(num_rows, -1, _CDF_BLOCK)
        block_cdf = blocks.sum(-1).to(torch.float64).cumsum_(-1)  # (rows, blocks)
        targets = uniforms * block_cdf[:, -1]
        block = torch.searchsorted(block_cdf, targets[:, None], right=True).squeeze(-1)
        block.clamp_(max=blocks.shape[1] - 1)
        before = block_cdf.gather(1, (block - 1).clamp(min=0)[:, None]).squeeze(-1)
        before = torch.where(block > 0, before, 0.0)
        inside = blocks[torch.arange(num_rows, device=probs.device), block]  # (rows, block)
        inside_cdf = inside.to(torch.float64).cumsum_(-1)
        offset = torch.searchsorted(inside_cdf, (targets - before)[:, None], right=True)
        # block sums and sums within a block round differently: stay on a token with mass
        last = _CDF_BLOCK - 1 - (inside > 0).flip(-1).to(torch.int8).argmax(-1)
        picked = block * _CDF_BLOCK + torch.minimum(offset.squeeze(-1), last)
        return picked.clamp_(max=vocab - 1)


def _apply_bitmask(logits: torch.Tensor, matchers: list[Any]) -> None:
    """Mask the tokens each row's grammar rules out (rows without one keep all)."""
    import llguidance.torch

    bitmask = llguidance.torch.allocate_token_bitmask(len(matchers), logits.shape[1])
    bitmask.fill_(-1)  # every bit set: all allowed
    for row, matcher in enumerate(matchers):
        if matcher is not None and not matcher.is_error():
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, row)
    # unpacked here (llguidance's own apply runs torch.compile, seconds on a first call)
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    words = bitmask.to(logits.device)[:, :, None]  # (S, ceil(V / 32), 1)
    allowed = ((words >> bits) & 1).bool().flatten(1)[:, : logits.shape[1]]  # (S, V)
    logits.masked_fill_(~allowed, _NEG_INF)


def _entries(logprobs: torch.Tensor, chosen: torch.Tensor, ks: list[int]) -> list[TokenLogprobs]:
    """For each row of `logprobs` (R, V): the chosen token's log-probability, its rank and
    the row's top ks[r], all moved to the host at once."""
    chosen_lp = logprobs.gather(1, chosen[:, None])  # (R, 1)
    ranks = (logprobs > chosen_lp).sum(dim=-1) + 1
    k_max = max(ks, default=0)
    top_values, top_ids = (
        logprobs.topk(k_max, dim=-1) if k_max else (chosen_lp[:, :0], chosen[:, None][:, :0])
    )
    rows = zip(
        chosen.tolist(),
        chosen_lp[:, 0].tolist(),
        ranks.tolist(),
        top_ids.tolist(),
        top_values.tolist(),
    )
    return [
        TokenLogprobs(token, lp, rank, list(zip(ids[:k], values[:k])))
        for (token, lp, rank, ids, values), k in zip(rows, ks)
    ]
