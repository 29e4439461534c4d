"""Step-time noise: how much a real engine's steps vary around the predictor's mean.

A predictor gives the mean time of a batch; the real engine's steps scatter around it,
and not independently: on the shared CPU machine they come in spells (a run of steps
20-40% slow while another job holds the memory bus, then fast again). Queueing delay grows
with that variance, so a simulator of the mean step alone underestimates TTFT wherever
requests queue: against real runs at 1-2 req/s it was 10-35% low.

`StepNoise` multiplies each step's forward time by `exp(sigma * z - sigma^2 / 2)` (mean 1)
where `z` is an AR(1) process with lag-1 correlation `lag1` and unit variance. `sigma` and
`lag1` come from the log ratios of measured to predicted time over the served mix that
`superinfer calibrate` runs (`estimate`), and are saved with the fit. Seeded: the same
seed draws the same factors.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from superinfer.core.step_time import LATE_QUANTILE, BatchShape, StepTimePredictor


@dataclass(frozen=True)
class NoiseParams:
    sigma: float  # standard deviation of the log factor
    lag1: float  # correlation of consecutive steps' log factors, in [0, 1)

    def __post_init__(self) -> None:
        if self.sigma < 0 or not 0 <= self.lag1 < 1:
            raise ValueError(f"need sigma >= 0 and 0 <= lag1 < 1, got {self}")

    @property
    def is_exact(self) -> bool:
        return self.sigma == 0

    @classmethod
    def estimate(cls, measured_s: Sequence[float], predicted_s: Sequence[float]) -> NoiseParams:
        """From consecutive steps' measured and predicted times (in step order). The mean
        log ratio is removed: a bias of the fit is not noise."""
        logs = [math.log(m / p) for m, p in zip(measured_s, predicted_s) if m > 0 and p > 0]
        if len(logs) < 3:
            raise ValueError("need at least 3 steps to estimate step-time noise")
        mean = statistics.fmean(logs)
        centered = [x - mean for x in logs]
        variance = statistics.fmean(x * x for x in centered)
        if variance == 0:
            return cls(0.0, 0.0)
        lag1 = statistics.fmean(a * b for a, b in itertools.pairwise(centered)) / variance
        return cls(math.sqrt(variance), min(max(lag1, 0.0), 0.99))

    def to_dict(self) -> dict:
        return {"sigma": round(self.sigma, 4), "lag1": round(self.lag1, 4)}


class StepNoise:
    """Draws one mean-1 factor per step (see the module docstring)."""

    def __init__(self, params: NoiseParams, seed: int = 0) -> None:
        self.params = params
        self._rng = random.Random(seed)
        self._z = self._rng.gauss(0.0, 1.0)

    def factor(self) -> float:
        sigma, lag1 = self.params.sigma, self.params.lag1
        if sigma == 0:
            return 1.0
        self._z = lag1 * self._z + math.sqrt(1.0 - lag1 * lag1) * self._rng.gauss(0.0, 1.0)
        return math.exp(sigma * self._z - sigma * sigma / 2)


class NoisyStepModel(StepTimePredictor):
    """The scheduler's step-time model in a simulator whose steps carry `noise`: the
    predictor's mean times, and as late factor the noise's `LATE_QUANTILE` factor, as the
    real engine's model learns it from its own steps (`OnlineStepModel.late_factor`). With
    a late factor of 1 the guards of `core/token_guard.py` held steps to their limits by
    the mean alone, and the simulated gold first tokens they guard came up to 20% late
    where the real ones did not."""

    def __init__(self, predictor: StepTimePredictor, noise: NoiseParams) -> None:
        self.predictor = predictor
        self.name = predictor.name
        sigma = noise.sigma
        self._late_factor = max(1.0, math.exp(sigma * statistics.NormalDist().inv_cdf(LATE_QUANTILE)
                                              - sigma * sigma / 2))  # fmt: skip

    def forward_time(self, batch: BatchShape) -> float:
        return self.predictor.forward_time(batch)

    def host_time(self, batch: BatchShape) -> float:
        return self.predictor.host_time(batch)

    @property
    def is_ready(self) -> bool:
        return self.predictor.is_ready

    @property
    def late_factor(self) -> float:
        return self._late_factor

    def describe(self) -> dict:
        return self.predictor.describe()
