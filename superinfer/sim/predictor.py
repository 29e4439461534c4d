"""The step-time predictor interface and the batch summary it reads.

A predictor answers "how long does this batch take?" for the simulated model runner.
Implementations: `ConstantPredictor` (tests), `RooflinePredictor` (ceilings times
efficiencies, `roofline.py`) and `FittedPredictor` (a least-squares fit to real steps,
`fitted.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
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

    def host_time(self, batch: BatchShape) -> float:
        """Seconds the engine's host side spends per step outside the forward (scheduling,
        output processing). With the step pipeline it overlaps the previous forward."""
        return 0.0

    def describe(self) -> dict:
        """Parameters worth recording next to a result."""
        return {"name": self.name}


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
