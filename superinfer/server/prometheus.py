"""Prometheus metrics: vLLM's names where the meaning is the same, SLO series under
`superinfer:`. Counters, not ratios; labels bounded (model name, configured class names or
"none", fixed reason and kind sets; never request ids).

Engine state (queues, KV usage, preemptions, rotations, KV transfers) is read from the
engine's latest snapshot at scrape time; request series are updated as requests end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from superinfer.engine.async_engine import EngineSnapshot
from superinfer.metrics import CAPACITY_REJECTIONS, SLOReport

disable_created_metrics()  # no `*_created` series: they double the output and nobody reads them

NO_CLASS = "none"
SLO_KINDS = ("ttft", "tpot", "deadline", "all")

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0)  # fmt: skip
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_SLACK_BUCKETS = (-30.0, -10.0, -5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1,
                  0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # fmt: skip


class ServerMetrics:
    """All series of one server, in their own registry."""

    def __init__(
        self,
        model_name: str,
        snapshot: Callable[[], EngineSnapshot | None] | None,
        class_names: Sequence[str] = (),
    ) -> None:
        """`snapshot=None`: no engine in this process (the engine series are left out)."""
        self.model_name = model_name
        self.registry = CollectorRegistry()
        model, cls = ["model_name"], ["slo_class"]
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds", "Time to first token, from arrival.", model
        )
        self.itl = self._histogram(
            "vllm:inter_token_latency_seconds", "Time between output tokens.", model, _ITL_BUCKETS
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to the end of finished requests.", model
        )
        self.queue_time = self._histogram(
            "vllm:request_queue_time_seconds", "Arrival to first scheduled.", model
        )
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Prompt tokens processed.", model)
        self.generation_tokens = self._counter("vllm:generation_tokens", "Generated tokens.", model)
        self.success = self._counter(
            "vllm:request_success",
            "Requests that ended, by finish reason.",
            [*model, "finished_reason"],
        )
        self.slo_requests = self._counter(
            "superinfer:slo_requests",
            "Requests by SLO class, target kind (ttft, tpot, deadline, all) and outcome (met, "
            "violated); capacity rejections (425, 429, 503) count as violated.",
            [*cls, "kind", "outcome"],
        )
        self.rejections = self._counter(
            "superinfer:rejections", "Requests rejected at ingress, by reason.", [*cls, "reason"]
        )
        self.tbt_gaps = self._counter(
            "superinfer:tbt_gaps",
            "Inter-token gaps within (met) or over (violated) the tbt target.",
            [*cls, "outcome"],
        )
        self.slack = self._histogram(
            "superinfer:slo_slack_seconds",
            "Target minus achieved at completion (negative: violated).",
            [*cls, "kind"],
            _SLACK_BUCKETS,
        )
        if snapshot is not None:
            self.registry.register(EngineCollector(model_name, snapshot))
        self._initialize([*class_names, NO_CLASS])

    def _initialize(self, labels: list[str]) -> None:
        """Create the per-class series at 0, so rates and dashboards have data at once."""
        for label in labels:
            for kind in SLO_KINDS:
                for outcome in ("met", "violated"):
                    self.slo_requests.labels(label, kind, outcome)
            for outcome in ("met", "violated"):
                self.tbt_gaps.labels(label, outcome)
            for reason in CAPACITY_REJECTIONS:
                self.rejections.labels(label, reason)

    def _histogram(
        self,
        name: str,
        help_text: str,
        labels: list[str],
        buckets: tuple[float, ...] = _LATENCY_BUCKETS,
    ) -> Histogram:
        return Histogram(name, help_text, labels, registry=self.registry, buckets=buckets)

    def _counter(self, name: str, help_text: str, labels: list[str]) -> Counter:
        return Counter(name, help_text, labels, registry=self.registry)

    # --- updates --------------------------------------------------------------------------
    def on_rejected(self, slo_class: str | None, reason: str, is_capacity: bool) -> None:
        label = slo_class or NO_CLASS
        self.rejections.labels(label, reason).inc()
        if is_capacity:
            for kind in SLO_KINDS:
                self.slo_requests.labels(label, kind, "violated").inc()

    def on_ended(
        self,
        report: SLOReport,
        num_prompt_tokens: int,
        num_output_tokens: int,
        finish_reason: str,
        gaps_s: list[float],
    ) -> None:
        """A request that entered the engine finished or was aborted."""
        model, label = self.model_name, report.slo_class or NO_CLASS
        self.success.labels(model, finish_reason).inc()
        self.prompt_tokens.labels(model).inc(num_prompt_tokens)
        self.generation_tokens.labels(model).inc(num_output_tokens)
        self._observe_latencies(report, gaps_s)
        is_finished = report.outcome == "finished"
        met = {"ttft": report.ttft_met, "tpot": report.tpot_met, "deadline": report.deadline_met,
               "all": report.is_all_met}  # fmt: skip
        for kind, is_met in met.items():
            outcome = "met" if is_met and is_finished else "violated"
            self.slo_requests.labels(label, kind, outcome).inc()
        self.tbt_gaps.labels(label, "met").inc(report.num_tbt_gaps_met)
        self.tbt_gaps.labels(label, "violated").inc(report.num_tbt_gaps - report.num_tbt_gaps_met)
        self._observe_slack(report, label)

    def _observe_latencies(self, report: SLOReport, gaps_s: list[float]) -> None:
        model = self.model_name
        if report.ttft_ms is not None:
            self.ttft.labels(model).observe(report.ttft_ms / 1000)
        if report.e2e_ms is not None and report.outcome == "finished":
            self.e2e.labels(model).observe(report.e2e_ms / 1000)
        if report.queue_ms is not None:
            self.queue_time.labels(model).observe(report.queue_ms / 1000)
        itl = self.itl.labels(model)
        for gap in gaps_s:
            itl.observe(gap)

    def _observe_slack(self, report: SLOReport, label: str) -> None:
        targets = report.targets
        if report.ttft_ms is not None:
            self.slack.labels(label, "ttft").observe((targets.ttft_ms - report.ttft_ms) / 1000)
        if report.tpot_ms is not None:
            self.slack.labels(label, "tpot").observe((targets.tbt_ms - report.tpot_ms) / 1000)
        if targets.max_latency_ms is not None and report.e2e_ms is not None:
            slack_ms = targets.max_latency_ms - report.e2e_ms
            self.slack.labels(label, "deadline").observe(slack_ms / 1000)


class EngineCollector(Collector):
    """Engine state at scrape time, from the engine thread's latest snapshot."""

    def __init__(
        self,
        model_name: str,
        snapshot: Callable[[], EngineSnapshot | None] | None,
        class_names: Sequence[str] = (),
    ) -> None:
        """`snapshot=None`: no engine in this process (the engine series are left out)."""
        self.model_name = model_name
        self.snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.snapshot() or EngineSnapshot()
        gauges = (
            ("vllm:num_requests_running", "Requests in the running batch.", s.num_running),
            ("vllm:num_requests_waiting", "Requests waiting for admission.", s.num_waiting),
            (
                "vllm:num_requests_swapped",
                "Requests with their KV in the host tier.",
                s.num_swapped,
            ),
            ("vllm:kv_cache_usage_perc", "Device KV blocks in use (1 = 100%).", s.device_kv_usage),
            ("vllm:cpu_cache_usage_perc", "Host KV blocks in use (1 = 100%).", s.host_kv_usage),
            ("superinfer:step_time_seconds", "Moving average of one engine step.", s.step_time_s),
        )
        for name, help_text, value in gauges:
            gauge = GaugeMetricFamily(name, help_text, labels=["model_name"])
            gauge.add_metric([self.model_name], value)
            yield gauge
        num_preemptions = s.num_preemptions + s.num_swap_outs
        yield self._counter(
            "vllm:num_preemptions", "Preemptions (recompute or swap).", num_preemptions
        )
        yield self._counter(
            "superinfer:rotations", "KV rotations to the host tier.", s.num_swap_outs
        )
        yield self._counter("superinfer:swap_ins", "KV returns from the host tier.", s.num_swap_ins)
        yield self._by_direction(
            "superinfer:kv_transfer_bytes", "KV bytes moved between the tiers.", s.transfer_bytes
        )
        yield self._by_direction(
            "superinfer:kv_transfer_seconds", "Seconds spent copying KV.", s.transfer_seconds
        )

    def _counter(self, name: str, help_text: str, value: float) -> CounterMetricFamily:
        counter = CounterMetricFamily(name, help_text, labels=["model_name"])
        counter.add_metric([self.model_name], value)
        return counter

    @staticmethod
    def _by_direction(name: str, help_text: str, values: dict[str, float]) -> CounterMetricFamily:
        counter = CounterMetricFamily(name, help_text, labels=["direction"])
        for direction in ("d2h", "h2d"):
            counter.add_metric([direction], values.get(direction, 0))
        return counter
