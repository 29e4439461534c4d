"""Step-time predictors for the simulated model runner. The interface and the batch
summary it reads (`StepTimePredictor`, `BatchShape`) live in `core/step_time.py`, where
the scheduler consults the same interface to shape its steps. Implementations: `ConstantPredictor` (tests), `RooflinePredictor` (ceilings times
efficiencies, `roofline.py`) and `FittedPredictor` (a least-squares fit to real steps,
`fitted.py`).
"""

from __future__ import annotations

from superinfer.core.step_time import BatchShape, StepTimePredictor

__all__ = ["BatchShape", "ConstantPredictor", "StepTimePredictor"]


class ConstantPredictor(StepTimePredictor):
    """`step_s` per step plus `token_s` per scheduled token (tests and sanity checks)."""

    name = "constant"

    def __init__(self, step_s: float = 0.01, token_s: float = 0.0, host_s: float = 0.0) -> None:
        self.step_s, self.token_s, self.host_s = step_s, token_s, host_s

    def forward_time(self, batch: BatchShape) -> float:
        return self.step_s + self.token_s * batch.num_tokens

    def host_time(self, batch: BatchShape) -> float:
        return self.host_s

    def describe(self) -> dict:
        return {"name": self.name, "step_s": self.step_s, "token_s": self.token_s}
