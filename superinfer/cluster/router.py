"""SLO-aware replica choice: rank replicas by this request's slack on each replica's own
estimate.

Pure functions over plain dataclasses (no Ray, no clock): the Ray Serve request router
(`ray_router.py`) feeds them each replica's last reported load plus what it routed since,
and tries replicas in the order they return. Admission stays with the replicas: the
ingress moves to the next replica when one refuses, and rejects only when all refused
(`merge_rejections`).

Each replica reports what its own admission estimates from (`ReplicaLoad`: its engine load,
class order and the TTFT correction it learned), so the router's figures are the replica's:
- TTFT: `slo/estimate.py`'s estimate of this request's first token on that load, the
  requests routed to the replica since its report queued with it, times the replica's
  learned correction: what the replica's admission will expect (`Admission.check`);
- time between tokens: `Estimator.tpot`, the replica's TBT check, on the batch it will
  share (the running requests, those queued or routed since the last report, and this
  one, at the step-time model's cost per row; a replica without a fitted model is priced
  as if its step grew in proportion to its batch), with the prefill that will run in its
  steps (the prompts' tokens and their attention pairs: a long conversation's history
  costs more than its length), plus a row for each request rotated out to the host tier
  (it takes its turns);
- end to end: that TTFT, then that time between tokens per further token (admission's
  `finish_s` on a step that holds the batch: a burst that joins one replica slows every
  token there, not only its first, so it spreads even when no target is set);
- the promises already made there: the least room any request decoding there, still on
  track for its TPOT, has left once this one joins (`TpotEstimate.min_promise_slack`).
Slack is the smallest of (target - estimate) / target over the targets the request has,
and of that room: a replica is better when the worst-threatened promise, its own or one
already made there, has more room.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from superinfer.cluster.prefix_index import PrefixIndex
from superinfer.slo.estimate import Correction, Decoding, EngineLoad, Estimator, Queued

QUEUE_FULL, SLO_INFEASIBLE = "queue_full", "slo_infeasible"


@dataclass(frozen=True)
class ReplicaLoad:
    """What a replica reports about itself (cheap: read from the engine's snapshot).

    `engine` is what the replica's admission estimates from, with its queue's deadlines on
    the Unix clock (`on_wall_clock`); `ttft_factors` the correction it learned, by class
    (`learned_factors`; empty until it learned one)."""

    replica_id: str
    engine: EngineLoad = field(default_factory=EngineLoad)
    class_order: tuple[str, ...] = ()
    ttft_factors: Mapping[str | None, float] = field(default_factory=dict)
    ttft_floor_s: float = 0.0
    num_running: int = 0
    num_swapped: int = 0
    device_kv_usage: float = 0.0
    host_kv_usage: float = 0.0
    max_num_queued_reqs: int = 1 << 30
    max_num_queued_tokens: int = 1 << 62
    reported_at: float = 0.0  # Unix time of the report

    @property
    def estimator(self) -> Estimator:
        return Estimator(self.class_order)

    def expected_ttft_s(self, raw_s: float, slo_class: str | None) -> float:
        """A raw estimate as the replica's learned correction expects it
        (`Correction.corrected_s` on the replica)."""
        factor = self.ttft_factors.get(slo_class)
        return raw_s if factor is None else factor * max(raw_s, self.ttft_floor_s)

    def to_stats(self) -> dict[str, Any]:
        """Plain data (Ray Serve's controller passes it on without importing superinfer)."""
        stats = {f.name: getattr(self, f.name) for f in fields(self)}
        del stats["replica_id"]
        stats["engine"] = _plain_load(self.engine)
        stats["ttft_factors"] = dict(self.ttft_factors)
        return stats

    @classmethod
    def from_stats(cls, replica_id: str, stats: Mapping[str, Any]) -> ReplicaLoad:
        """The load in a routing-stats dict (an idle replica when it has not reported)."""
        known = {f.name for f in fields(cls)} - {"replica_id"}
        values = {key: value for key, value in stats.items() if key in known}
        if "engine" in values:
            values["engine"] = _load_of(values["engine"])
        return cls(replica_id, **values)


def on_wall_clock(load: EngineLoad, monotonic_now: float, wall_now: float) -> EngineLoad:
    """`load` with its times (its clock's now, the queue's deadlines, the decoding requests'
    first tokens) moved from the engine's clock to Unix time, the clock the router compares
    a request's deadline on."""
    shift = wall_now - monotonic_now
    queued = tuple(dataclasses.replace(q, deadline=q.deadline + shift) for q in load.queued)
    decoding = tuple(d if d.first_token_time is None
                     else dataclasses.replace(d, first_token_time=d.first_token_time + shift)
                     for d in load.decoding)  # fmt: skip
    return dataclasses.replace(load, queued=queued, decoding=decoding, now=load.now + shift)


def learned_factors(correction: Correction, class_order: Sequence[str]) -> dict[str | None, float]:
    """The factor `correction` scales each class's raw estimate by, for the classes it
    learned one for (its own or borrowed: `Correction.learned`; raw estimates for the rest)."""
    factors = {name: correction.learned(name) for name in (*class_order, None)}
    return {name: factor for name, factor in factors.items() if factor is not None}


def _plain_load(load: EngineLoad) -> dict[str, Any]:
    plain = {f.name: getattr(load, f.name) for f in fields(load)}
    plain["queued"] = [dataclasses.astuple(q) for q in load.queued]
    plain["decoding"] = [dataclasses.astuple(d) for d in load.decoding]
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in plain.items()}


def _load_of(plain: Mapping[str, Any]) -> EngineLoad:
    known = {f.name for f in fields(EngineLoad)}
    values = {key: value for key, value in plain.items() if key in known}
    values["queued"] = tuple(Queued(*item) for item in values.get("queued", ()))
    values["decoding"] = tuple(Decoding(*item) for item in values.get("decoding", ()))
    return EngineLoad(**values)


@dataclass(frozen=True)
class Demand:
    """What this request needs and promises (times in seconds, from now)."""

    num_prompt_tokens: int
    max_tokens: int
    ttft_s: float | None = None  # TTFT target left
    tbt_s: float | None = None
    deadline_s: float | None = None  # end-to-end budget left
    slo_class: str | None = None
    ttft_deadline: float = math.inf  # Unix time: its place in a queue ordered by deadline
    prompt_token_ids: tuple[int, ...] = field(default=(), repr=False)  # for the prefix index
    num_cached_tokens: int = 0  # of its prompt, in the prefix cache of the replica estimated

    def as_queued(self) -> Queued:
        """This request, waiting in a replica's queue (deadline on the Unix clock)."""
        return Queued(self.ttft_deadline, self.num_prompt_tokens, self.slo_class,
                      self.num_prompt_tokens + self.max_tokens, self.tbt_s or 0.0)  # fmt: skip


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    tbt_s: float
    e2e_s: float
    promise_slack: float = math.inf  # the least room a promise made there keeps


def _with(load: ReplicaLoad, unreported: Sequence[Queued]) -> EngineLoad:
    """The replica's engine load with the requests routed to it since its report queued,
    and a per-row step cost (proportional to the batch when its step model has none)."""
    engine = load.engine
    if unreported:
        engine = dataclasses.replace(engine, queued=engine.queued + tuple(unreported))
    if engine.decode_row_s <= 0:
        step_s = engine.decode_step_s or engine.step_time_s
        engine = dataclasses.replace(engine, decode_row_s=step_s / max(1, load.num_running))
    return engine


def predict(load: ReplicaLoad, demand: Demand, unreported: Sequence[Queued] = ()) -> Prediction:
    """The replica's estimates of this request's TTFT and end-to-end time, the time
    between tokens of the batch it joins, and the room left to the promises made there
    (module docstring)."""
    engine, estimator = _with(load, unreported), load.estimator
    first = estimator.first_token(engine, demand.num_prompt_tokens, demand.slo_class,
                                  demand.ttft_deadline, demand.num_cached_tokens)  # fmt: skip
    ttft = first.expected_s(lambda raw_s: load.expected_ttft_s(raw_s, demand.slo_class))
    between = estimator.tpot(engine, demand.num_prompt_tokens, demand.max_tokens,
                             demand.slo_class, demand.ttft_deadline, demand.tbt_s or 0.0,
                             num_cached_tokens=demand.num_cached_tokens)  # fmt: skip
    # the requests rotated out to the host tier take their turns in the batch, a row each
    tbt = between.tpot_s + load.num_swapped * engine.decode_row_s
    shared = dataclasses.replace(engine, step_time_s=tbt)
    return Prediction(ttft, tbt, estimator.finish_s(shared, ttft, demand.max_tokens),
                      between.min_promise_slack)  # fmt: skip


def slack(prediction: Prediction, demand: Demand) -> float:
    """Smallest relative slack over the request's targets and the promises made on the
    replica; -e2e when the request has no target (it is placed for speed alone)."""
    pairs = ((demand.ttft_s, prediction.ttft_s), (demand.tbt_s, prediction.tbt_s),
             (demand.deadline_s, prediction.e2e_s))  # fmt: skip
    relative = [(target - value) / target for target, value in pairs if target]
    return min(*relative, prediction.promise_slack) if relative else -prediction.e2e_s


def is_queue_full(load: ReplicaLoad, demand: Demand, unreported: Sequence[Queued] = ()) -> bool:
    """Whether the replica's admission would answer 429 (same rule as `Admission`: the
    queue of this request's class and those above it)."""
    ahead = load.estimator.queue_ahead(_with(load, unreported), demand.slo_class, math.inf)
    num_queued, queued_tokens = len(ahead), sum(q.num_tokens for q in ahead)
    is_full = num_queued + 1 > load.max_num_queued_reqs
    if num_queued:
        is_full |= queued_tokens + demand.num_prompt_tokens > load.max_num_queued_tokens
    return is_full


def rank_replicas(
    loads: Sequence[ReplicaLoad],
    demand: Demand,
    unreported: Mapping[str, Sequence[Queued]] | None = None,
    prefixes: PrefixIndex | None = None,
) -> list[str]:
    """Replica ids, best first: those with room in their queue before full ones, then
    more slack on their estimates first; ties by the shorter queue, then by id. With
    `prefixes`, each replica's estimate leaves out the prompt's prefix it is likely to hold."""
    unreported = unreported or {}

    def key(load: ReplicaLoad) -> tuple[bool, float, int, str]:
        extra = unreported.get(load.replica_id, ())
        cached = 0
        if prefixes is not None and demand.prompt_token_ids:
            cached = prefixes.num_cached_tokens(load.replica_id, demand.prompt_token_ids,
                                                load.engine.block_size)  # fmt: skip
        value = slack(predict(load, dataclasses.replace(demand, num_cached_tokens=cached), extra),
                      demand)  # fmt: skip
        queued = load.engine.num_queued + len(extra)
        return is_queue_full(load, demand, extra), -value, queued, load.replica_id

    return [load.replica_id for load in sorted(loads, key=key)]


@dataclass(frozen=True)
class _Routed:
    replica_id: str
    queued: Queued  # the request as it waits there (deadline on the Unix clock)
    routed_at: float  # Unix time
    new_blocks: tuple[int, ...] = ()  # prompt blocks it added to the prefix index


class RoutedSince:
    """The requests a router sent to each replica and that have not completed: those sent
    after the replica's last report are not in its reported load yet, so the router
    queues them there itself (`unreported`), and a burst between two reports spreads out.
    Their prompts go into `prefixes`, the blocks each replica's prefix cache likely holds."""

    MAX_OPEN, OPEN_TTL_S = 10_000, 600.0

    def __init__(self) -> None:
        self._open: dict[str, _Routed] = {}
        self.prefixes = PrefixIndex()

    def add(self, request_id: str, replica_id: str, demand: Demand, now: float,
            load: ReplicaLoad | None = None) -> None:  # fmt: skip
        """`demand` sent to `replica_id` (whose last report is `load`: its block size and
        pool bound the prefix index; None: its prompt is not indexed)."""
        new_blocks: list[int] = []
        if load is not None and demand.prompt_token_ids:
            engine = load.engine
            new_blocks = self.prefixes.add(replica_id, demand.prompt_token_ids, engine.block_size,
                                           engine.num_device_blocks)  # fmt: skip
        self._open[request_id] = _Routed(replica_id, demand.as_queued(), now, tuple(new_blocks))

    def remove(self, request_id: str, now: float, is_refused: bool = False) -> None:
        """The request completed, or the replica refused it (`is_refused`: it computed none
        of the prompt blocks it brought to the index)."""
        routed = self._open.pop(request_id, None)
        if routed is not None and is_refused:
            self.prefixes.discard(routed.replica_id, routed.new_blocks)
        if len(self._open) > self.MAX_OPEN:  # requests cancelled before they were sent
            horizon = now - self.OPEN_TTL_S
            self._open = {k: v for k, v in self._open.items() if v.routed_at > horizon}

    def num_open(self, replica_id: str) -> int:
        """Requests open on `replica_id` (what power-of-two choices compares)."""
        return sum(1 for routed in self._open.values() if routed.replica_id == replica_id)

    def unreported(self, loads: Sequence[ReplicaLoad]) -> dict[str, list[Queued]]:
        """Open requests routed to each replica after its last report."""
        reported_at = {load.replica_id: load.reported_at for load in loads}
        sent: dict[str, list[Queued]] = {}
        for routed in self._open.values():
            if routed.routed_at > reported_at.get(routed.replica_id, math.inf):
                sent.setdefault(routed.replica_id, []).append(routed.queued)
        return sent


@dataclass(frozen=True)
class Refusal:
    """A replica's admission answer (an `APIError` as plain data, to cross processes)."""

    status: int
    message: str
    code: str
    headers: Mapping[str, str]
    reason: str | None = None  # `APIError.reason`
    estimated_ttft_ms: float | None = None


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
                   dict(soonest.headers), soonest.reason, soonest.estimated_ttft_ms)  # fmt: skip
