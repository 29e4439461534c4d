"""The most KV the admitted requests will hold at once, if their promises are kept.

Admission's KV check (`Estimator.kv_commitment`) must not count every admitted request at
its final size as if all of them held it at the same moment: requests finish at different
times, and a request that finishes frees its blocks for those still growing. Counting the
sum of final sizes refused requests that would have fitted (docs/results/slo_promise/
final_1205: every refusal the admission-off replay showed would have met came from it).

A kept promise bounds when a request's KV is freed: its first token by its TTFT deadline,
then its mean gap within its TBT target, so its last token by

    first token (or its TTFT deadline, while queued) + (outputs - 1) x TBT target

Until then it grows by at most a token per step (the fastest step: one without prompt
tokens). The peak of the sum over that time is what the tiers must hold; a request with
no TBT target, or with no TTFT deadline while queued, has no such bound and is counted at
its final size throughout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KvHold:
    """One admitted request's KV over the time ahead: `num_tokens` held from now, growing
    a token a step up to `num_final_tokens`, all freed `finish_s` seconds from now (inf:
    no bound)."""

    num_tokens: int
    num_final_tokens: int
    finish_s: float = math.inf


def promised_finish_s(start_s: float, num_outputs_left: int, tbt_s: float) -> float:
    """Seconds from now to the last token of a request whose first token comes (or came)
    `start_s` from now and whose mean gap stays within `tbt_s` (0: no target, no bound)."""
    if tbt_s <= 0 or not math.isfinite(start_s):
        return math.inf
    return start_s + max(0, num_outputs_left - 1) * tbt_s


def peak_kv_blocks(holds: Sequence[KvHold], step_s: float, block_size: int) -> int:
    """The most blocks of `block_size` tokens `holds` occupy at once from now on, each
    growing a token every `step_s` (0: at once to its final size) until it is freed.

    Between two releases the demand only grows, so the peak is just before one of them (or
    at the end, for holds without a bound). Times are visited earliest first; the finals of
    the holds still alive bound what any later time can reach, so the scan stops once that
    bound cannot beat the peak found."""
    by_finish = sorted(holds, key=lambda hold: hold.finish_s)
    num_final_left = sum(_num_blocks(hold.num_final_tokens, block_size) for hold in by_finish)
    peak = 0
    for first, hold in enumerate(by_finish):
        if num_final_left <= peak:
            break
        if first and hold.finish_s == by_finish[first - 1].finish_s:
            num_final_left -= _num_blocks(hold.num_final_tokens, block_size)
            continue  # the same instant as the hold before it: already counted
        growth = max(0.0, hold.finish_s) / step_s if step_s > 0 else math.inf
        alive = by_finish[first:]
        peak = max(peak, sum(_num_blocks(min(h.num_final_tokens, h.num_tokens + growth), block_size)
                             for h in alive))  # fmt: skip
        num_final_left -= _num_blocks(hold.num_final_tokens, block_size)
    return peak


def _num_blocks(num_tokens: float, block_size: int) -> int:
    return math.ceil(num_tokens / max(1, block_size))
