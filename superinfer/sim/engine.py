"""The simulated engine: the real `core` scheduler, KV manager and policy, driven in
virtual time by a predicted-time model runner and a `SimTransferEngine`.

Its step is `LLMEngine.step`'s: the same `core.step.StepLoop` in two events, with this
engine as the `StepBackend` (predicted forward times, virtual clock):

    without the pipeline   EngineStep(t): begin_step (schedule at t, submit copies); the
                           forward starts once the host work is done and the swap-ins landed
                           StepDone(its end): finish_step (update_from_output then)
    with the pipeline      EngineStep(t): begin_step (schedule step k+1 while step k computes)
                           StepLaunch(once k+1's swap-ins landed): finish_step (fill step k
                           when its forward ended, prune k+1, launch it) -> the loop comes
                           round at once

Arrivals wait in an inbox until the loop comes round (the benchmark replay adds them
between steps); finished copies are polled at the start of each step. An engine with
nothing to run goes idle and an arrival or a finished copy wakes it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from superinfer.core.outputs import ModelOutput, SchedulerOutput
from superinfer.core.request import Request
from superinfer.core.scheduler import Scheduler
from superinfer.core.step import StepBackend, StepLoop
from superinfer.sim.admission import SimAdmission
from superinfer.sim.events import EngineStep, Event, StepDone, StepLaunch
from superinfer.sim.runner import SimModelRunner
from superinfer.sim.transfer import SimTransferEngine


@dataclass
class UsageSample:
    """A point of the KV-usage timeline."""

    time: float
    num_running: int
    num_waiting: int
    num_swapped: int
    device_usage: float
    host_usage: float
    num_swap_outs: int
    num_preemptions: int


class PredictedForwards(StepBackend):
    """Forwards that take predicted time; the simulated engine sets the virtual times of the
    event that finishes a step (`now`, and `fill_time` with the pipeline) before it."""

    def __init__(self, runner: SimModelRunner, transfer: SimTransferEngine) -> None:
        self.runner, self.transfer = runner, transfer
        self.now = self.fill_time = 0.0

    def execute(self, output: SchedulerOutput) -> tuple[ModelOutput, float]:
        """The forward ends now (its duration was predicted when it was scheduled)."""
        return self.runner.execute(output), self.now

    def launch(self, output: SchedulerOutput) -> float:
        """Start it now; the handle is its predicted end, which later D2H copies wait for."""
        end = self.now + self.runner.duration(output)
        self.transfer.record_compute(end)
        return end

    def result(self, output: SchedulerOutput, handle: float) -> tuple[ModelOutput, float]:
        """Filled in once the forward and the next step's host work are both done."""
        return self.runner.execute(output), self.fill_time


