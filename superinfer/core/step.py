"""The order of one engine step, written once for the real engine and the simulator.

    without the pipeline   begin_step(now):  complete landed copies, schedule, submit copies
                           finish_step:      wait for the swap-ins, execute, update_from_output
    with the pipeline      begin_step(now):  complete landed copies, schedule step k+1, submit
                                             its copies (while step k computes)
                           finish_step:      fill step k with its result, prune k+1, wait for
                                             its swap-ins, launch k+1, advance

What differs between the two engines is behind `StepBackend`: how a forward runs and when
its result is in hand (the wall clock after a real forward, a predicted virtual time in the
simulator). Copies go through the `TransferEngine` interface, whose `wait` blocks for real
copies and checks the virtual clock for simulated ones. The real engine runs both halves
back to back (`step`); the simulator runs `finish_step` as a later event.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from superinfer.core.kv.transfer import TransferEngine
from superinfer.core.outputs import ModelOutput, RequestUpdate, SchedulerOutput
from superinfer.core.scheduler import Scheduler


class StepBackend(ABC):
    """How an engine runs a forward; the step order around it is `StepLoop`'s."""

    @abstractmethod
    def execute(self, output: SchedulerOutput) -> tuple[ModelOutput, float]:
        """Run `output`'s forward to its end (no pipeline): its sampled tokens and the time
        on the engine's clock when they were in hand."""

    @abstractmethod
    def launch(self, output: SchedulerOutput) -> Any:
        """Start `output`'s forward (pipeline) and return a handle for `result`."""

    @abstractmethod
    def result(self, output: SchedulerOutput, handle: Any) -> tuple[ModelOutput, float]:
        """Wait for the forward `launch` started: its sampled tokens and the time on the
        engine's clock when they were in hand."""


class StepLoop:
    """One step of a scheduler driven through a transfer engine and a `StepBackend`."""

    def __init__(
        self,
        scheduler: Scheduler,
        transfer: TransferEngine,
        backend: StepBackend,
        is_pipelined: bool,
    ) -> None:
        self.scheduler = scheduler
        self.transfer = transfer
        self.backend = backend
        self.is_pipelined = is_pipelined
        self.inflight: tuple[SchedulerOutput, Any] | None = None  # (step, launch handle)

    def step(self, now: float) -> list[RequestUpdate]:
        """Both halves back to back; the updates of the requests that advanced."""
        return self.finish_step(self.begin_step(now))

    def begin_step(self, now: float) -> SchedulerOutput:
        """Record landed copies, schedule at `now` and submit the step's copies."""
        self.scheduler.complete_transfers(self.transfer.poll_finished())
        output = self.scheduler.schedule(now)
        for spec in output.transfers:
            self.transfer.submit(spec)
        return output

    def finish_step(self, output: SchedulerOutput) -> list[RequestUpdate]:
        """Run `output` (or, with the pipeline, finish the step in flight and launch it)."""
        if not self.is_pipelined:
            self._wait_swap_ins(output)
            model_output, now = self.backend.execute(output)
            return self.scheduler.update_from_output(output, model_output, now)
        updates = self._fill_inflight()
        self.scheduler.prune(output)
        self._wait_swap_ins(output)
        if output.sequences or output.finished_request_ids:
            self.inflight = (output, self.backend.launch(output))
            self.scheduler.advance(output)
        return updates

    def abandon(self) -> None:
        """Shutting down: wait for the forward in flight, never fill it in."""
        if self.inflight is not None:
            output, handle = self.inflight
            self.inflight = None
            self.backend.result(output, handle)
            self.scheduler.abandon_step()

    def _fill_inflight(self) -> list[RequestUpdate]:
        if self.inflight is None:
            return []
        output, handle = self.inflight
        self.inflight = None
        model_output, now = self.backend.result(output, handle)
        return self.scheduler.fill(output, model_output, now)

    def _wait_swap_ins(self, output: SchedulerOutput) -> None:
        if output.swap_in_transfer_ids:
            self.transfer.wait(output.swap_in_transfer_ids)
