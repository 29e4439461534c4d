"""`superinfer bench serve`: send a workload to an OpenAI-compatible endpoint at its arrival
times, then compute the result with the project's one metrics module.

The result follows `vllm bench serve`'s JSON (same key names where the meaning is the same:
`completed`, `total_input_tokens`, `request_throughput`, `mean_ttft_ms`, `p99_tpot_ms`, ...)
plus the SLO fields (`ttft_attainment`, `tpot_attainment`, `tbt_attainment`, `goodput`,
`precision`,
per class, the targets) and the raw per-request records (client-clock times relative to
the start of the run, and the server's own `slo` report where it sent one). See
docs/bench.md for every field.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from superinfer.bench.client import (
    Answers,
    RequestOptions,
    RequestResult,
    RequestSpec,
    send,
    to_record,
)
from superinfer.bench.scrape import MetricsPoller
from superinfer.bench.workload import Workload
from superinfer.slo.classes import load_slo_config
from superinfer.slo.metrics import (
    FINISHED,
    RequestRecord,
    SLOReport,
    attainment,
    attainment_by_class,
    distribution,
    run_duration_s,
    slo_report,
    targets_dict,
    tbt_gaps,
)

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class ServeOptions:
    """Where and how to send (see `superinfer bench serve --help`)."""

    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"
    model: str | None = None  # None: the first model of GET /v1/models
    api_key: str | None = None
    max_concurrency: int | None = None
    request_timeout: float = 3600.0
    num_warmups: int = 0
    metrics_interval: float = 0.0  # seconds between /metrics scrapes (0: none)
    temperature: float = 0.0
    ignore_eos: bool = True
    slo_transport: str = "both"
    send_priority: bool = False
    metric_percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    disable_tqdm: bool = False
    label: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RunOutput:
    """The raw outcome of a run, before any metric is computed."""

    results: list[RequestResult]
    start_time: float  # perf_counter at the start of dispatch
    model: str
    metrics_timeline: list[dict[str, Any]]


# --- running ------------------------------------------------------------------------------
def run_benchmark(workload: Workload, options: ServeOptions, slo_config: str | None = None
                  ) -> RunOutput:  # fmt: skip
    """Send every request of `workload` at its arrival time and wait for all of them."""
    return asyncio.run(_run(workload, options, slo_config))


async def _run(workload: Workload, options: ServeOptions, slo_config: str | None) -> RunOutput:
    timeout = httpx.Timeout(options.request_timeout, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        model = options.model or await first_model(client, options)
        request_options = _request_options(options, model, slo_config)
        await _warm_up(client, workload.specs[: options.num_warmups], request_options)
        poller = MetricsPoller(options.base_url, options.metrics_interval, options.headers)
        start = time.perf_counter()
        if options.metrics_interval > 0:
            poller.start(start)
        try:
            results = await _dispatch(client, workload.specs, request_options, options, start)
        finally:
            timeline = await poller.stop()
    return RunOutput(results, start, model, timeline)


async def first_model(client: httpx.AsyncClient, options: ServeOptions) -> str:
    """The first model the server lists (what `vllm bench serve` does without --model)."""
    url = options.base_url.rstrip("/") + "/v1/models"
    response = await client.get(url, headers=options.headers)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def _request_options(options: ServeOptions, model: str, slo_config: str | None) -> RequestOptions:
    ranks = {name: rank for rank, name in enumerate(load_slo_config(slo_config).class_names)}
    return RequestOptions(
        url=options.base_url.rstrip("/") + options.endpoint, model=model,
        is_chat=options.endpoint.rstrip("/").endswith("chat/completions"),
        temperature=options.temperature, ignore_eos=options.ignore_eos,
        slo_transport=options.slo_transport, send_priority=options.send_priority,
        class_ranks=ranks, headers=options.headers,
    )  # fmt: skip


async def _warm_up(client: httpx.AsyncClient, specs: list[RequestSpec], options: RequestOptions
                   ) -> None:  # fmt: skip
    """Send `specs` (at most 16 output tokens each) at once and wait; they are not recorded."""
    short = [RequestSpec(f"warmup-{i}", s.prompt, s.num_prompt_tokens, min(s.max_tokens, 16),
                         s.targets, 0.0) for i, s in enumerate(specs)]  # fmt: skip
    results = await asyncio.gather(*(send(client, spec, options) for spec in short))
    failed = [r.error for r in results if r.outcome != FINISHED]
    if failed:
        print(f"warning: {len(failed)} warm-up requests failed: {failed[0]}", file=sys.stderr)


async def _dispatch(client: httpx.AsyncClient, specs: list[RequestSpec], request_options:
                    RequestOptions, options: ServeOptions, start: float) -> list[RequestResult]:  # fmt: skip
    from tqdm import tqdm

    limit = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None
    bar = tqdm(total=len(specs), disable=options.disable_tqdm, file=sys.stderr, unit="req")
    answers: Answers = {}  # a conversation's replies, which its next turns send back

    async def one(spec: RequestSpec) -> RequestResult:
        if limit is None:
            result = await send(client, spec, request_options, answers)
        else:
            async with limit:
                result = await send(client, spec, request_options, answers)
        bar.update(1)
        return result

    async def at_arrival(spec: RequestSpec) -> RequestResult:
        await asyncio.sleep(max(0.0, start + spec.arrival_s - time.perf_counter()))
        return await one(spec)

    async def conversation(turns: list[RequestSpec]) -> list[RequestResult]:
        """A conversation's turns in order, each `think_s` after the previous one ended
        (one without `think_s` at its arrival)."""
        results = []
        for spec in turns:
            if spec.think_s is None or not results:
                results.append(await at_arrival(spec))
            else:
                await asyncio.sleep(spec.think_s)
                results.append(await one(spec))
        return results

    conversations: dict[int, list[RequestSpec]] = {}
    alone: list[RequestSpec] = []
    for spec in specs:
        if spec.turn is not None:
            conversations.setdefault(spec.turn[0], []).append(spec)
        else:
            alone.append(spec)
    try:
        done = await asyncio.gather(*(at_arrival(spec) for spec in alone),
                                    *(conversation(turns) for turns in conversations.values()))  # fmt: skip
    finally:
        bar.close()
    by_id = {r.spec.request_id: r for r in done[: len(alone)]}
    by_id.update((r.spec.request_id, r) for turns in done[len(alone) :] for r in turns)
    return [by_id[spec.request_id] for spec in specs]


# --- the result ---------------------------------------------------------------------------
def benchmark_result(run: RunOutput, options: ServeOptions, meta: dict[str, Any]
                     ) -> dict[str, Any]:  # fmt: skip
    """The result JSON (vLLM's keys plus the SLO fields and the raw records)."""
    records = [to_record(r) for r in run.results]
    reports = [slo_report(r) for r in records]
    duration = run_duration_s(records) or 0.0
    finished = [(rec, rep) for rec, rep in zip(records, reports) if rec.outcome == FINISHED]
    total_input = sum(rec.num_prompt_tokens for rec, _ in finished)
    total_output = sum(rec.num_tokens_out for rec, _ in finished)
    overall = attainment(reports, duration or None)
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if options.endpoint.endswith("chat/completions") else "openai",
        "label": options.label, "base_url": options.base_url, "endpoint": options.endpoint,
        "model_id": run.model, **meta,
        "max_concurrency": options.max_concurrency, "num_warmups": options.num_warmups,
        "duration": duration, "completed": len(finished),
        "failed": len(records) - len(finished), "rejected": overall.num_rejected,
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": _per_s(len(finished), duration),
        "request_goodput": overall.goodput_rps,
        "output_throughput": _per_s(total_output, duration),
        "total_token_throughput": _per_s(total_input + total_output, duration),
    }  # fmt: skip
    result.update(latency_fields(finished, options.metric_percentiles))
    result.update(slo_fields(reports, overall, duration))
    result.update(_vllm_arrays(records, reports, run.results))
    result["records"] = [_record_dict(res, rec, rep, run.start_time)
                         for res, rec, rep in zip(run.results, records, reports)]  # fmt: skip
    result["metrics_timeline"] = run.metrics_timeline
    return result


