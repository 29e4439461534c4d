"""SLO-aware replica choice: rank replicas by the predicted slack of this request.

Pure functions over plain dataclasses (no Ray, no clock): the Ray Serve request router
(`ray_router.py`) feeds them each replica's last reported load plus what it routed since,
and tries replicas in the order they return. Admission stays with the replicas: the
ingress moves to the next replica when one refuses, and rejects only when all refused
(`merge_rejections`).

Prediction, per replica (the server's own admission estimate, `Admission.estimate_s`):
- TTFT: prompt tokens queued ahead plus this prompt, at the measured prefill cost per
  token, plus one step;
- time between tokens: the current step time, scaled by the batch it will share: the
  running requests, those rotated out to the host tier (they take turns on the device),
  those queued or routed since the last report, and this one, over the running ones
  (linear in the batch: right for a CPU, pessimistic for a GPU's small batches, where it
  still spreads load);
- end to end: TTFT plus (max_tokens - 1) steps.
Slack is the smallest of (target - predicted) / target over the targets the request has,
so a replica is better when its worst-threatened target has more room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

QUEUE_FULL, SLO_INFEASIBLE = "queue_full", "slo_infeasible"


@dataclass(frozen=True)
class ReplicaLoad:
    """What a replica reports about itself (cheap: read from the engine's snapshot)."""

    replica_id: str
    num_running: int = 0
    num_swapped: int = 0
    num_queued: int = 0
    num_queued_tokens: int = 0
    device_kv_usage: float = 0.0
    host_kv_usage: float = 0.0
    step_time_s: float = 0.0
    prefill_s_per_token: float = 0.0
    max_num_queued_reqs: int = 1 << 30
    max_num_queued_tokens: int = 1 << 62
    reported_at: float = 0.0  # Unix time of the report

    def to_stats(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_stats(cls, replica_id: str, stats: Mapping[str, Any]) -> ReplicaLoad:
        """The load in a routing-stats dict (an idle replica when it has not reported)."""
        known = {f.name for f in fields(cls)} - {"replica_id"}
        return cls(replica_id, **{key: value for key, value in stats.items() if key in known})


@dataclass(frozen=True)
class Unreported:
    """Requests routed to a replica after its last report and not finished yet."""

    num_requests: int = 0
    num_prompt_tokens: int = 0


@dataclass(frozen=True)
class Demand:
    """What this request needs and promises (times in seconds, from now)."""

    num_prompt_tokens: int
    max_tokens: int
    ttft_s: float | None = None  # TTFT target left
    tbt_s: float | None = None
    deadline_s: float | None = None  # end-to-end budget left


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    tbt_s: float
    e2e_s: float


def predict(load: ReplicaLoad, demand: Demand, unreported: Unreported = Unreported()) -> Prediction:
    """Predicted TTFT, time between tokens and end-to-end time on this replica."""
    queued_tokens = load.num_queued_tokens + unreported.num_prompt_tokens
    ttft = (queued_tokens + demand.num_prompt_tokens) * load.prefill_s_per_token
    ttft += load.step_time_s
    batch = load.num_running + load.num_swapped + load.num_queued + unreported.num_requests + 1
    tbt = load.step_time_s * batch / max(1, load.num_running)
    return Prediction(ttft, tbt, ttft + max(0, demand.max_tokens - 1) * tbt)


def slack(prediction: Prediction, demand: Demand) -> float:
    """Smallest relative slack over the request's targets; -e2e when it has none."""
    pairs = ((demand.ttft_s, prediction.ttft_s), (demand.tbt_s, prediction.tbt_s),
             (demand.deadline_s, prediction.e2e_s))  # fmt: skip
    relative = [(target - value) / target for target, value in pairs if target]
    return min(relative) if relative else -prediction.e2e_s


def is_queue_full(load: ReplicaLoad, demand: Demand, unreported: Unreported = Unreported()) -> bool:
    """Whether the replica's admission would answer 429 (same rule as `Admission`)."""
    num_queued = load.num_queued + unreported.num_requests
    queued_tokens = load.num_queued_tokens + unreported.num_prompt_tokens
    is_full = num_queued + 1 > load.max_num_queued_reqs
    if num_queued:
        is_full |= queued_tokens + demand.num_prompt_tokens > load.max_num_queued_tokens
    return is_full


def rank_replicas(
    loads: Sequence[ReplicaLoad],
    demand: Demand,
    unreported: Mapping[str, Unreported] | None = None,
) -> list[str]:
    """Replica ids, best first: those with room in their queue before full ones, then
    more predicted slack first; ties by the shorter queue, then by id (deterministic)."""
    unreported = unreported or {}

    def key(load: ReplicaLoad) -> tuple[bool, float, int, str]:
        extra = unreported.get(load.replica_id, Unreported())
        value = slack(predict(load, demand, extra), demand)
        queued = load.num_queued + extra.num_requests
        return is_queue_full(load, demand, extra), -value, queued, load.replica_id

    return [load.replica_id for load in sorted(loads, key=key)]


@dataclass(frozen=True)
class Refusal:
    """A replica's admission answer (an `APIError` as plain data, to cross processes)."""

    status: int
    message: str
    code: str
    headers: Mapping[str, str]


def merge_rejections(refusals: Sequence[Refusal]) -> Refusal:
    """The answer when every replica refused: 429 (retry later) if some replica refused only
    for a full queue, with the soonest Retry-After; else the first other refusal (425)."""
    if not refusals:
        raise ValueError("no refusal to merge")
    full = [r for r in refusals if r.code == QUEUE_FULL]
    if not full:
        return refusals[0]
    soonest = min(full, key=lambda r: int(r.headers.get("Retry-After", "60")))
    return Refusal(429, f"every replica's queue is full; {soonest.message}", QUEUE_FULL,
                   dict(soonest.headers))  # fmt: skip
