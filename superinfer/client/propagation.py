"""Send a budget's `x-slo-*` headers on every call, so no caller sets them by hand.

An httpx request hook stamps each request as it is sent (retries included, each with what
is left then): with the budget it was made for, or else the current one
(`Budget.active()`), so one long-lived client serves many requests, each under its own
budget. The OpenAI SDK takes such a client (`openai.OpenAI(http_client=...)`).

    budget = Budget.of_ms(2000)
    client = openai_client(base_url="http://localhost:8000/v1", api_key="...")
    with budget.active():
        client.chat.completions.create(...)  # carries x-slo-max-latency and x-slo-deadline

Headers the caller set on a request itself are left alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from superinfer.client.budget import Budget, current_budget

if TYPE_CHECKING:
    import httpx
    import openai

RequestHook = Callable[["httpx.Request"], None]
AsyncRequestHook = Callable[["httpx.Request"], Awaitable[None]]


def stamp(request: httpx.Request, budget: Budget | None = None) -> None:
    """Set the headers of `budget` (else the current one) on `request`, unless it has them."""
    budget = budget or current_budget()
    if budget is None:
        return
    for name, value in budget.headers().items():
        request.headers.setdefault(name, value)


def request_hook(budget: Budget | None = None) -> RequestHook:
    """An httpx `event_hooks={"request": [...]}` hook for `httpx.Client`."""
    return lambda request: stamp(request, budget)


def async_request_hook(budget: Budget | None = None) -> AsyncRequestHook:
    """The same for `httpx.AsyncClient` (its hooks are coroutines)."""

    async def hook(request: httpx.Request) -> None:
        stamp(request, budget)

    return hook


def httpx_client(budget: Budget | None = None, **kwargs: Any) -> httpx.Client:
    """An `httpx.Client` that stamps every request (`kwargs` go to the client)."""
    import httpx

    return httpx.Client(event_hooks={"request": [request_hook(budget)]}, **kwargs)


def async_httpx_client(budget: Budget | None = None, **kwargs: Any) -> httpx.AsyncClient:
    import httpx

    return httpx.AsyncClient(event_hooks={"request": [async_request_hook(budget)]}, **kwargs)


def openai_client(budget: Budget | None = None, **kwargs: Any) -> openai.OpenAI:
    """An `openai.OpenAI` whose calls carry the budget's headers (`kwargs`: the SDK's)."""
    import openai

    timeout = kwargs.get("timeout", openai.DEFAULT_TIMEOUT)
    return openai.OpenAI(http_client=httpx_client(budget, timeout=timeout), **kwargs)


def async_openai_client(budget: Budget | None = None, **kwargs: Any) -> openai.AsyncOpenAI:
    import openai

    timeout = kwargs.get("timeout", openai.DEFAULT_TIMEOUT)
    return openai.AsyncOpenAI(http_client=async_httpx_client(budget, timeout=timeout), **kwargs)
