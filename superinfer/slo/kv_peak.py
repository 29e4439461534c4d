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
    at the end, for holds without a bound). One pass over those times, earliest first:
    a hold is "capped" once it has grown to its final size and "growing" before; the
    growing ones are summed in `_Growing` without visiting each, so a pass costs the sorts
    and a block size's worth of counts per release, not a visit of every hold per release
    (admission runs it for every request: 1,000 holds take about 1 ms)."""
    bs = max(1, block_size)
    num_holds = len(holds)
    by_finish = sorted(range(num_holds), key=lambda i: holds[i].finish_s)
    by_growth_left = sorted(range(num_holds),
                            key=lambda i: holds[i].num_final_tokens - holds[i].num_tokens)  # fmt: skip
    growing = _Growing(bs)
    for hold in holds:
        growing.add(hold.num_tokens, +1)
    is_capped = [False] * num_holds  # grown to its final size
    is_freed = [False] * num_holds
    num_capped_blocks = num_next_capped = peak = index = 0
    while index < num_holds:
        finish_s = holds[by_finish[index]].finish_s
        growth = _tokens_grown(finish_s, step_s)
        while num_next_capped < num_holds:
            hold = holds[i := by_growth_left[num_next_capped]]
            if hold.num_final_tokens - hold.num_tokens > growth:
                break
            num_next_capped += 1
            if not is_freed[i]:
                growing.add(hold.num_tokens, -1)
                num_capped_blocks += _num_blocks(hold.num_final_tokens, bs)
                is_capped[i] = True
        peak = max(peak, num_capped_blocks + growing.num_blocks(growth))
        while index < num_holds and holds[by_finish[index]].finish_s == finish_s:
            hold = holds[i := by_finish[index]]
            index += 1
            is_freed[i] = True
            if is_capped[i]:
                num_capped_blocks -= _num_blocks(hold.num_final_tokens, bs)
            else:
                growing.add(hold.num_tokens, -1)
    return peak


def _tokens_grown(finish_s: float, step_s: float) -> float:
    """Tokens a request grows by just before `finish_s`: one a step, each step's slot
    taken when the step starts (inf: grown to its final size)."""
    if step_s <= 0 or not math.isfinite(finish_s):
        return math.inf
    return math.ceil(max(0.0, finish_s) / step_s)


class _Growing:
    """Holds of `num_tokens = block_size * q + m` tokens that all grow by the same number
    of tokens: their blocks summed from q's sum and a count of each residue m."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.num_holds = 0
        self.sum_q = 0
        self.num_by_residue = [0] * block_size

    def add(self, num_tokens: int, sign: int) -> None:
        q, m = divmod(num_tokens, self.block_size)
        self.num_holds += sign
        self.sum_q += sign * q
        self.num_by_residue[m] += sign

    def num_blocks(self, growth: float) -> int:
        """Their blocks once each has grown by `growth` tokens (an integer)."""
        if not self.num_holds:
            return 0
        big_q, big_m = divmod(int(growth), self.block_size)
        # ceil((q + Q) * bs + m + M) / bs) = q + Q + ceil((m + M) / bs), and the last term
        # is 0 when m and M are both 0, 2 when m + M > bs, 1 otherwise
        num_zero = self.num_by_residue[0] if big_m == 0 else 0
        num_over = sum(self.num_by_residue[self.block_size - big_m + 1 :]) if big_m else 0
        return self.sum_q + self.num_holds * (big_q + 1) - num_zero + num_over


def _num_blocks(num_tokens: float, block_size: int) -> int:
    return math.ceil(num_tokens / max(1, block_size))
