"""The client's budget arithmetic (driven by a clock the test sets, no sleeps), its headers,
and the steps that fall back when their share runs out."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from superinfer.client import Budget, BudgetExpired, current_budget
from superinfer.client.propagation import async_request_hook, request_hook
from superinfer.server.arrival import Arrival
from superinfer.slo.binding import bind_slo
from superinfer.slo.classes import SLOConfig

WALL = 1_700_000_000.0  # Unix seconds when the budgets are bound


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self, now: float = 50.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def bound(total_ms: float = 2000, clock: Clock | None = None) -> tuple[Budget, Clock]:
    clock = clock or Clock()
    return Budget.of_ms(total_ms, wall=WALL, clock=clock), clock


def test_remaining_counts_down_on_the_clock_and_expires():
    budget, clock = bound(2000)
    assert budget.remaining_ms() == 2000 and not budget.is_expired()
    clock.now += 1.5
    assert budget.remaining_ms() == pytest.approx(500)
    clock.now += 0.6
    assert budget.remaining_ms() == 0 and budget.is_expired()
    with pytest.raises(BudgetExpired):
        budget.check()
    assert budget.remaining_ms(now=clock.now - 2.0) == pytest.approx(1900)  # `now` given


def test_a_share_is_of_what_is_left_and_nests():
    budget, clock = bound(2000)
    retrieval = budget.share()  # 30% by default
    assert retrieval.remaining_ms() == pytest.approx(600)
    clock.now += 0.4
    rerank = retrieval.share(0.5)  # half of the 200 ms retrieval has left
    assert rerank.remaining_ms() == pytest.approx(100)
    assert budget.remaining_ms() == pytest.approx(1600)  # a share takes nothing from the parent
    with pytest.raises(ValueError):
        budget.share(0)


def test_a_child_never_outlives_its_parent():
    budget, clock = bound(1000)
    assert budget.child(300).remaining_ms() == pytest.approx(300)
    assert budget.child(5000).deadline == budget.deadline
    clock.now += 0.9
    assert budget.child(300).remaining_ms() == pytest.approx(100)
    assert budget.child().deadline == budget.deadline


def test_the_absolute_deadline_is_fixed_at_binding_and_nested_budgets_agree():
    budget, clock = bound(2000)
    assert budget.deadline_epoch_ms == WALL * 1000 + 2000
    clock.now += 0.5
    share = budget.share(0.5)  # 750 ms from now, now being 500 ms after binding
    assert share.deadline_epoch_ms == pytest.approx(WALL * 1000 + 1250)
    assert share.headers() == {"x-slo-max-latency": "750", "x-slo-deadline": "1700000001250"}


def test_clock_skew_does_not_matter():
    """The wall clock is read once, at binding: a client clock stepped afterwards changes
    neither what is left nor what is sent. And the server holds the stricter of the two
    headers, so a deadline skewed late cannot loosen the relative budget."""
    clock = Clock()
    budget = Budget.of_ms(2000, wall=WALL, clock=clock)
    skewed = Budget.until(budget.deadline_epoch_ms, now=clock.now, wall=WALL + 0.25, clock=clock)
    assert skewed.remaining_ms() == pytest.approx(1750)  # an upstream 250 ms in the past
    clock.now += 1.0
    assert budget.headers()["x-slo-max-latency"] == "1000"
    arrival = Arrival(monotonic=0.0, wall=WALL + 60.0)  # a server clock a minute ahead
    late = {**budget.headers(), "x-slo-deadline": str(budget.deadline_epoch_ms + 60_000)}
    targets = bind_slo(late, None, SLOConfig(), arrival).targets
    assert targets.max_latency_ms == 1000  # the relative budget held, not the skewed one


def test_a_relative_only_budget_sends_no_absolute_deadline_nor_do_its_children():
    budget, clock = bound(2000)
    relative = budget.relative_only()
    assert relative.headers() == {"x-slo-max-latency": "2000"}
    clock.now += 1.0
    assert relative.share(0.5).headers() == {"x-slo-max-latency": "500"}


def test_from_headers_takes_the_stricter_as_the_server_does():
    clock = Clock()
    both = {"x-slo-max-latency": "800", "x-slo-deadline": str(WALL * 1000 + 500)}
    assert Budget.from_headers(both, wall=WALL, clock=clock).remaining_ms() == pytest.approx(500)
    relative = Budget.from_headers({"x-slo-max-latency": "800"}, wall=WALL, clock=clock)
    assert relative.remaining_ms() == pytest.approx(800)
    assert Budget.from_headers({}, clock=clock) is None


def test_an_expired_budget_still_sends_a_positive_budget_for_the_server_to_refuse():
    budget, clock = bound(100)
    clock.now += 5
    assert budget.headers()["x-slo-max-latency"] == "1"


def test_the_httpx_hook_stamps_each_request_with_its_budget_or_the_current_one():
    budget, clock = bound(2000)
    seen = []
    transport = httpx.MockTransport(lambda request: seen.append(request) or httpx.Response(200))
    with httpx.Client(transport=transport, event_hooks={"request": [request_hook()]}) as client:
        client.get("http://x/")  # no budget active: no headers
        with budget.active():
            client.get("http://x/")
            clock.now += 0.5
            client.get("http://x/", headers={"x-slo-max-latency": "10"})  # the caller's own
        assert current_budget() is None
    assert "x-slo-max-latency" not in seen[0].headers
    assert seen[1].headers["x-slo-max-latency"] == "2000"
    assert seen[1].headers["x-slo-deadline"] == str(int(WALL * 1000 + 2000))
    assert seen[2].headers["x-slo-max-latency"] == "10"


def test_the_async_hook():
    budget, _ = bound(1500)
    seen = []

    async def main() -> None:
        transport = httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(200))
        hooks = {"request": [async_request_hook(budget)]}
        async with httpx.AsyncClient(transport=transport, event_hooks=hooks) as client:
            await client.get("http://x/")

    asyncio.run(main())
    assert seen[0].headers["x-slo-max-latency"] == "1500"


def test_a_slow_step_falls_back_and_leaves_the_rest_of_the_budget():
    budget = Budget.of_ms(1000)
    release = threading.Event()

    def slow(step: Budget) -> str:
        release.wait(5)
        return "documents"

    start = time.monotonic()
    assert budget.run_with_timeout(slow, 0.1, fallback="no context") == "no context"
    assert time.monotonic() - start < 0.5  # gave up after its 100 ms share
    assert budget.remaining_ms() > 500
    release.set()


def test_a_fast_step_returns_its_value_with_its_budget_active():
    budget = Budget.of_ms(2000)

    def fast(step: Budget) -> tuple[Budget | None, float]:
        return current_budget(), step.remaining_ms()

    active, remaining = budget.run_with_timeout(fast, 0.5, fallback=None)
    assert active is not None and active.deadline < budget.deadline and 0 < remaining <= 1000
    with pytest.raises(ZeroDivisionError):  # errors are not fallbacks
        budget.run_with_timeout(lambda step: 1 / 0, fallback=0)


def test_an_expired_budget_does_not_start_the_step():
    budget, clock = bound(100)
    clock.now += 1
    calls = []
    assert budget.run_with_timeout(calls.append, fallback="fallback") == "fallback"
    assert calls == []


def test_the_async_step_is_cancelled_when_its_share_runs_out():
    budget = Budget.of_ms(1000)
    cancelled = []

    async def slow(step: Budget) -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "documents"

    async def fast(step: Budget) -> Budget | None:
        return current_budget()

    assert asyncio.run(budget.arun_with_timeout(slow, 0.05, "no context")) == "no context"
    assert cancelled == [True]
    assert asyncio.run(budget.arun_with_timeout(fast, 0.5)) is not None