def _per_s(count: float, duration: float) -> float | None:
    return count / duration if duration > 0 else None


def latency_samples(finished: list[tuple[RequestRecord, SLOReport]]) -> dict[str, list[float]]:
    """Milliseconds per metric over finished requests: TTFT, TPOT (requests with more than
    one output token, as vLLM), ITL (every gap between streamed chunks), E2E latency."""
    return {
        "ttft": [rep.ttft_ms for _, rep in finished if rep.ttft_ms is not None],
        "tpot": [rep.tpot_ms for rec, rep in finished if rec.num_tokens_out > 1],
        "itl": [g * 1000.0 for rec, _ in finished for g in tbt_gaps(rec.token_times)],
        "e2el": [rep.e2e_ms for _, rep in finished if rep.e2e_ms is not None],
    }


def latency_fields(finished: list[tuple[RequestRecord, SLOReport]],
                   percentiles: tuple[float, ...]) -> dict[str, Any]:  # fmt: skip
    """`mean_/median_/std_/pXX_{ttft,tpot,itl,e2el}_ms` and `percentiles_*_ms` (vLLM's keys)."""
    fields: dict[str, Any] = {}
    for name, values in latency_samples(finished).items():
        stats = distribution(values, percentiles)
        fields[f"mean_{name}_ms"] = stats.mean
        fields[f"median_{name}_ms"] = stats.median
        fields[f"std_{name}_ms"] = stats.std
        for q, value in stats.percentiles.items():
            fields[f"p{q:g}_{name}_ms"] = value
        fields[f"percentiles_{name}_ms"] = [[q, v] for q, v in stats.percentiles.items()]
    return fields


