"""The most KV the admitted requests will hold at once, if their promises are kept.

Admission's KV check (`Estimator.kv_commitment`) must not count every admitted request at
its final size as if all of them held it at the same moment: requests finish at different
times, and a request that finishes frees its blocks for those still growing. Counting the
sum of final sizes refused requests that would have fitted (docs/results/slo_promise/
final_1205: every refusal the admission-off replay showed would have met came from it).

A kept promise bounds when a request's KV is freed: its first token by its TTFT deadline,
then its mean gap within its TBT target, so its last token by

    first token (or its TTFT deadline, while queued) + (outputs - 1) x TBT target

and it grows by at most a token a step until then. Projected both ways at once (fastest
growth, slowest release), every request is at its final size before any is freed, which
no scheduler does: `hold_pace.py` narrows each class to the paces its finished requests
ran at, and each hold here carries its own growth pace and release. The peak of the sum
over that time is what the tiers must hold; a request with no TBT target, or with no TTFT
deadline while queued, has no such bound and is counted at its final size throughout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class KvHold:
    """One admitted request's KV over the time ahead: `num_tokens` held from now, growing
    a token every `s_per_token` seconds (0: at once) up to `num_final_tokens`, all freed
    `finish_s` seconds from now (inf: no bound)."""

    num_tokens: int
    num_final_tokens: int
    finish_s: float = math.inf
    s_per_token: float = 0.0


def promised_finish_s(start_s: float, num_outputs_left: int, tbt_s: float) -> float:
    """Seconds from now to the last token of a request whose first token comes (or came)
    `start_s` from now and whose mean gap stays within `tbt_s` (0: no target, no bound)."""
    if tbt_s <= 0 or not math.isfinite(start_s):
        return math.inf
    return start_s + max(0, num_outputs_left - 1) * tbt_s


def peak_kv_blocks(holds: Sequence[KvHold], block_size: int) -> int:
    """The most blocks of `block_size` tokens `holds` occupy at once from now on, each
    growing a token every `s_per_token` until it is freed.

    Between two releases the demand only grows, so the peak is just before one of them (or
    at the end, for holds without a bound). One pass over those times, earliest first.
    Holds are grouped by pace (a class's requests share one, so the groups are few); in a
    group a hold is "capped" once it has grown to its final size and "growing" before, and
    the growing ones are summed in `_Growing` without visiting each. A pass costs the sorts
    and a block size's worth of counts per release and group, not a visit of every hold per
    release (admission runs it for every request: 1,000 holds at 3 paces take about 3 ms)."""
    bs = max(1, block_size)
    is_freed = [False] * len(holds)
    groups: dict[float, _PaceGroup] = {}
    for i, hold in enumerate(holds):
        group = groups.get(hold.s_per_token)
        if group is None:
            group = groups[hold.s_per_token] = _PaceGroup(hold.s_per_token, bs, is_freed)
        group.add(i, hold)
    for group in groups.values():
        group.sort(holds)
    by_finish = sorted(range(len(holds)), key=lambda i: holds[i].finish_s)
    peak = index = 0
    while index < len(holds):
        finish_s = holds[by_finish[index]].finish_s
        num_blocks = 0
        for group in groups.values():
            num_blocks += group.num_blocks_before(finish_s, holds)
        peak = max(peak, num_blocks)
        while index < len(holds) and holds[i := by_finish[index]].finish_s == finish_s:
            is_freed[i] = True
            groups[holds[i].s_per_token].free(i, holds[i])
            index += 1
    return peak


class _PaceGroup:
    """The holds that grow at one pace, as `peak_kv_blocks` walks the releases: those
    grown to their final size ("capped") summed in blocks, the rest in `_Growing`."""

    def __init__(self, s_per_token: float, block_size: int, is_freed: list[bool]) -> None:
        self.s_per_token = s_per_token
        self.block_size = block_size
        self.is_freed = is_freed  # shared by the groups, by hold index
        self.indices: list[int] = []
        self.growing = _Growing(block_size)
        self.capped: set[int] = set()
        self.num_capped_blocks = 0
        self.num_next_capped = 0  # into `indices`, once sorted by growth left

    def add(self, i: int, hold: KvHold) -> None:
        self.indices.append(i)
        self.growing.add(hold.num_tokens, +1)

    def sort(self, holds: Sequence[KvHold]) -> None:
        self.indices.sort(key=lambda i: holds[i].num_final_tokens - holds[i].num_tokens)

    def num_blocks_before(self, finish_s: float, holds: Sequence[KvHold]) -> int:
        """The group's blocks just before `finish_s` (releases come in time order)."""
        growth = _tokens_grown(finish_s, self.s_per_token)
        indices, num_next = self.indices, self.num_next_capped
        while num_next < len(indices):
            hold = holds[i := indices[num_next]]
            if hold.num_final_tokens - hold.num_tokens > growth:
                break
            num_next += 1
            if not self.is_freed[i]:
                self.growing.add(hold.num_tokens, -1)
                self.num_capped_blocks += _num_blocks(hold.num_final_tokens, self.block_size)
                self.capped.add(i)
        self.num_next_capped = num_next
        return self.num_capped_blocks + self.growing.num_blocks(growth)

    def free(self, i: int, hold: KvHold) -> None:
        """`hold` (index `i`, marked freed by the caller) is freed."""
        if i in self.capped:
            self.num_capped_blocks -= _num_blocks(hold.num_final_tokens, self.block_size)
        else:
            self.growing.add(hold.num_tokens, -1)


def _tokens_grown(finish_s: float, s_per_token: float) -> float:
    """Tokens a request grows by just before `finish_s`: one every `s_per_token`, each
    token's slot taken when its step starts (inf: grown to its final size)."""
    if s_per_token <= 0 or not math.isfinite(finish_s):
        return math.inf
    return math.ceil(max(0.0, finish_s) / s_per_token)


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
