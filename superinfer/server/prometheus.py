"""Prometheus metrics: vLLM's names, labels and buckets where the meaning is the same, SLO
series under `superinfer:`. Counters, not ratios; labels bounded (model name, the engine
index, configured class names or "none", fixed reason and kind sets; never request ids).

Every `vllm:` series carries vLLM's `model_name` and `engine` labels, every `superinfer:`
series `model_name`, so one dashboard filters both by model. Histograms use vLLM's bucket
boundaries (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`), so a fleet that mixes
superinfer and vLLM servers sums them bucket by bucket.

Engine state (queues, KV usage, prefix cache, preemptions, rotations, KV transfers) is read
from the engine's latest snapshot at scrape time; request series are updated as requests end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from superinfer.config import EngineConfig
from superinfer.engine.snapshot import EngineSnapshot
from superinfer.slo.metrics import CAPACITY_REJECTIONS, FINISHED, SLOReport

F = TypeVar("F", GaugeMetricFamily, CounterMetricFamily)

disable_created_metrics()  # no `*_created` series: they double the output and nobody reads them

NO_CLASS = "none"
SLO_KINDS = ("ttft", "tpot", "deadline", "all")
SLACK_KINDS = ("ttft", "tpot", "deadline")
# vLLM numbers the engines of one server; a superinfer server runs one (replicas of a
# cluster are told apart by the `replica` label instead)
ENGINE_INDEX = "0"
VLLM_LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
# e2e, queue, prefill and decode time
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0,
                           7680.0)  # fmt: skip
_SLACK_BUCKETS = (-30.0, -10.0, -5.0, -2.0, -1.0, -0.5, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1,
                  0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # fmt: skip


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... while <= `max_model_len` (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


class ServerMetrics:
    """All series of one server, in their own registry."""

    def __init__(
        self,
        model_name: str,
        snapshot: Callable[[], EngineSnapshot | None] | None,
        class_names: Sequence[str] = (),
        engine_config: EngineConfig | None = None,
        ttft_factors: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """`snapshot=None`: no engine in this process (the engine series are left out).
        `engine_config` gives the token buckets (up to `max_model_len`) and the cache
        configuration; the defaults when None. `ttft_factors`: the TTFT correction
        admission applies to each class ("none": requests without one), read at scrape
        time."""
        self.model_name = model_name
        self.registry = CollectorRegistry()
        config = engine_config or EngineConfig()
        self._add_request_series(config.scheduler.max_model_len)
        self._add_slo_series()
        if snapshot is not None:
            self.registry.register(EngineCollector(model_name, snapshot, config, ttft_factors))
        self._initialize([*class_names, NO_CLASS])

    def _add_request_series(self, max_model_len: int) -> None:
        """vLLM's request series, created at 0 for this model and engine, as vLLM does."""
        labels = (self.model_name, ENGINE_INDEX)
        tokens = token_buckets(max_model_len)

        def histogram(name: str, help_text: str, buckets: Sequence[float]) -> Histogram:
            return self._histogram(name, help_text, list(VLLM_LABELS), buckets).labels(*labels)

        def counter(name: str, help_text: str) -> Counter:
            return self._counter(name, help_text, list(VLLM_LABELS)).labels(*labels)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token, from arrival.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between output tokens.", ITL_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Arrival to the end of finished requests.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Arrival to first scheduled.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "First scheduled to first token, of finished requests.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "First token to last token, of finished requests.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens of finished requests.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Generated tokens of finished requests.", tokens
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        success = self._counter(
            "vllm:request_success",
            "Requests that ended, by finish reason.",
            [*VLLM_LABELS, "finished_reason"],
        )
        self._success_family = success
        self._success = {reason: success.labels(*labels, reason) for reason in FINISH_REASONS}

    def _add_slo_series(self) -> None:
        cls = ["model_name", "slo_class"]
        self.slo_requests = self._counter(
            "superinfer:slo_requests",
            "Requests by SLO class, target kind (ttft, tpot, deadline, all) and outcome (met, "
            "violated); capacity rejections (425, 429, 503) count as violated.",
            [*cls, "kind", "outcome"],
        )
        self.admitted = self._counter(
            "superinfer:admitted_requests",
            "Admitted requests that ended, by whether they met every target (met, violated): "
            "admission's precision is met / (met + violated).",
            [*cls, "outcome"],
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

    def _initialize(self, labels: list[str]) -> None:
        """Create the per-class series at 0, so rates and dashboards have data at once."""
        model = self.model_name
        for label in labels:
            for kind in SLO_KINDS:
                for outcome in ("met", "violated"):
                    self.slo_requests.labels(model, label, kind, outcome)
            for outcome in ("met", "violated"):
                self.tbt_gaps.labels(model, label, outcome)
                self.admitted.labels(model, label, outcome)
            for reason in CAPACITY_REJECTIONS:
                self.rejections.labels(model, label, reason)
            for kind in SLACK_KINDS:
                self.slack.labels(model, label, kind)

    def _histogram(
        self, name: str, help_text: str, labels: list[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, help_text, labels, registry=self.registry, buckets=buckets)

    def _counter(self, name: str, help_text: str, labels: list[str]) -> Counter:
        return Counter(name, help_text, labels, registry=self.registry)

    # --- updates --------------------------------------------------------------------------
    def on_rejected(self, slo_class: str | None, reason: str, is_capacity: bool) -> None:
        model, label = self.model_name, slo_class or NO_CLASS
        self.rejections.labels(model, label, reason).inc()
        if is_capacity:
            for kind in SLO_KINDS:
                self.slo_requests.labels(model, label, kind, "violated").inc()

    def on_ended(
        self,
        report: SLOReport,
        num_prompt_tokens: int,
        num_output_tokens: int,
        finish_reason: str,
        gaps_s: list[float],
    ) -> None:
        """A request that entered the engine finished or was aborted; `gaps_s` are the
        seconds between its consecutive output tokens."""
        model, label = self.model_name, report.slo_class or NO_CLASS
        self._success_of(finish_reason).inc()
        self.prompt_tokens.inc(num_prompt_tokens)
        self.generation_tokens.inc(num_output_tokens)
        self._observe_latencies(report, gaps_s)
        is_finished = report.outcome == FINISHED
        if is_finished:
            self._observe_finished(report, num_prompt_tokens, num_output_tokens, gaps_s)
        met = {"ttft": report.ttft_met, "tpot": report.tpot_met, "deadline": report.deadline_met,
               "all": report.is_all_met}  # fmt: skip
        for kind, is_met in met.items():
            outcome = "met" if is_met and is_finished else "violated"
            self.slo_requests.labels(model, label, kind, outcome).inc()
        self.admitted.labels(model, label, "met" if report.is_all_met else "violated").inc()
        num_gaps_violated = report.num_tbt_gaps - report.num_tbt_gaps_met
        self.tbt_gaps.labels(model, label, "met").inc(report.num_tbt_gaps_met)
        self.tbt_gaps.labels(model, label, "violated").inc(num_gaps_violated)
        self._observe_slack(report, label)

    def _success_of(self, finish_reason: str) -> Counter:
        if finish_reason not in self._success:  # bounded: finish reasons are a fixed set
            child = self._success_family.labels(self.model_name, ENGINE_INDEX, finish_reason)
            self._success[finish_reason] = child
        return self._success[finish_reason]

    def _observe_latencies(self, report: SLOReport, gaps_s: list[float]) -> None:
        if report.ttft_ms is not None:
            self.ttft.observe(report.ttft_ms / 1000)
        if report.queue_ms is not None:
            self.queue_time.observe(report.queue_ms / 1000)
        for gap in gaps_s:
            self.itl.observe(gap)

    def _observe_finished(
        self, report: SLOReport, num_prompt_tokens: int, num_output_tokens: int,
        gaps_s: list[float],
    ) -> None:  # fmt: skip
        """vLLM's per-request histograms, observed as vLLM does when a request finishes."""
        if report.e2e_ms is not None:
            self.e2e.observe(report.e2e_ms / 1000)
        if report.ttft_ms is not None and report.queue_ms is not None:
            # arrival -> first token, less arrival -> first scheduled
            self.prefill_time.observe(max(0.0, report.ttft_ms - report.queue_ms) / 1000)
        if report.ttft_ms is not None:
            self.decode_time.observe(sum(gaps_s))  # the gaps add up to first -> last token
        self.request_prompt_tokens.observe(num_prompt_tokens)
        self.request_generation_tokens.observe(num_output_tokens)

    def _observe_slack(self, report: SLOReport, label: str) -> None:
        model, targets = self.model_name, report.targets
        if report.ttft_ms is not None:
            slack_s = (targets.ttft_ms - report.ttft_ms) / 1000
            self.slack.labels(model, label, "ttft").observe(slack_s)
        if report.tpot_ms is not None:
            slack_s = (targets.tbt_ms - report.tpot_ms) / 1000
            self.slack.labels(model, label, "tpot").observe(slack_s)
        if targets.max_latency_ms is not None and report.e2e_ms is not None:
            slack_s = (targets.max_latency_ms - report.e2e_ms) / 1000
            self.slack.labels(model, label, "deadline").observe(slack_s)


class EngineCollector(Collector):
    """Engine state at scrape time, from the engine thread's latest snapshot."""

    def __init__(
        self,
        model_name: str,
        snapshot: Callable[[], EngineSnapshot | None],
        engine_config: EngineConfig | None = None,
        ttft_factors: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.model_name = model_name
        self.snapshot = snapshot
        self.ttft_factors = ttft_factors
        self.cache_info = cache_info_labels(engine_config or EngineConfig())

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
        )
        for name, help_text, value in gauges:
            yield self._vllm(GaugeMetricFamily, name, help_text, value)
        if s.num_device_blocks:  # the engine is built: its pool sizes are known
            yield self._cache_config_info(s)
        yield self._vllm(
            CounterMetricFamily, "vllm:prefix_cache_queries",
            "Prefix cache queries, in tokens looked up.", s.prefix_cache_queries,
        )  # fmt: skip
        yield self._vllm(
            CounterMetricFamily, "vllm:prefix_cache_hits",
            "Prefix cache hits, in tokens found cached.", s.prefix_cache_hits,
        )  # fmt: skip
        yield self._vllm(
            CounterMetricFamily, "vllm:num_preemptions", "Preemptions (recompute or swap).",
            s.num_preemptions + s.num_swap_outs,
        )  # fmt: skip
        yield from self._superinfer_series(s)

    def _superinfer_series(
        self, s: EngineSnapshot
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield self._model(
            GaugeMetricFamily, "superinfer:step_time_seconds",
            "Moving average of one engine step.", s.step_time_s,
        )  # fmt: skip
        yield self._model(
            CounterMetricFamily, "superinfer:rotations", "KV rotations to the host tier.",
            s.num_swap_outs,
        )  # fmt: skip
        yield self._model(
            CounterMetricFamily, "superinfer:swap_ins", "KV returns from the host tier.",
            s.num_swap_ins,
        )  # fmt: skip
        yield self._by_direction(
            "superinfer:kv_transfer_bytes", "KV bytes moved between the tiers.", s.transfer_bytes
        )
        yield self._by_direction(
            "superinfer:kv_transfer_seconds", "Seconds spent copying KV.", s.transfer_seconds
        )
        if self.ttft_factors is not None:
            yield self._ttft_correction(self.ttft_factors())

    def _ttft_correction(self, factors: Mapping[str, float]) -> GaugeMetricFamily:
        """The factor admission applies to each class's TTFT estimates, once learned."""
        family = GaugeMetricFamily(
            "superinfer:admission_ttft_correction",
            "Factor admission scales a class's TTFT estimates by: a high quantile of measured "
            "over estimated TTFT, the class's own or pooled over the classes above it; absent "
            "until learned.",
            labels=["model_name", "slo_class"],
        )
        for name, factor in sorted(factors.items()):
            family.add_metric([self.model_name, name], factor)
        return family

    def _vllm(self, kind: type[F], name: str, help_text: str, value: float) -> F:
        """One sample with vLLM's labels."""
        family = kind(name, help_text, labels=list(VLLM_LABELS))
        family.add_metric([self.model_name, ENGINE_INDEX], value)
        return family

    def _model(self, kind: type[F], name: str, help_text: str, value: float) -> F:
        """One sample with the model label."""
        family = kind(name, help_text, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family

    def _cache_config_info(self, s: EngineSnapshot) -> GaugeMetricFamily:
        """vLLM's info gauge (always 1): the cache configuration in its labels."""
        labels = {**self.cache_info, "num_gpu_blocks": str(s.num_device_blocks),
                  "num_cpu_blocks": str(s.num_host_blocks), "engine": ENGINE_INDEX}  # fmt: skip
        family = GaugeMetricFamily(
            "vllm:cache_config_info", "The KV cache configuration.", labels=list(labels)
        )
        family.add_metric(list(labels.values()), 1)
        return family

    def _by_direction(
        self, name: str, help_text: str, values: dict[str, float]
    ) -> CounterMetricFamily:
        counter = CounterMetricFamily(name, help_text, labels=["model_name", "direction"])
        for direction in ("d2h", "h2d"):
            counter.add_metric([self.model_name, direction], values.get(direction, 0))
        return counter


def cache_info_labels(config: EngineConfig) -> dict[str, str]:
    """The static labels of `vllm:cache_config_info`, written as vLLM writes them (str() of
    the value). The KV cache is kept in the model's dtype: vLLM's `cache_dtype="auto"`."""
    cache = config.cache
    return {
        "block_size": str(cache.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": str(cache.enable_prefix_caching),
    }
