"""How long a step takes: the batch summary a step's cost depends on, the predictor
interface the scheduler and the simulator both consult, and the online model the real
engine fits to its own steps.

Pure Python (no numpy, no torch, no clock): the engine passes each timed step to
`OnlineStepModel.observe`, the simulator hands the scheduler its own predictor, and the
scheduler asks either one the same question: "how long would this batch take?"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from superinfer.core.outputs import SchedulerOutput


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What a step's cost depends on. A sequence with one query token after some context
    is a decode; anything else (a prompt chunk, a recompute) is a prefill."""

    num_seqs: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_sampled: int = 0
    num_prefill_pairs: float = 0.0  # attention (query, key) pairs of the prefill chunks
    num_decode_context: int = 0  # keys the decode tokens attend to (their KV read)
    num_prefill_context: int = 0  # cached keys the prefill chunks attend to (KV read)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @classmethod
    def of(cls, output: SchedulerOutput) -> BatchShape:
        num_prefill = num_decode = num_sampled = decode_context = prefill_context = 0
        pairs = 0.0
        for seq in output.sequences:
            num_query, num_context = len(seq.token_ids), seq.num_context_tokens
            if num_query == 1 and num_context > 0:
                num_decode += 1
                decode_context += num_context + 1
            else:
                num_prefill += num_query
                prefill_context += num_context
                pairs += num_query * (num_context + (num_query + 1) / 2)
            num_sampled += seq.is_sampling
        return cls(
            len(output.sequences), num_prefill, num_decode, num_sampled, pairs,
            decode_context, prefill_context,
        )  # fmt: skip

    @classmethod
    def of_lists(
        cls, num_query: list[int], num_context: list[int], is_sampling: list[bool] | None = None
    ) -> BatchShape:
        """The shape of hand-made sequences (tests, calibration grids)."""
        from superinfer.core.outputs import ScheduledSequence
        from superinfer.sampling_params import SamplingParams

        sampling = is_sampling or [True] * len(num_query)
        params = SamplingParams()
        seqs = [
            ScheduledSequence(str(i), [0] * q, c, [], s, params, 0)
            for i, (q, c, s) in enumerate(zip(num_query, num_context, sampling))
        ]
        return cls.of(SchedulerOutput(0, seqs))


class StepTimePredictor(ABC):
    """Predicts the time of one engine step for a batch."""

    name: str = "predictor"

    @abstractmethod
    def forward_time(self, batch: BatchShape) -> float:
        """Seconds of the forward pass and sampling of `batch`."""

    @property
    def is_ready(self) -> bool:
        """Whether its answers are worth shaping steps by (a model still learning is not)."""
        return True

    def host_time(self, batch: BatchShape) -> float:
        """Seconds the engine's host side spends per step outside the forward (scheduling,
        output processing). With the step pipeline it overlaps the previous forward."""
        return 0.0

    @property
    def late_factor(self) -> float:
        """How much longer than predicted a step may well take (a high quantile of the
        observed ratio, at least 1): what a limit that must hold multiplies the prediction
        by. 1 for a predictor whose answers are the simulated steps' times."""
        return 1.0

    def describe(self) -> dict:
        """Parameters worth recording next to a result."""
        return {"name": self.name}


def step_seconds(predictor: StepTimePredictor, batch: BatchShape) -> float:
    """The time from one step's start to the next's: forward and host side together (what
    a running request waits between two tokens)."""
    if batch.num_seqs == 0:
        return 0.0
    return predictor.forward_time(batch) + predictor.host_time(batch)


def largest_that_fits(num_tokens: int, fits: Callable[[int], bool]) -> int:
    """The largest n <= `num_tokens` with `fits(n)` (0 if none), for a `fits` that holds
    up to some n and fails past it (a step's time grows with its tokens): bisection."""
    if fits(num_tokens):
        return num_tokens
    low, high = 0, num_tokens  # fits(low) holds (or low is 0), fits(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def decode_row_seconds(predictor: StepTimePredictor | None, num_context: int) -> float:
    """What one more decoding sequence of `num_context` keys adds to a decode step, by the
    predictor's answer for 1 and 16 such sequences (0 without a predictor)."""
    if predictor is None:
        return 0.0
    one, many = (
        step_seconds(predictor, BatchShape(n, 0, n, n, 0.0, n * (num_context + 1), 0))
        for n in (1, _ROW_PROBE)
    )
    return max(0.0, (many - one) / (_ROW_PROBE - 1))


