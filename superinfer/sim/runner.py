"""The simulated model runner: the real runner's `execute(output) -> ModelOutput`, with
the step's duration predicted instead of computed.

Every request ignores EOS and stops at its `max_tokens`, so the sampled values do not
matter: the runner samples `SAMPLED_TOKEN` for every sequence that samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from superinfer.core.outputs import ModelOutput, SchedulerOutput
from superinfer.sim.noise import StepNoise
from superinfer.sim.predictor import BatchShape, StepTimePredictor

SAMPLED_TOKEN = 1


@dataclass
class RunnerCounters:
    num_steps: int = 0  # forwards launched
    num_tokens: int = 0
    busy_s: float = 0.0  # time spent in forwards


class SimModelRunner:
    def __init__(self, predictor: StepTimePredictor, noise: StepNoise | None = None) -> None:
        self.predictor = predictor
        self.noise = noise
        self.counters = RunnerCounters()

    def duration(self, output: SchedulerOutput) -> float:
        """Seconds the forward of `output` takes (the predictor's mean times the step's
        noise factor); counts it as launched."""
        batch = BatchShape.of(output)
        seconds = self.predictor.forward_time(batch)
        if self.noise is not None:
            seconds *= self.noise.factor()
        self.counters.num_steps += 1
        self.counters.num_tokens += batch.num_tokens
        self.counters.busy_s += seconds
        return seconds

    def host_time(self, output: SchedulerOutput) -> float:
        """Host-side seconds of the step that scheduled `output`."""
        return self.predictor.host_time(BatchShape.of(output))

    def execute(self, output: SchedulerOutput) -> ModelOutput:
        return ModelOutput({s.request_id: SAMPLED_TOKEN for s in output.sequences if s.is_sampling})
