"""Poll a server's Prometheus `/metrics` during a run: KV usage, queues, preemptions and
rotations over time, for the timeline plot.

Reads vLLM's names (superinfer exposes them too) and superinfer's own series; a server
that lacks a series simply has no values for it. Samples are summed over their labels,
except `direction` of the KV transfer counters, which is kept in the key
(`superinfer:kv_transfer_bytes_total{direction=d2h}`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

SERIES = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # older vLLM's name for the device KV usage
    "vllm:cpu_cache_usage_perc",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:num_requests_swapped",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "superinfer:rotations_total",
    "superinfer:swap_ins_total",
    "superinfer:kv_transfer_bytes_total",
)


def parse_metrics(text: str, series: tuple[str, ...] = SERIES) -> dict[str, float]:
    """The wanted samples of one Prometheus text exposition."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name not in series:
                continue
            key = sample.name
            if "direction" in sample.labels:
                key += "{direction=" + sample.labels["direction"] + "}"
            values[key] = values.get(key, 0.0) + float(sample.value)
    return values


class MetricsPoller:
    """Scrape `/metrics` every `interval_s` until stopped; `timeline` holds
    `{"t": seconds since start, **values}` per scrape (failed scrapes are skipped)."""

    def __init__(self, base_url: str, interval_s: float = 0.5,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        self.url = base_url.rstrip("/") + "/metrics"
        self.interval_s = interval_s
        self.headers = headers or {}
        self.timeline: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._start_time = 0.0

    def start(self, start_time: float) -> None:
        self._start_time = start_time
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> list[dict[str, Any]]:
        """Stop polling; one last scrape makes the timeline end with the run's final state
        (a short run can fall between two periodic scrapes)."""
        if self._task is None:
            return self.timeline
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        async with httpx.AsyncClient(timeout=5.0, headers=self.headers) as client:
            await self.scrape(client, self._start_time)
        return self.timeline

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=5.0, headers=self.headers) as client:
            while True:
                await self.scrape(client, self._start_time)
                await asyncio.sleep(self.interval_s)

    async def scrape(self, client: httpx.AsyncClient, start_time: float) -> None:
        try:
            response = await client.get(self.url)
        except httpx.HTTPError:
            return
        if response.status_code == 200:
            values = parse_metrics(response.text)
            self.timeline.append({"t": round(time.perf_counter() - start_time, 3), **values})
