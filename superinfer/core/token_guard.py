"""A step's other prompt chunks do not push the tokens it produces past their deadlines.

A token comes when the whole step that produces it ends, and a step fills its token budget
(512 by default) with whatever prompts are waiting: on a CPU that prefills a token in
0.7-1.1 ms, 300-500 ms a step.

- **First tokens** (`--first-token-guard`): the step that finished a 60-token gold prompt
  also carried 450 tokens of a bronze prompt, and admission, which knows the scheduler
  fills the step, refused such short gold prompts at estimates of 500-700 ms
  (docs/results/slo_promise/first_token_guard_1207/).
- **Next tokens** (`--tbt-guard`): TPOT is judged on the mean gap, and a request with a
  short output cannot absorb a long step (a gold request with 8 tokens missed its 100 ms
  TPOT in every run at 3x load: two of its seven gaps were 512-token prefill steps of
  250-400 ms; docs/results/slo_promise/tbt_guard_1207/). A decoding request's next token
  is due when its mean gap at its planned length (`max_tokens`) would pass its TBT target
  if every later token came a decode step apart. A long output has gaps to spare and sets
  no limit until near its end; without `max_tokens` the next token counts as the last.

Each step, with a ready step-time model, the guard finds the prompts whose first token
this step can produce (the "setters": running prompts and the queued ones that fit memory,
class first, whose whole remaining prompt fits the budget) and the deadlines of the tokens
it guards. A deadline sets a time limit for its class: `GUARD_HEADROOM` of the time left to
it, priced by the model times its late factor (how much longer than predicted a step may
well take: on a 2-core CPU one step in ten ran 1.2-1.3x its prediction, and held to 0.9 of
the deadline by the bare prediction, gold's first tokens came 5-40% late). A prompt chunk
of a class below a limit's class, or of its class and not a setter (a "filler"), gets only
the tokens that keep the step within that limit, beside everything the limit does not hold
back (the decodes, the setters of its class and above), and leaves the budget to the
setters of its class and above not yet in the step. When only a step without fillers can
still meet the deadline, the fillers get nothing; when not even that one can, the deadline
holds nothing back (its token is late anyway). Admission prices the first-token limit
(`Estimator.first_token`); the next-token limits only through its learned correction. The
guards are on by default (docs/policies.md says what each costs).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import NamedTuple

from superinfer.core.request import Request
from superinfer.core.step_time import (
    ShapeBuilder,
    StepTimePredictor,
    largest_that_fits,
    step_seconds,
)

# The share of the time to a guarded token's deadline its step may take (the rest absorbs
# the step-time model's error and what follows the step: sampling, the response's trip)
GUARD_HEADROOM = 0.9

_Entry = tuple[int, int, bool]  # a sequence's (query tokens, cached tokens, is sampling)


class _Pending(NamedTuple):
    """A decode or setter not yet in the step."""

    entry: _Entry
    rank: int  # its class rank
    is_setter: bool


class TokenGuard:
    """The time limits one step's fillers are held to (built by `TokenGuard.build`): one
    per class rank whose guarded tokens need one, from the tightest of their deadlines."""

    def __init__(
        self,
        model: StepTimePredictor,
        limits: dict[int, float],
        pending: dict[str, _Pending],
        setter_ids: set[str],
    ) -> None:
        self.model = model
        # class rank -> the most the step may take as predicted, from its start
        self.limits = limits
        # the decodes and setters not yet in the step: priced as if they were
        self.pending = pending
        self.setter_ids = setter_ids

    @classmethod
    def build(
        cls,
        model: StepTimePredictor | None,
        now: float,
        decodes: Sequence[Request],
        prompts: Sequence[Request],
        token_budget: int,
        rank: Callable[[Request], int],
        is_ttft_guarded: bool = True,
        is_tbt_guarded: bool = False,
    ) -> TokenGuard | None:
        """The guard for a step of `decodes` and `prompts` (in the order they get the
        budget); None when none of the tokens it guards (first tokens with
        `is_ttft_guarded`, the decodes' next tokens with `is_tbt_guarded`) needs one, or
        without a ready model."""
        if model is None or not model.is_ready or not (is_ttft_guarded or is_tbt_guarded):
            return None
        setters, num_tokens = [], 0
        for request in prompts:
            num_tokens += request.num_uncomputed_tokens
            if num_tokens > token_budget:
                break
            if request.first_token_time is None:
                setters.append(request)
        deadlines = []
        if is_ttft_guarded:
            deadlines += [(r.arrival_time + r.slo.ttft_s, rank(r)) for r in setters]
        if is_tbt_guarded:
            decode_step = ShapeBuilder()
            for request in decodes:
                decode_step.add(1, request.num_computed_tokens, True)
            gap_s = step_seconds(model, decode_step.shape()) * model.late_factor
            deadlines += [(_next_token_deadline(r, gap_s), rank(r)) for r in decodes
                          if r.first_token_time is not None]  # fmt: skip
        if not deadlines:
            return None
        pending = {r.request_id: _Pending((1, r.num_computed_tokens, True), rank(r), False)
                   for r in decodes}  # fmt: skip
        pending |= {r.request_id: _Pending((r.num_uncomputed_tokens, r.num_computed_tokens, True),
                                           rank(r), True) for r in setters}  # fmt: skip
        guard = cls(model, {}, pending, {r.request_id for r in setters})
        base_s: dict[int, float] = {}  # rank -> the step without the fillers that rank limits
        for deadline, setter_rank in deadlines:
            if setter_rank not in base_s:
                base_s[setter_rank] = step_seconds(
                    model, guard._priced(ShapeBuilder(), setter_rank).shape()
                )
            left_s = deadline - now
            if base_s[setter_rank] <= left_s:  # else no step meets it: it holds nothing back
                room_s = GUARD_HEADROOM * left_s / model.late_factor
                limit_s = max(base_s[setter_rank], room_s)
                guard.limits[setter_rank] = min(limit_s, guard.limits.get(setter_rank, limit_s))
        return guard if guard.limits else None

    def _limits_on(self, request: Request, rank: int) -> list[tuple[int, float]]:
        """The (class rank, limit) pairs that hold `request`'s chunk: those of more
        important classes, and of its own class unless it is a setter (a class's setters
        are all in the step its limit allows)."""
        if request.is_prefill_done:
            return []
        is_setter = request.request_id in self.setter_ids
        return [(r, s) for r, s in self.limits.items() if r < rank or (r == rank and not is_setter)]

    def is_filler(self, request: Request, rank: int) -> bool:
        """A prompt chunk a limit holds back."""
        return bool(self._limits_on(request, rank))

    def _priced(self, shape: ShapeBuilder, rank: int, skip_id: str = "") -> ShapeBuilder:
        """`shape` plus what is in the step whatever the fillers of a limit set at `rank`
        get: the pending decodes, and the pending setters of that class or above."""
        priced = copy.copy(shape)
        for request_id, p in self.pending.items():
            if request_id != skip_id and (not p.is_setter or p.rank <= rank):
                priced.add(*p.entry)
        return priced

    def num_tokens(self, request: Request, rank: int, num_tokens: int, shape: ShapeBuilder,
                   token_budget: int) -> int:  # fmt: skip
        """The most of `num_tokens` a filler of class `rank` may take in a step composed so
        far as `shape` with `token_budget` tokens left: the budget the pending setters of
        its class or above need stays theirs, and the predicted step stays within every
        limit that holds it."""
        num_kept = sum(p.entry[0] for rid, p in self.pending.items()
                       if p.is_setter and p.rank <= rank and rid != request.request_id)  # fmt: skip
        num_tokens = min(num_tokens, max(0, token_budget - num_kept))
        start = request.num_computed_tokens
        for setter_rank, limit_s in self._limits_on(request, rank):
            priced = self._priced(shape, setter_rank, request.request_id)

            def fits(num: int, priced: ShapeBuilder = priced, limit_s: float = limit_s) -> bool:
                candidate = priced.shape(num, start, start + num == request.num_tokens)
                return step_seconds(self.model, candidate) <= limit_s

            num_tokens = largest_that_fits(num_tokens, fits)
        return num_tokens

    def on_added(self, request_id: str) -> None:
        """`request_id` is in the step now (the step's own shape prices it)."""
        self.pending.pop(request_id, None)


def _next_token_deadline(request: Request, gap_s: float) -> float:
    """The latest `request`'s next token may come for its mean gap to stay within its TBT
    target at its planned length (`max_tokens`), the tokens after it `gap_s` apart (a
    decode step); without `max_tokens`, as if the next token were its last."""
    assert request.first_token_time is not None
    num_tokens = len(request.output_token_times)
    num_planned = max(num_tokens + 1, request.sampling_params.max_tokens or 0)
    num_after = num_planned - num_tokens - 1
    return request.first_token_time + request.slo.tbt_s * (num_planned - 1) - gap_s * num_after