def slo_fields(reports: list[SLOReport], overall, duration: float) -> dict[str, Any]:
    """Attainment per kind and per class, goodput, rejections and the targets used."""
    by_class = attainment_by_class([r for r in reports if r.is_slo_request], duration or None)
    targets = Counter(
        json.dumps({"class": r.slo_class, **targets_dict(r.targets)}) for r in reports
    )
    return {
        "ttft_attainment": overall.ttft, "tpot_attainment": overall.tpot,
        "tbt_attainment": overall.tbt_token, "deadline_attainment": overall.deadline,
        "slo_attainment": overall.all_met, "goodput": overall.goodput_rps,
        "precision": overall.precision,
        "attainment": overall.to_dict(),
        "attainment_by_class": {name or "none": a.to_dict() for name, a in by_class.items()},
        "rejections": dict(Counter(r.rejection_reason for r in reports if r.outcome == "rejected")),
        "slo_targets": [{**json.loads(key), "num_requests": n} for key, n in targets.items()],
    }  # fmt: skip


def _vllm_arrays(records: list[RequestRecord], reports: list[SLOReport],
                 results: list[RequestResult]) -> dict[str, Any]:  # fmt: skip
    """vLLM's per-request arrays (seconds; 0 where a request produced nothing)."""
    return {
        "input_lens": [r.num_prompt_tokens for r in records],
        "output_lens": [r.num_tokens_out for r in records],
        "ttfts": [(rep.ttft_ms or 0.0) / 1000.0 for rep in reports],
        "itls": [tbt_gaps(r.token_times) for r in records],
        "errors": [res.error for res in results],
    }


def _record_dict(result: RequestResult, record: RequestRecord, report: SLOReport,
                 start: float) -> dict[str, Any]:  # fmt: skip
    """One request's raw record: times in seconds from the start of the run."""

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - start, 6)

    return {
        "request_id": record.request_id, "slo_class": record.targets.slo_class,
        "targets": targets_dict(record.targets),
        "scheduled_arrival_s": round(result.spec.arrival_s, 6),
        "arrival_s": rel(record.arrival_time), "end_s": rel(record.finished_time),
        "token_times_s": [rel(t) for t in record.token_times],
        "outcome": record.outcome, "status": result.status, "error_code": result.error_code,
        "error": result.error, "prompt_tokens": record.num_prompt_tokens,
        "max_tokens": result.spec.max_tokens, "output_tokens": record.num_tokens_out,
        "finish_reason": record.finish_reason,
        "slo": report.to_dict(), "server_slo": result.server_slo,
        "estimated_ttft_ms": result.estimated_ttft_ms,
    }  # fmt: skip


# --- output -------------------------------------------------------------------------------
def summary_table(result: dict[str, Any]) -> str:
    """A `vllm bench serve`-style summary with the SLO section."""
    lines = ["{:=^60}".format(" Serving Benchmark Result ")]

    def row(label: str, value: Any, fmt: str = "{:.2f}") -> None:
        text = "n/a" if value is None else fmt.format(value)
        lines.append(f"{label:<44}{text:>16}")

    row("Successful requests:", result["completed"], "{}")
    row("Failed requests (rejected):", f"{result['failed']} ({result['rejected']})", "{}")
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"], "{}")
    row("Total generated tokens:", result["total_output_tokens"], "{}")
    row("Request throughput (req/s):", result["request_throughput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Total token throughput (tok/s):", result["total_token_throughput"])
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):  # fmt: skip
        lines.append(f"{' ' + title + ' ':-^60}")
        row(f"Mean {name.upper()} (ms):", result[f"mean_{name}_ms"])
        row(f"Median {name.upper()} (ms):", result[f"median_{name}_ms"])
        for q, value in result[f"percentiles_{name}_ms"]:
            if q != 50:  # the median, above
                row(f"P{q:g} {name.upper()} (ms):", value)
    lines.append(f"{' SLO attainment ':-^60}")
    for target in result["slo_targets"]:
        row(f"Targets {target['class'] or '(no class)'} ttft/tbt/max (ms):",
            f"{target['ttft_ms']:g}/{target['tbt_ms']:g}/{target['max_latency_ms']}", "{}")  # fmt: skip
    for key, label in (("ttft_attainment", "TTFT"), ("tpot_attainment", "TPOT"),
                       ("tbt_attainment", "token-level TBT"), ("slo_attainment", "all targets")):  # fmt: skip
        row(f"{label} attainment (%):", _percent(result[key]))
    row("Goodput (req/s meeting all targets):", result["goodput"])
    row("Precision (admitted meeting all, %):", _percent(result["precision"]))
    for name, a in result["attainment_by_class"].items():
        row(f"  {name}: TTFT / TPOT / all / precision (%):",
            f"{_pct_text(a['ttft'])} / {_pct_text(a['tpot'])} / {_pct_text(a['all_met'])} / "
            f"{_pct_text(a['precision'])}", "{}")  # fmt: skip
    if result["rejections"]:
        row("Rejections:", ", ".join(f"{k}={v}" for k, v in result["rejections"].items()), "{}")
    lines.append("=" * 60)
    return "\n".join(lines)


def _percent(share: float | None) -> float | None:
    return None if share is None else 100.0 * share


def _pct_text(share: float | None) -> str:
    return "n/a" if share is None else f"{100.0 * share:.1f}"


def save_result(result: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
