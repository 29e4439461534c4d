"""Client helpers: latency budgets for sub-requests, propagated as gRPC propagates
deadlines (docs/budgets.md).

- `budget`: a `Budget` bound once, its shares and nested budgets, steps with a fallback;
- `propagation`: httpx and OpenAI-SDK clients that send the budget's `x-slo-*` headers.

No server imports: a client needs only this package (and httpx / openai for the clients).
"""

from __future__ import annotations

from superinfer.client.budget import RETRIEVAL_SHARE, Budget, BudgetExpired, current_budget
from superinfer.client.propagation import (
    async_httpx_client,
    async_openai_client,
    httpx_client,
    openai_client,
)

__all__ = [
    "RETRIEVAL_SHARE",
    "Budget",
    "BudgetExpired",
    "async_httpx_client",
    "async_openai_client",
    "current_budget",
    "httpx_client",
    "openai_client",
]
