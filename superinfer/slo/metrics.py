"""SLO metrics as pure functions over raw per-request records.

One implementation of the contract's Definitions (`slo-contract.md`), shared by the server,
the benchmark client and the simulator, so a number means the same everywhere:

- TTFT: arrival to first token; met when ttft <= the ttft target.
- TPOT: (e2e - ttft) / (output_tokens - 1), 0 for a single token; met when <= the tbt target.
- token-level TBT attainment: over all inter-token gaps, the share <= the tbt target.
- deadline met: e2e <= max latency, when one was given (true when none was).
- run attainment: the share of requests that met each target; goodput: requests per second
  that met all their targets. Only finished requests can count as met: rejected and
  aborted ones count as not met. Requests rejected for the client's own mistakes
  (malformed input, a wrong key) are not SLO requests and are left out.

Records carry times in seconds on one clock (any clock: only differences are used).
Reports carry milliseconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from superinfer.slo.targets import SLOTargets

FINISHED, ABORTED, REJECTED = "finished", "aborted", "rejected"
OUTCOMES = (FINISHED, ABORTED, REJECTED)
# rejection reasons (error codes) that are the server's capacity, not the client's mistake
CAPACITY_REJECTIONS = frozenset({"slo_infeasible", "queue_full", "not_ready", "draining"})


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request: raw timestamps (seconds, one clock) and counts."""

    request_id: str
    targets: SLOTargets
    arrival_time: float
    token_times: Sequence[float] = ()  # when each output token (or streamed chunk) came
    finished_time: float | None = None  # end of the response; default: the last token
    first_scheduled_time: float | None = None
    outcome: str = FINISHED  # finished | aborted | rejected
    num_prompt_tokens: int = 0
    num_output_tokens: int | None = None  # default: len(token_times)
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_rotations: int = 0
    rejection_reason: str | None = None  # the error code of a rejected request

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")

    @property
    def num_tokens_out(self) -> int:
        if self.num_output_tokens is not None:
            return self.num_output_tokens
        return len(self.token_times)


@dataclass(frozen=True)
class SLOReport:
    """One request's SLO outcome: the contract's `slo` object plus TBT gap counts."""

    slo_class: str | None
    targets: SLOTargets
    outcome: str
    ttft_ms: float | None
    tpot_ms: float | None
    max_tbt_ms: float | None
    e2e_ms: float | None
    queue_ms: float | None
    ttft_met: bool
    tpot_met: bool
    deadline_met: bool
    num_tbt_gaps: int
    num_tbt_gaps_met: int
    preemptions: int = 0
    rotations: int = 0
    rejection_reason: str | None = None

    @property
    def is_slo_request(self) -> bool:
        """False for requests rejected for the client's mistake (they have no SLO outcome)."""
        reason = self.rejection_reason
        return self.outcome != REJECTED or reason is None or reason in CAPACITY_REJECTIONS

    @property
    def is_all_met(self) -> bool:
        """Finished and met every target it had."""
        return self.outcome == FINISHED and self.ttft_met and self.tpot_met and self.deadline_met

    @property
    def tbt_attainment(self) -> float | None:
        """Share of this request's inter-token gaps within the tbt target (None: no gaps)."""
        return self.num_tbt_gaps_met / self.num_tbt_gaps if self.num_tbt_gaps else None

    def to_dict(self) -> dict[str, Any]:
        """The contract's `slo` object (the final response carries it next to `usage`)."""
        return {
            "class": self.slo_class,
            "targets": targets_dict(self.targets),
            "ttft_ms": _round(self.ttft_ms),
            "tpot_ms": _round(self.tpot_ms),
            "max_tbt_ms": _round(self.max_tbt_ms),
            "tbt_attainment": _round(self.tbt_attainment, 4),
            "e2e_ms": _round(self.e2e_ms),
            "ttft_met": self.ttft_met,
            "tpot_met": self.tpot_met,
            "deadline_met": self.deadline_met,
            "preemptions": self.preemptions,
            "rotations": self.rotations,
            "queue_ms": _round(self.queue_ms),
        }