_ROW_PROBE = 16


class ShapeBuilder:
    """The shape of a step being composed, one sequence at a time (`BatchShape.of` in
    increments, so a candidate can be priced before it is added)."""

    def __init__(self) -> None:
        self.num_seqs = self.num_prefill_tokens = self.num_decode_tokens = 0
        self.num_sampled = self.num_decode_context = self.num_prefill_context = 0
        self.num_prefill_pairs = 0.0

    def shape(
        self, num_query: int = 0, num_context: int = 0, is_sampling: bool = False
    ) -> BatchShape:
        """The step's shape with one more sequence of `num_query` tokens after
        `num_context` cached ones (none if `num_query` is 0)."""
        num_prefill, num_decode = self.num_prefill_tokens, self.num_decode_tokens
        decode_context, prefill_context = self.num_decode_context, self.num_prefill_context
        pairs = self.num_prefill_pairs
        if num_query == 1 and num_context > 0:
            num_decode += 1
            decode_context += num_context + 1
        elif num_query:
            num_prefill += num_query
            prefill_context += num_context
            pairs += num_query * (num_context + (num_query + 1) / 2)
        return BatchShape(
            self.num_seqs + (num_query > 0), num_prefill, num_decode,
            self.num_sampled + (num_query > 0 and is_sampling), pairs, decode_context,
            prefill_context,
        )  # fmt: skip

    def add(self, num_query: int, num_context: int, is_sampling: bool) -> None:
        shape = self.shape(num_query, num_context, is_sampling)
        self.num_seqs, self.num_sampled = shape.num_seqs, shape.num_sampled
        self.num_prefill_tokens, self.num_decode_tokens = (
            shape.num_prefill_tokens,
            shape.num_decode_tokens,
        )
        self.num_decode_context = shape.num_decode_context
        self.num_prefill_context = shape.num_prefill_context
        self.num_prefill_pairs = shape.num_prefill_pairs

    def remove(self, num_query: int, num_context: int, is_sampling: bool) -> None:
        """Take a sequence added earlier out again (a victim preempted mid-composition)."""
        if num_query == 1 and num_context > 0:
            self.num_decode_tokens -= 1
            self.num_decode_context -= num_context + 1
        elif num_query:
            self.num_prefill_tokens -= num_query
            self.num_prefill_context -= num_context
            self.num_prefill_pairs -= num_query * (num_context + (num_query + 1) / 2)
        self.num_seqs -= num_query > 0
        self.num_sampled -= num_query > 0 and is_sampling


# --- the engine's own model -----------------------------------------------------------------
# step seconds = c0 + c1 tokens + c2 max(0, tokens - 8) + c3 decode context
#                + c4 prefill attention (pairs and cached keys) + c5 sequences
# The hinge at 8 tokens: small batches are bound by reading the weights (flat), larger
# ones grow with the rows. All coefficients are kept non-negative.
_HINGE_TOKENS = 8
FEATURE_NAMES = ("const", "tokens", "tokens_over_8", "decode_context", "prefill_attention", "seqs")


def features(batch: BatchShape) -> list[float]:
    return [
        1.0, float(batch.num_tokens), float(max(0, batch.num_tokens - _HINGE_TOKENS)),
        float(batch.num_decode_context), batch.num_prefill_pairs + batch.num_prefill_context,
        float(batch.num_seqs),
    ]  # fmt: skip


def fit_non_negative(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float]:
    """Coefficients x >= 0 minimizing the relative error sum(((row . x - t) / t)^2), with a
    tiny ridge for features the samples do not tell apart. Coordinate descent on the normal
    equations (columns scaled to 1): a handful of features, so exact enough and cheap."""
    num = len(rows[0])
    scale = [max(abs(row[j]) for row in rows) or 1.0 for j in range(num)]
    gram = [[0.0] * num for _ in range(num)]
    rhs = [0.0] * num
    for row, target in zip(rows, targets):
        weight = 1.0 / max(target, 1e-6) ** 2
        scaled = [row[j] / scale[j] for j in range(num)]
        for i in range(num):
            if scaled[i]:
                rhs[i] += weight * scaled[i] * target
                for j in range(num):
                    gram[i][j] += weight * scaled[i] * scaled[j]
    ridge = 1e-6 * max(gram[i][i] for i in range(num))
    x = [0.0] * num
    for _ in range(300):
        for i in range(num):
            diagonal = gram[i][i] + ridge
            if diagonal <= 0:
                continue
            residual = rhs[i] - sum(gram[i][j] * x[j] for j in range(num) if j != i)
            x[i] = max(0.0, residual / diagonal)
    return [x[j] / scale[j] for j in range(num)]