class SimEngine:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: SimModelRunner,
        transfer: SimTransferEngine,
        is_pipelined: bool = True,
        check_invariants_every: int = 0,
        timeline_interval_s: float | None = None,
        admission: SimAdmission | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.transfer = transfer
        self.is_pipelined = is_pipelined
        self.check_invariants_every = check_invariants_every
        self.timeline_interval_s = timeline_interval_s
        self.timeline: list[UsageSample] = []
        self.rejected: list[Request] = []
        self.admission = admission  # None: every servable request is admitted
        self._inbox: list[Request] = []
        self._last_step_end: float | None = None  # while busy: when the last step ended
        self._step_end: float | None = None  # when the step in flight ends (no pipeline)
        self.forwards = PredictedForwards(runner, transfer)
        self.steps = StepLoop(scheduler, transfer, self.forwards, is_pipelined)
        self._is_busy = False  # an engine event is in the heap
        self._next_sample = 0.0

    # --- outside events -------------------------------------------------------------------
    def on_arrival(self, now: float, request: Request) -> Iterable[Event]:
        step_left_s = max(0.0, self._step_end - now) if self._step_end is not None else 0.0
        if not self._is_servable(request) or (
            self.admission is not None
            and not self.admission.admit(now, request, self.scheduler, self._inbox, step_left_s)
        ):
            self.rejected.append(request)
            return []
        self._inbox.append(request)
        return self._wake(now)

    def _is_servable(self, request: Request) -> bool:
        """False for a prompt the model cannot take or one the device pool can never hold
        (a real server answers 400 to the first; the second would wait forever)."""
        scheduler = self.scheduler
        if request.num_prompt_tokens >= scheduler.config.max_model_len:
            return False
        return (
            scheduler.kv.num_blocks_for(request.num_prompt_tokens + 1)
            <= scheduler.kv.device.num_blocks
        )

    def on_transfer_done(self, now: float, transfer_id: int) -> Iterable[Event]:
        self.transfer.mark_done(transfer_id)
        return self._wake(now)

    def _wake(self, now: float) -> list[Event]:
        if self._is_busy:
            return []
        self._is_busy = True
        return [EngineStep(now)]

    # --- the step -------------------------------------------------------------------------
    def step(self, now: float) -> list[Event]:
        """The loop comes round: take arrivals and finished copies, schedule, copy."""
        for request in self._inbox:
            self.scheduler.add_request(request)
        self._inbox = []
        output = self.steps.begin_step(now)
        host_done = now + self.runner.host_time(output)
        if self.is_pipelined:
            return self._after_schedule_pipelined(now, output, host_done)
        return self._after_schedule(now, output, host_done)

    def _after_schedule(self, now: float, output: SchedulerOutput, host_done: float) -> list[Event]:
        if output.is_empty and not output.finished_request_ids:
            return self._idle()
        start = max(host_done, self.transfer.ready_time(output.swap_in_transfer_ids))
        end = start + self.runner.duration(output)
        self._step_end = end
        return [StepDone(end, output)]

    def finish_step(self, now: float, output: SchedulerOutput) -> list[Event]:
        """Without the pipeline: the forward of `output` ends at `now`."""
        self.forwards.now = now
        self.steps.finish_step(output)
        self._after_update(now, output)
        return [EngineStep(now)]

    def _after_schedule_pipelined(
        self, now: float, output: SchedulerOutput, host_done: float
    ) -> list[Event]:
        inflight = self.steps.inflight
        if inflight is None and output.is_empty and not output.finished_request_ids:
            return self._idle()
        fill_time = max(host_done, inflight[1]) if inflight else host_done
        start = max(fill_time, self.transfer.ready_time(output.swap_in_transfer_ids))
        return [StepLaunch(start, output, fill_time)]

    def launch(self, now: float, output: SchedulerOutput, fill_time: float) -> list[Event]:
        """With the pipeline: fill the step in flight (at `fill_time`), launch `output` at
        `now`."""
        self.forwards.now, self.forwards.fill_time = now, fill_time
        self.steps.finish_step(output)
        self._after_update(now, output)
        return [EngineStep(now)]

    def _idle(self) -> list[Event]:
        self._is_busy = False
        self._last_step_end = self._step_end = None
        return []

    def _after_update(self, now: float, output: SchedulerOutput) -> None:
        if self.admission is not None and self._last_step_end is not None:
            self.admission.on_step(now, now - self._last_step_end, output, self.scheduler)
        self._last_step_end = now
        every = self.check_invariants_every
        if every and self.runner.counters.num_steps % every == 0:
            self.scheduler.check_invariants()
        if self.timeline_interval_s is not None and now >= self._next_sample:
            self._sample(now)
            self._next_sample = now + self.timeline_interval_s

    def _sample(self, now: float) -> None:
        s, kv = self.scheduler, self.scheduler.kv
        self.timeline.append(UsageSample(
            now, len(s.running), len(s.waiting), len(s.swapped), kv.device.usage, kv.host.usage,
            s.stats.num_swap_outs, s.stats.num_preemptions,
        ))  # fmt: skip

    # --- the end --------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return (
            bool(self._inbox)
            or self.scheduler.has_unfinished_requests
            or self.steps.inflight is not None
        )

    def abort_all(self, now: float) -> list[Request]:
        """Stop at `now`: abort every request not finished; returns them."""
        aborted = self._inbox
        self._inbox = []
        for request_id in list(self.scheduler.requests):
            aborted.append(self.scheduler.abort_request(request_id, now))
        self.steps.abandon()
        self.scheduler.complete_transfers(self.transfer.drain())
        return aborted