def targets_dict(targets: SLOTargets) -> dict[str, float | None]:
    return {
        "ttft_ms": targets.ttft_ms,
        "tbt_ms": targets.tbt_ms,
        "max_latency_ms": targets.max_latency_ms,
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _ms(seconds: float) -> float:
    """Milliseconds, rounded to the nanosecond: float noise never decides a boundary."""
    return round(seconds * 1000.0, 6)


# --- one request --------------------------------------------------------------------------
def tbt_gaps(token_times: Sequence[float]) -> list[float]:
    """Seconds between consecutive output tokens (or chunks)."""
    return [b - a for a, b in itertools.pairwise(token_times)]


def ttft_ms(record: RequestRecord) -> float | None:
    if not record.token_times:
        return None
    return _ms(record.token_times[0] - record.arrival_time)


def e2e_ms(record: RequestRecord) -> float | None:
    end = record.finished_time
    if end is None and record.token_times:
        end = record.token_times[-1]
    return None if end is None else _ms(end - record.arrival_time)


def tpot_ms(record: RequestRecord) -> float | None:
    """(e2e - ttft) / (output_tokens - 1); 0 for a single token; None without tokens."""
    ttft, e2e = ttft_ms(record), e2e_ms(record)
    if ttft is None or e2e is None:
        return None
    num_tokens = record.num_tokens_out
    return 0.0 if num_tokens <= 1 else (e2e - ttft) / (num_tokens - 1)


def slo_report(record: RequestRecord) -> SLOReport:
    """The per-request report; its met flags describe what was observed (a request that
    did not finish is still never `is_all_met`)."""
    targets = record.targets
    ttft, tpot, e2e = ttft_ms(record), tpot_ms(record), e2e_ms(record)
    gaps = [_ms(g) for g in tbt_gaps(record.token_times)]
    deadline = targets.max_latency_ms
    is_rejected = record.outcome == REJECTED
    return SLOReport(
        slo_class=targets.slo_class,
        targets=targets,
        outcome=record.outcome,
        ttft_ms=ttft,
        tpot_ms=tpot,
        max_tbt_ms=max(gaps) if gaps else None,
        e2e_ms=e2e,
        queue_ms=_queue_ms(record),
        ttft_met=ttft is not None and ttft <= targets.ttft_ms,
        tpot_met=tpot is not None and tpot <= targets.tbt_ms,
        deadline_met=not is_rejected and (
            deadline is None or (e2e is not None and record.outcome == FINISHED and e2e <= deadline)
        ),
        num_tbt_gaps=len(gaps),
        num_tbt_gaps_met=sum(1 for g in gaps if g <= targets.tbt_ms),
        preemptions=record.num_preemptions,
        rotations=record.num_rotations,
        rejection_reason=record.rejection_reason,
    )  # fmt: skip


def _queue_ms(record: RequestRecord) -> float | None:
    if record.first_scheduled_time is None:
        return None
    return _ms(record.first_scheduled_time - record.arrival_time)


# --- a run --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Attainment:
    """SLO attainment of a set of requests (shares in [0, 1]; None where undefined)."""

    num_requests: int
    num_finished: int
    num_rejected: int
    num_aborted: int
    ttft: float | None  # share of requests whose TTFT was met
    tpot: float | None
    deadline: float | None  # over the requests that gave a deadline
    all_met: float | None  # share of requests that met every target they had
    tbt_token: float | None  # pooled inter-token gaps within target
    num_all_met: int
    duration_s: float | None = None
    goodput_rps: float | None = None  # requests per second that met all their targets
    # admission's judge: the share of admitted (not refused) requests that met all targets
    precision: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _share(num: int, den: int) -> float | None:
    return num / den if den else None


def attainment(reports: Iterable[SLOReport], duration_s: float | None = None) -> Attainment:
    """Attainment over `reports`; goodput when `duration_s` (the run's length) is given.

    Rejected and aborted requests count as not met for every target; client errors are
    left out (`SLOReport.is_slo_request`).
    """
    reports = [r for r in reports if r.is_slo_request]
    finished = [r for r in reports if r.outcome == FINISHED]
    with_deadline = [r for r in reports if r.targets.max_latency_ms is not None]
    num_all_met = sum(1 for r in reports if r.is_all_met)
    num_gaps = sum(r.num_tbt_gaps for r in reports)
    return Attainment(
        num_requests=len(reports),
        num_finished=len(finished),
        num_rejected=sum(1 for r in reports if r.outcome == REJECTED),
        num_aborted=sum(1 for r in reports if r.outcome == ABORTED),
        ttft=_share(sum(1 for r in finished if r.ttft_met), len(reports)),
        tpot=_share(sum(1 for r in finished if r.tpot_met), len(reports)),
        deadline=_share(
            sum(1 for r in with_deadline if r.outcome == FINISHED and r.deadline_met),
            len(with_deadline),
        ),
        all_met=_share(num_all_met, len(reports)),
        tbt_token=_share(sum(r.num_tbt_gaps_met for r in reports), num_gaps),
        num_all_met=num_all_met,
        duration_s=duration_s,
        goodput_rps=num_all_met / duration_s if duration_s else None,
        precision=_share(num_all_met, sum(1 for r in reports if r.outcome != REJECTED)),
    )  # fmt: skip


def attainment_by_class(
    reports: Iterable[SLOReport], duration_s: float | None = None
) -> dict[str | None, Attainment]:
    """`attainment` per SLO class (None: requests without a class)."""
    groups: dict[str | None, list[SLOReport]] = {}
    for report in reports:
        groups.setdefault(report.slo_class, []).append(report)
    return {name: attainment(group, duration_s) for name, group in groups.items()}


def run_duration_s(records: Sequence[RequestRecord]) -> float | None:
    """First arrival to the last end among `records` (None for fewer than one end)."""
    ends = [r.finished_time or (r.token_times[-1] if r.token_times else None) for r in records]
    ends = [e for e in ends if e is not None]
    if not records or not ends:
        return None
    return max(ends) - min(r.arrival_time for r in records)


# --- distributions ------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between order statistics
    (numpy's default, as `vllm bench serve` reports); None for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must lie in [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Distribution:
    """Mean, median, population standard deviation and chosen percentiles of some values
    (milliseconds in practice); every field None for no values."""

    count: int
    mean: float | None
    median: float | None
    std: float | None
    percentiles: dict[float, float | None]


def distribution(values: Sequence[float], percentiles: Sequence[float] = (99,)) -> Distribution:
    """Summary statistics of `values` (empty: count 0 and None everywhere)."""
    if not values:
        return Distribution(0, None, None, None, {q: None for q in percentiles})
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / len(values)
    return Distribution(
        count=len(values),
        mean=mean,
        median=percentile(values, 50),
        std=variance**0.5,
        percentiles={q: percentile(values, q) for q in percentiles},
    )


def refusal_cost(admitted_run: Sequence[SLOReport], replay: Sequence[SLOReport]) -> float | None:
    """The share of requests refused in `admitted_run` that met all their targets in
    `replay`, the same requests (same order) served with admission off: what refusing
    them cost. None when nothing was refused."""
    if len(admitted_run) != len(replay):
        raise ValueError(f"the runs differ in length: {len(admitted_run)} vs {len(replay)}")
    refused = [i for i, r in enumerate(admitted_run) if r.outcome == REJECTED and r.is_slo_request]
    return _share(sum(1 for i in refused if replay[i].is_all_met), len(refused))
