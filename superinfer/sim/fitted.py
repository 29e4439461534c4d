"""A step-time predictor fitted to steps timed on the real engine.

    forward = dense(tokens) + c1 x sampled sequences + c2 x prefill attention pairs
              + c3 x decode context + c4 x prefill context + c5 x sequences
    host    = h0 + h1 x sequences

`dense` is piecewise linear in the step's token count, with knots about 1.5x apart up to
the engine's token budget (`token_knots`): the linear layers run every token of a step as
one matrix of that many rows, and their time is flat while they are bound by reading the
weights, then grows with the rows (and in steps, where the CPU's linear layers pad rows
to buckets). A single slope per token, fitted to batches of 1 and 64, missed this: on the
served mix of 3-14 decodes it was 10-25% slow. The attention terms are linear in what
they read or compute.

Both fits are non-negative least squares over (batch shape, seconds) samples that
`superinfer calibrate` collects. The fit is saved as JSON with its knots, the samples and
its own error on them, so a reader can see where it may be trusted.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from superinfer.sim.predictor import BatchShape, StepTimePredictor

PROFILES_DIR = os.path.join(os.path.dirname(__file__), "profiles")

LINEAR_FEATURES = ("sampled", "prefill_pairs", "decode_context", "prefill_context", "seqs")
HOST_FEATURES = ("const", "seqs")


def token_knots(max_num_tokens: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5 times them), then the
    budget itself."""
    knots, power = [1], 1
    while power < max_num_tokens:
        knots += [k for k in (power * 3 // 2, power * 2) if knots[-1] < k < max_num_tokens]
        power *= 2
    return [*knots, max_num_tokens] if knots[-1] < max_num_tokens else knots


def interpolation_weights(x: float, knots: Sequence[int]) -> list[float]:
    """Weights w with sum(w[k] * f(knots[k])) the piecewise-linear interpolation of f at
    x; below the first knot it holds the first value, past the last it extends the last
    segment."""
    weights = [0.0] * len(knots)
    if len(knots) == 1 or x <= knots[0]:
        weights[0] = 1.0
        return weights
    upper = min(max(bisect.bisect_left(knots, x), 1), len(knots) - 1)
    lower = upper - 1
    t = (x - knots[lower]) / (knots[upper] - knots[lower])
    weights[lower], weights[upper] = 1.0 - t, t
    return weights


def forward_features(batch: BatchShape, knots: Sequence[int]) -> list[float]:
    return interpolation_weights(batch.num_tokens, knots) + [
        batch.num_sampled, batch.num_prefill_pairs, batch.num_decode_context,
        batch.num_prefill_context, batch.num_seqs,
    ]  # fmt: skip


def host_features(batch: BatchShape) -> list[float]:
    return [1.0, batch.num_seqs]


SAMPLE_COLUMNS = (
    "num_seqs", "num_prefill_tokens", "num_decode_tokens", "num_sampled", "num_prefill_pairs",
    "num_decode_context", "num_prefill_context",
)  # fmt: skip


def sample_row(sample: StepSample) -> list[float]:
    batch = sample.batch
    return [getattr(batch, name) for name in SAMPLE_COLUMNS] + [
        round(sample.forward_s, 6),
        round(sample.host_s, 6),
    ]


@dataclass(frozen=True)
class StepSample:
    """One timed step of the real engine."""

    batch: BatchShape
    forward_s: float
    host_s: float


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson active set): argmin |a x - b|, x >= 0."""
    num_features = a.shape[1]
    x = np.zeros(num_features)
    passive = np.zeros(num_features, dtype=bool)
    for _ in range(max_iter):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > 1e-12 * max(1.0, np.abs(gradient).max()))
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            z = np.zeros(num_features)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            shrinking = passive & (z <= 0)
            alpha = np.min(x[shrinking] / (x[shrinking] - z[shrinking]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


def _fit(rows: list[list[float]], targets: list[float]) -> tuple[list[float], float]:
    """Coefficients, scaled per column for conditioning, and the mean relative error."""
    a = np.array(rows, dtype=float)
    b = np.array(targets, dtype=float)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    # weight rows by 1/target: minimize relative error, so short steps count as much as long
    weights = 1.0 / np.maximum(b, 1e-6)
    coef = nnls(a / scale * weights[:, None], b * weights) / scale
    relative = np.abs(a @ coef - b) / np.maximum(b, 1e-9)
    return coef.tolist(), float(relative.mean())


class FittedPredictor(StepTimePredictor):
    name = "fitted"

    def __init__(
        self,
        knots: Sequence[int],
        forward_coef: Sequence[float],
        host_coef: Sequence[float],
        meta: dict | None = None,
    ) -> None:
        if list(knots) != sorted(set(knots)) or not knots or knots[0] < 1:
            raise ValueError(f"token knots must be increasing positive counts, got {knots}")
        if len(forward_coef) != len(knots) + len(LINEAR_FEATURES):
            raise ValueError("forward coefficients do not match the knots and features")
        if len(host_coef) != len(HOST_FEATURES):
            raise ValueError("host coefficients do not match the features")
        self.knots = list(knots)
        self.forward_coef = list(forward_coef)
        self.host_coef = list(host_coef)
        self.meta = dict(meta or {})

    def forward_time(self, batch: BatchShape) -> float:
        if batch.num_seqs == 0:
            return 0.0
        features = forward_features(batch, self.knots)
        return max(0.0, sum(c * f for c, f in zip(self.forward_coef, features)))

    def host_time(self, batch: BatchShape) -> float:
        return sum(c * f for c, f in zip(self.host_coef, host_features(batch)))

    @classmethod
    def fit(
        cls,
        samples: Sequence[StepSample],
        max_num_tokens: int,
        meta: dict | None = None,
        keep_samples: bool = True,
    ) -> FittedPredictor:
        """Fit to `samples` with knots up to `max_num_tokens` (the engine's token budget).
        Knots no sample reaches are dropped: their value would be a guess."""
        knots = token_knots(max_num_tokens)
        reached = {i for s in samples for i, w in
                   enumerate(interpolation_weights(s.batch.num_tokens, knots)) if w > 0}  # fmt: skip
        knots = [k for i, k in enumerate(knots) if i in reached]
        num_features = len(knots) + len(LINEAR_FEATURES)
        if len(samples) < num_features:
            raise ValueError(f"need at least {num_features} samples, got {len(samples)}")
        forward, forward_err = _fit([forward_features(s.batch, knots) for s in samples],
                                    [s.forward_s for s in samples])  # fmt: skip
        host, host_err = _fit(
            [host_features(s.batch) for s in samples], [s.host_s for s in samples]
        )
        meta = dict(meta or {})
        meta.update(num_samples=len(samples), forward_mean_rel_error=round(forward_err, 4),
                    host_mean_rel_error=round(host_err, 4))  # fmt: skip
        if keep_samples:
            meta["sample_columns"] = [*SAMPLE_COLUMNS, "forward_s", "host_s"]
            meta["samples"] = [sample_row(s) for s in samples]
        return cls(knots, forward, host, meta)

    def relative_errors(self, samples: Sequence[StepSample]) -> list[float]:
        """(predicted - measured) / measured forward time of each sample."""
        return [(self.forward_time(s.batch) - s.forward_s) / s.forward_s for s in samples]

    @staticmethod
    def samples_of(data: dict) -> list[StepSample]:
        """The samples a saved fit kept (to refit or to check it)."""
        return [
            StepSample(BatchShape(*row[:-2]), row[-2], row[-1])
            for row in data.get("meta", {}).get("samples", [])
        ]

    # --- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        num_knots = len(self.knots)
        return {
            "predictor": self.name,
            "token_knots": self.knots,
            "forward": {
                "dense_at_knots": self.forward_coef[:num_knots],
                **dict(zip(LINEAR_FEATURES, self.forward_coef[num_knots:])),
            },
            "host": dict(zip(HOST_FEATURES, self.host_coef)),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict) -> FittedPredictor:
        if "token_knots" not in data:
            raise ValueError("a fit from an older superinfer (no token knots): rerun "
                             "`superinfer calibrate` to refit it")  # fmt: skip
        forward = data["forward"]
        coef = [float(v) for v in forward["dense_at_knots"]]
        coef += [float(forward[name]) for name in LINEAR_FEATURES]
        host = [float(data["host"][name]) for name in HOST_FEATURES]
        return cls([int(k) for k in data["token_knots"]], coef, host, data.get("meta"))

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str) -> FittedPredictor:
        if not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(PROFILES_DIR, path)
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def describe(self) -> dict:
        """The fit without its samples."""
        data = {"name": self.name, **self.to_dict()}
        data["meta"] = {
            k: v for k, v in self.meta.items() if k not in ("samples", "sample_columns")
        }
        return data
