"""The step protocol (core/step.py): the order of a step, with and without the pipeline,
on a real scheduler with a fake model and a fake transfer engine that log every call."""

from __future__ import annotations

import re

import pytest

from superinfer.core.kv.transfer import TransferEngine, TransferSpec
from superinfer.core.outputs import ModelOutput, SchedulerOutput
from superinfer.core.step import StepBackend, StepLoop
from tests.factories import fake_model_output, make_request, make_scheduler


class LoggingTransfer(TransferEngine):
    """Copies that land at the next poll."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.pending: list[int] = []

    def submit(self, spec: TransferSpec) -> None:
        self.log.append("submit")
        self.pending.append(spec.transfer_id)

    def poll_finished(self) -> list[int]:
        self.log.append("poll")
        done, self.pending = self.pending, []
        return done

    def wait(self, transfer_ids=None) -> None:
        self.log.append("wait")


class FakeForwards(StepBackend):
    """The fake model; a forward's result is in hand at time `now`."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.now = 0.0

    def execute(self, output: SchedulerOutput) -> tuple[ModelOutput, float]:
        self.log.append("execute")
        return fake_model_output(output), self.now

    def launch(self, output: SchedulerOutput) -> ModelOutput:
        self.log.append("launch")
        assert all(t >= 0 for seq in output.sequences for t in seq.token_ids), "unpruned"
        return fake_model_output(output)

    def result(self, output: SchedulerOutput, handle: ModelOutput) -> tuple[ModelOutput, float]:
        self.log.append("result")
        return handle, self.now


def make_loop(is_pipelined: bool, **scheduler_options) -> tuple[StepLoop, list[str]]:
    log: list[str] = []
    scheduler = make_scheduler(**scheduler_options)
    return StepLoop(scheduler, LoggingTransfer(log), FakeForwards(log), is_pipelined), log


def run(loop: StepLoop, max_steps: int = 10_000) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for step in range(max_steps):
        if not loop.scheduler.has_unfinished_requests and loop.inflight is None:
            return tokens
        loop.backend.now = step * 0.01
        for update in loop.step(step * 0.01):
            tokens.setdefault(update.request_id, []).extend(update.new_token_ids)
        loop.scheduler.check_invariants()
    raise AssertionError("did not finish")


def test_a_plain_step_schedules_copies_waits_executes_then_updates():
    loop, log = make_loop(is_pipelined=False, policy="fcfs-swap", num_device_blocks=8)
    for i in range(3):
        loop.scheduler.add_request(make_request(12, max_tokens=12, request_id=f"r{i}"))
    run(loop)
    assert loop.scheduler.stats.num_swap_ins > 0  # the pool is tight: copies both ways
    steps = " ".join(log).split("poll")[1:]
    # each step: poll, then its copies, the wait for its swap-ins, and the forward
    assert all(re.fullmatch(r"( submit)*( wait)? execute ?", s) for s in steps), steps
    assert any("wait" in s for s in steps)


def test_a_pipelined_step_fills_the_last_one_before_it_launches_the_next():
    loop, log = make_loop(is_pipelined=True)
    loop.scheduler.add_request(make_request(8, max_tokens=3, request_id="a"))
    loop.step(0.0)
    assert log == ["poll", "launch"] and loop.inflight is not None
    log.clear()
    updates = loop.step(0.01)
    assert log == ["poll", "result", "launch"]
    assert [u.request_id for u in updates] == ["a"]


@pytest.mark.parametrize("policy", ["fcfs-recompute", "rotasched", "ddps"])
def test_both_orders_generate_the_same_tokens(policy):
    results = []
    for is_pipelined in (False, True):
        loop, _ = make_loop(is_pipelined, policy=policy, num_device_blocks=24)
        for i in range(6):
            loop.scheduler.add_request(make_request(10 + 3 * i, max_tokens=9, request_id=f"r{i}"))
        results.append(run(loop))
    assert results[0] == results[1]
    assert all(len(t) == 9 for t in results[0].values())


def test_abandon_waits_for_the_forward_and_releases_its_fence():
    loop, log = make_loop(is_pipelined=True)
    loop.scheduler.add_request(make_request(8, max_tokens=5, request_id="a"))
    loop.step(0.0)
    loop.scheduler.abort_request("a", 0.0)  # its blocks are fenced while the forward runs
    assert loop.scheduler.kv.device.num_quarantined_blocks > 0
    loop.abandon()
    assert log[-1] == "result" and loop.inflight is None
    assert loop.scheduler.kv.device.num_quarantined_blocks == 0
    loop.scheduler.check_invariants()
