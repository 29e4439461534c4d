"""A step's other prompt chunks do not push a first token past its TTFT deadline.

A prompt's first token comes when the whole step that finishes its prefill ends. With a
512-token budget, the step that finishes a 60-token gold prompt also carries up to 450
tokens of other prompts' chunks, which on a CPU is 300 ms more before gold's first token:
admission, which knows the scheduler fills the step, refused such short gold prompts at
an estimate of 500-700 ms (docs/results/slo_promise/first_token_guard_1207/).

With `--first-token-guard` (off by default: docs/policies.md says what it costs) and a
ready step-time model, each step the guard finds the prompts whose first token this step
can produce (the "setters": running prompts and the queued ones that fit memory, class
first, whose whole remaining prompt fits the budget) and takes the tightest of their TTFT
deadlines. Every other prompt chunk of that setter's class or below (a
"filler") then gets only the tokens that keep the step within `FIRST_TOKEN_HEADROOM` of
the time left to it, and leaves the budget to the setters not yet in the step. The step
is priced by the model times its late factor (how much longer than predicted a step may
well take: on a 2-core CPU one step in ten ran 1.2-1.3x its prediction, and held to 0.9 of
the deadline by the bare prediction, gold's first tokens came 5-40% late). When only a
step without fillers can still meet the deadline, the fillers get nothing; when not even
that one can, the setter holds nothing back (its first token is late anyway). Admission
prices the same cap (`Estimator.first_token`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from superinfer.core.request import Request
from superinfer.core.step_time import (
    ShapeBuilder,
    StepTimePredictor,
    largest_that_fits,
    step_seconds,
)

# The share of the time to a setter's TTFT deadline its step may take (the rest absorbs
# the step-time model's error and what follows the step: sampling, the response's trip)
FIRST_TOKEN_HEADROOM = 0.9

_Entry = tuple[int, int, bool]  # a sequence's (query tokens, cached tokens, is sampling)


class FirstTokenGuard:
    """The time limit one step's fillers are held to (built by `FirstTokenGuard.build`)."""

    def __init__(
        self,
        model: StepTimePredictor,
        limit_s: float,
        limit_rank: int,
        pending: dict[str, _Entry],
        setter_ids: set[str],
    ) -> None:
        self.model = model
        self.limit_s = limit_s  # the most the step may take as predicted, from its start
        self.limit_rank = limit_rank  # the class rank of the setter whose deadline sets it
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
    ) -> FirstTokenGuard | None:
        """The guard for a step of `decodes` and `prompts` (in the order they get the
        budget); None when no first token of this step needs one, or without a ready model."""
        if model is None or not model.is_ready:
            return None
        setters, num_tokens = [], 0
        for request in prompts:
            num_tokens += request.num_uncomputed_tokens
            if num_tokens > token_budget:
                break
            if request.first_token_time is None:
                setters.append(request)
        if not setters:
            return None
        pending = {r.request_id: (1, r.num_computed_tokens, True) for r in decodes}
        pending |= {r.request_id: (r.num_uncomputed_tokens, r.num_computed_tokens, True)
                    for r in setters}  # fmt: skip
        shape = ShapeBuilder()
        for entry in pending.values():
            shape.add(*entry)
        base_s = step_seconds(model, shape.shape())  # the step without fillers
        limits = []
        for request in setters:
            left_s = request.arrival_time + request.slo.ttft_s - now
            if base_s <= left_s:  # else no step meets it: it holds nothing back
                room_s = FIRST_TOKEN_HEADROOM * left_s / model.late_factor
                limits.append((max(base_s, room_s), rank(request)))
        if not limits:
            return None
        limit_s, limit_rank = min(limits)
        return cls(model, limit_s, limit_rank, pending, {r.request_id for r in setters})

    def is_filler(self, request: Request, rank: int) -> bool:
        """A prompt chunk the limit holds back: not a setter, and not of a class above the
        setter whose deadline sets the limit."""
        return (not request.is_prefill_done and request.request_id not in self.setter_ids
                and rank >= self.limit_rank)  # fmt: skip

    def num_tokens(self, request: Request, num_tokens: int, shape: ShapeBuilder,
                   token_budget: int) -> int:  # fmt: skip
        """The most of `num_tokens` a filler may take in a step composed so far as `shape`
        with `token_budget` tokens left: the budget the pending setters need stays theirs,
        and the predicted step stays within the limit."""
        num_kept = sum(entry[0] for rid, entry in self.pending.items() if rid in self.setter_ids)
        num_tokens = min(num_tokens, max(0, token_budget - num_kept))
        priced = copy.copy(shape)
        for entry in self.pending.values():
            priced.add(*entry)
        start = request.num_computed_tokens

        def fits(num: int) -> bool:
            candidate = priced.shape(num, start, start + num == request.num_tokens)
            return step_seconds(self.model, candidate) <= self.limit_s

        return largest_that_fits(num_tokens, fits)

    def on_added(self, request_id: str) -> None:
        """`request_id` is in the step now (the step's own shape prices it)."""
        self.pending.pop(request_id, None)
