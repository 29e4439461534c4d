"""A step-time predictor fitted to steps timed on the real engine.

    forward = c0 + c1 x prefill tokens + c2 x decode tokens + c3 x prefill attention pairs
              + c4 x decode context + c5 x sampled sequences
    host    = h0 + h1 x sequences

Both fits are non-negative least squares over (batch shape, seconds) samples that
`superinfer calibrate` collects. The fit is saved as JSON with the samples' ranges and
its own error on them, so a reader can see where it may be trusted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from superinfer.sim.predictor import BatchShape, StepTimePredictor

PROFILES_DIR = os.path.join(os.path.dirname(__file__), "profiles")

FORWARD_FEATURES = (
    "const", "prefill_tokens", "decode_tokens", "prefill_pairs", "decode_context", "sampled",
)  # fmt: skip
HOST_FEATURES = ("const", "seqs")


def forward_features(batch: BatchShape) -> list[float]:
    return [
        1.0, batch.num_prefill_tokens, batch.num_decode_tokens, batch.num_prefill_pairs,
        batch.num_decode_context, batch.num_sampled,
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
        self, forward_coef: Sequence[float], host_coef: Sequence[float], meta: dict | None = None
    ) -> None:
        if len(forward_coef) != len(FORWARD_FEATURES) or len(host_coef) != len(HOST_FEATURES):
            raise ValueError("coefficient counts do not match the features")
        self.forward_coef = list(forward_coef)
        self.host_coef = list(host_coef)
        self.meta = dict(meta or {})

    def forward_time(self, batch: BatchShape) -> float:
        if batch.num_seqs == 0:
            return 0.0
        return sum(c * f for c, f in zip(self.forward_coef, forward_features(batch)))

    def host_time(self, batch: BatchShape) -> float:
        return sum(c * f for c, f in zip(self.host_coef, host_features(batch)))

    @classmethod
    def fit(
        cls, samples: Sequence[StepSample], meta: dict | None = None, keep_samples: bool = True
    ) -> FittedPredictor:
        if len(samples) < len(FORWARD_FEATURES):
            raise ValueError(f"need at least {len(FORWARD_FEATURES)} samples, got {len(samples)}")
        forward, forward_err = _fit([forward_features(s.batch) for s in samples],
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
        return cls(forward, host, meta)

    @staticmethod
    def samples_of(data: dict) -> list[StepSample]:
        """The samples a saved fit kept (to refit or to check it)."""
        return [
            StepSample(BatchShape(*row[:-2]), row[-2], row[-1])
            for row in data.get("meta", {}).get("samples", [])
        ]

    # --- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "predictor": self.name,
            "forward": dict(zip(FORWARD_FEATURES, self.forward_coef)),
            "host": dict(zip(HOST_FEATURES, self.host_coef)),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict) -> FittedPredictor:
        forward = [float(data["forward"][name]) for name in FORWARD_FEATURES]
        host = [float(data["host"][name]) for name in HOST_FEATURES]
        return cls(forward, host, data.get("meta"))

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