class LinearStepModel(StepTimePredictor):
    """`features(batch) . coef` seconds per step (forward and host side together)."""

    name = "linear"

    def __init__(self, coef: Sequence[float]) -> None:
        if len(coef) != len(FEATURE_NAMES):
            raise ValueError(f"expected {len(FEATURE_NAMES)} coefficients, got {len(coef)}")
        self.coef = list(coef)

    def forward_time(self, batch: BatchShape) -> float:
        if batch.num_seqs == 0:
            return 0.0
        return sum(c * f for c, f in zip(self.coef, features(batch)))

    def describe(self) -> dict:
        return {"name": self.name, **{n: c for n, c in zip(FEATURE_NAMES, self.coef)}}


# The quantile of its recent steps' measured over predicted time that the online model
# takes as its late factor
LATE_QUANTILE = 0.9


class OnlineStepModel(StepTimePredictor):
    """A `LinearStepModel` refitted as steps are observed: the anchor samples (the
    warm-up's grid of batch shapes, kept for good) plus a window of the latest steps, so a
    machine that drifts or a new model needs no retuning. Until it has seen
    `min_samples` steps and been anchored it is not ready, and the scheduler does not
    shape steps by it."""

    name = "online"

    def __init__(self, window: int = 512, refit_every: int = 32, min_samples: int = 8) -> None:
        self.anchors: list[tuple[list[float], float]] = []
        self.recent: deque[tuple[list[float], float]] = deque(maxlen=window)
        self.refit_every = refit_every
        self.min_samples = min_samples
        self.model: LinearStepModel | None = None
        self._num_since_fit = 0
        # each recent step's seconds over what the model then predicted for it
        self.late_ratios: deque[float] = deque(maxlen=window)
        self._late_factor = 1.0

    @property
    def is_ready(self) -> bool:
        """Fitted, and anchored by a warm-up: an engine that was never warmed up (offline
        `LLM.generate`, most tests) does not shape its steps."""
        return self.model is not None and bool(self.anchors)

    def observe(self, batch: BatchShape, seconds: float) -> None:
        """One timed step: its shape and the seconds from its start to the next step's."""
        if batch.num_seqs == 0 or seconds <= 0:
            return
        if self.model is not None:
            self.late_ratios.append(seconds / max(1e-9, step_seconds(self, batch)))
        self.recent.append((features(batch), seconds))
        self._num_since_fit += 1
        if self.model is None or self._num_since_fit >= self.refit_every:
            self.refit()

    def keep_as_anchors(self) -> None:
        """Keep every step seen so far for good (the end of the warm-up's grid)."""
        self.anchors.extend(self.recent)
        self.recent.clear()
        self.refit()

    def refit(self) -> None:
        samples = [*self.anchors, *self.recent]
        self._num_since_fit = 0
        if len(samples) >= self.min_samples:
            coef = fit_non_negative([f for f, _ in samples], [t for _, t in samples])
            self.model = LinearStepModel(coef)
        if len(self.late_ratios) >= self.min_samples:
            ratios = sorted(self.late_ratios)
            self._late_factor = max(1.0, ratios[int(LATE_QUANTILE * (len(ratios) - 1))])

    @property
    def late_factor(self) -> float:
        """The `LATE_QUANTILE` of the recent steps' measured over predicted time (at
        least 1; 1 until it has seen a few): the fit is right on average, and a step the
        size of a decode ran 1.3x its prediction one time in ten on a 2-core CPU."""
        return self._late_factor

    def forward_time(self, batch: BatchShape) -> float:
        return self.model.forward_time(batch) if self.model is not None else 0.0

    def describe(self) -> dict:
        fitted = self.model.describe() if self.model is not None else {}
        return {**fitted, "name": self.name, "num_anchors": len(self.anchors),
                "num_recent": len(self.recent)}  # fmt: skip
