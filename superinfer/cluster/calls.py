"""What the ingress sends to an engine replica and what comes back first (plain data:
it crosses processes, so no exceptions or live objects).

Each generation call is a Ray Serve streaming call whose first item is a `Verdict`: the
replica admitted the request (then its SSE events, or one `(status, body)` for a non-stream
request, follow), or refused it with the `Refusal` its admission raised. `demand_of` says
what a request needs and promises: both routers rank replicas by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from superinfer.cluster.router import Demand, Refusal
from superinfer.server.prepare import PreparedRequest


@dataclass(frozen=True)
class ReplicaCall:
    """One admitted-at-ingress request on its way to a replica."""

    prepared: PreparedRequest
    arrival_wall: float  # Unix time of the arrival stamp at ingress
    elapsed_s: float  # seconds from the arrival stamp to this dispatch (ingress clock)
    expected_tokens: int  # output tokens the deadline estimate assumes
    is_chat: bool
    demand: Demand
    exclude: frozenset[str] = field(default_factory=frozenset)  # replicas that refused it


@dataclass(frozen=True)
class Verdict:
    replica_id: str
    refusal: Refusal | None = None  # None: admitted
    estimated_ttft_ms: float | None = None  # the admitted request's, from arrival

    @property
    def is_admitted(self) -> bool:
        return self.refusal is None


def demand_of(
    prepared: PreparedRequest, expected_tokens: int, elapsed_s: float, arrival_wall: float
) -> Demand:
    """The request's needs and targets, as time left from now (its TTFT deadline, for a
    queue ordered by deadline, in Unix time)."""
    targets, floor = prepared.slo.targets, 1e-3
    deadline = targets.max_latency_ms
    return Demand(
        num_prompt_tokens=prepared.num_prompt_tokens,
        max_tokens=expected_tokens,
        ttft_s=max(floor, targets.ttft_s - elapsed_s),
        tbt_s=targets.tbt_s,
        deadline_s=None if deadline is None else max(floor, deadline / 1000 - elapsed_s),
        slo_class=targets.slo_class,
        ttft_deadline=arrival_wall + targets.ttft_s,
        prompt_token_ids=_prefix_cacheable(prepared),
    )


def _prefix_cacheable(prepared: PreparedRequest) -> tuple[int, ...]:
    """The prompt tokens a replica's prefix cache may hold (none when the request asks for
    its prompt's log-probabilities: every position runs through the model then)."""
    if prepared.params.prompt_logprobs is not None:
        return ()
    return tuple(prepared.prompt_token_ids)
