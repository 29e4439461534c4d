"""What admission reads of the step in flight: the forward's shape while it runs
(`LLMEngine.forward_in_flight`, on another thread than the engine's) and the time left in
it (`AsyncEngine.step_left_s`). No model: stand-ins for the runner and the engine."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from superinfer.core.outputs import ModelOutput, ScheduledSequence, SchedulerOutput
from superinfer.core.step_time import BatchShape
from superinfer.engine.async_engine import AsyncEngine
from superinfer.engine.llm_engine import _TimedRunner
from superinfer.engine.snapshot import EngineSnapshot
from superinfer.sampling_params import SamplingParams
from superinfer.slo.estimate import PrefillCost
from tests.factories import fake_model_output


def test_the_forward_is_in_flight_from_its_start_to_its_end():
    seen = []

    def execute(output: SchedulerOutput) -> ModelOutput:
        seen.append((timed.running.batch, timed.running.end))
        return fake_model_output(output)

    timed = _TimedRunner(SimpleNamespace(execute=execute), clock=lambda: 0.0)
    params = SamplingParams()
    output = SchedulerOutput(0, [ScheduledSequence("r", [5] * 40, 0, [], True, params, 0)])
    timed.execute(output)
    assert seen == [(output, None)]  # in flight during the call
    assert timed.running.end is not None  # and over once it returned


def engine_in_a_step(shape: BatchShape | None, elapsed_s: float) -> AsyncEngine:
    engine = AsyncEngine(lambda: None)
    engine._engine = SimpleNamespace(clock=lambda: 100.0, forward_in_flight=lambda: shape)
    engine._step_started = 100.0 - elapsed_s
    engine._prefill_cost = PrefillCost(prior_s_per_token=1e-3)  # 1 ms a prompt token
    engine.snapshot = replace(EngineSnapshot(), step_time_s=0.06, decode_step_s=0.02)
    return engine


@pytest.mark.parametrize(
    ("shape", "elapsed_s", "expected_s"),
    [
        # 400 prompt tokens beside 8 decodes: 0.02 + 0.4, of which 0.05 has run
        (BatchShape.of_lists([400] + [1] * 8, [0] + [100] * 8), 0.05, 0.37),
        (BatchShape.of_lists([1] * 8, [100] * 8), 0.005, 0.015),  # decodes only
        (BatchShape.of_lists([1] * 8, [100] * 8), 0.5, 0.0),  # overdue: nothing left
        (None, 0.01, 0.05),  # between forwards: the mean step's rest
    ],
)
def test_the_step_left_is_the_forwards_cost_less_what_has_run(shape, elapsed_s, expected_s):
    assert engine_in_a_step(shape, elapsed_s).step_left_s() == pytest.approx(expected_s)


def test_no_step_no_time_left():
    engine = engine_in_a_step(None, 0.0)
    engine._step_started = None
    assert engine.step_left_s() == 0.0
