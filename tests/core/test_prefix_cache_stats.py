"""Prefix-cache counters as vLLM defines `vllm:prefix_cache_queries` / `_hits`: each lookup
adds the request's tokens to the queries and the tokens found cached to the hits."""

from __future__ import annotations

from superinfer.core.kv.manager import TwoTierKVManager
from superinfer.core.request import RequestStatus
from tests.factories import make_request

BS = 4


def run_prompt(kv: TwoTierKVManager, prompt: list[int]) -> None:
    """Look the prompt up, then compute it whole (its full blocks enter the cache)."""
    request = make_request(prompt_token_ids=prompt)
    request.num_computed_tokens = kv.match_prefix(request)
    kv.allocate_slots(request, request.num_tokens - request.num_computed_tokens)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = request.num_tokens
    kv.on_tokens_computed(request)


def test_queries_count_every_token_looked_up_and_hits_the_cached_ones():
    kv = TwoTierKVManager(16, 16, BS, enable_prefix_caching=True)
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks
    run_prompt(kv, prompt)
    assert (kv.stats.num_prefix_query_tokens, kv.stats.num_prefix_hit_tokens) == (10, 0)
    run_prompt(kv, prompt)
    assert (kv.stats.num_prefix_query_tokens, kv.stats.num_prefix_hit_tokens) == (20, 8)


def test_no_lookups_are_counted_without_prefix_caching():
    kv = TwoTierKVManager(16, 16, BS, enable_prefix_caching=False)
    prompt = list(range(100, 110))
    run_prompt(kv, prompt)
    run_prompt(kv, prompt)
    assert (kv.stats.num_prefix_query_tokens, kv.stats.num_prefix_hit_tokens) == (0, 0)
