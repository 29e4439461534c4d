"""The KV peak admission's KV check prices: requests free their blocks when their kept
promises end them, so the admitted requests never all hold their final sizes at once."""

from __future__ import annotations

import math
import random

import pytest

from superinfer.slo.kv_peak import KvHold, peak_kv_blocks, promised_finish_s


def blocks(num_tokens: float, block_size: int = 16) -> int:
    return math.ceil(num_tokens / block_size)


def brute_force_peak(holds: list[KvHold], step_s: float, block_size: int) -> int:
    """The demand just before every release and at the end, each summed in full."""
    times = {h.finish_s for h in holds} | {0.0, math.inf}
    peak = 0
    for t in times:
        growth = t / step_s if step_s > 0 else math.inf
        alive = [h for h in holds if h.finish_s >= t]
        peak = max(peak, sum(blocks(min(h.num_final_tokens, h.num_tokens + growth), block_size)
                             for h in alive))  # fmt: skip
    return peak


def test_a_request_that_finishes_frees_its_blocks_for_one_still_growing() -> None:
    nearly_done = KvHold(num_tokens=150, num_final_tokens=160, finish_s=0.5)  # 10 blocks
    long = KvHold(num_tokens=16, num_final_tokens=320, finish_s=30.0)  # 20 blocks when done
    # before 0.5 s: 155 + 21 tokens (10 + 2 blocks); before 30 s: only the long one, 20
    assert peak_kv_blocks([nearly_done, long], step_s=0.1, block_size=16) == 20
    assert blocks(160) + blocks(320) == 30  # what summing the final sizes counted


def test_without_a_bound_every_request_counts_at_its_final_size() -> None:
    holds = [KvHold(10, 160), KvHold(100, 320), KvHold(0, 33)]
    assert peak_kv_blocks(holds, step_s=0.1, block_size=16) == 10 + 20 + 3
    # no step time known: every request at its final size at once, whatever its bound
    bounded = [KvHold(10, 160, 1.0), KvHold(100, 320, 2.0), KvHold(0, 33, 0.5)]
    assert peak_kv_blocks(bounded, step_s=0.0, block_size=16) == 10 + 20 + 3


def test_a_request_grows_a_token_a_step_until_it_is_freed() -> None:
    # 100 tokens now, freed in 1 s: 10 steps of 0.1 s, 110 tokens at most (7 blocks), not
    # its final 400 (25 blocks)
    assert peak_kv_blocks([KvHold(100, 400, 1.0)], step_s=0.1, block_size=16) == 7
    assert peak_kv_blocks([KvHold(100, 400, 1.0)], step_s=0.01, block_size=16) == 13  # 200


def test_the_peak_is_the_brute_force_peak_on_random_admitted_sets() -> None:
    """The one-pass sum equals summing every alive hold at every release, for equal
    finish times, holds already at their final size, residues of every block size."""
    rng = random.Random(0)
    for _ in range(300):
        holds = []
        for _ in range(rng.randint(1, 25)):
            num_tokens = rng.randint(0, 600)
            finish = rng.choice([math.inf, round(rng.uniform(0, 20), 1), 5.0])  # ties
            holds.append(KvHold(num_tokens, num_tokens + rng.randint(1, 500), finish))
        holds += holds[: rng.randint(0, 2)]  # the same hold twice counts twice
        step_s = rng.choice([0.0, 0.05, 0.2, 0.1])
        block_size = rng.choice([1, 7, 16, 32])
        assert peak_kv_blocks(holds, step_s, block_size) == brute_force_peak(
            holds, step_s, block_size
        )


def test_a_kept_promise_ends_by_the_first_token_plus_a_target_gap_per_later_token() -> None:
    assert promised_finish_s(0.5, num_outputs_left=11, tbt_s=0.2) == pytest.approx(2.5)
    assert promised_finish_s(-3.0, num_outputs_left=1, tbt_s=0.2) == -3.0  # its first token
    assert promised_finish_s(0.5, num_outputs_left=11, tbt_s=0.0) == math.inf  # no target
    assert promised_finish_s(math.inf, num_outputs_left=11, tbt_s=0.2) == math.inf  # no TTFT
