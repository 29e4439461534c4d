"""Class isolation: a bronze flood never takes the device blocks gold reserves, and gold's
TTFT stays within target while the flood runs (needs `SchedulerConfig.class_reservations`).

The device pool holds 64 blocks; gold reserves half of them and a quarter of each step's
token budget. Twelve bronze streams would need about 130 blocks, so without the reserve
they would fill the pool."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from superinfer.config import SchedulerConfig
from tests.server.conftest import ServerProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        "class_reservations" not in {f.name for f in dataclasses.fields(SchedulerConfig)},
        reason="the scheduler has no class reservations yet",
    ),
]

NUM_DEVICE_BLOCKS = 64
GOLD_SHARE = 0.5
ISOLATION_YAML = f"""
classes:
  - name: gold
    ttft_ms: 2500
    tbt_ms: 2000
    reserved_kv_share: {GOLD_SHARE}
    reserved_token_share: 0.25
  - name: bronze
    ttft_ms: 120000
    tbt_ms: 20000
    reject_infeasible: false
"""
WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
]


@pytest.fixture(scope="module")
def isolated(tmp_path_factory):
    proc = ServerProcess(
        tmp_path_factory.mktemp("isolation"), "--num-device-blocks", str(NUM_DEVICE_BLOCKS),
        "--num-host-blocks", "512", "--max-num-seqs", "16", "--max-num-batched-tokens", "256",
        "--max-model-len", "512", slo_yaml=ISOLATION_YAML,
    )  # fmt: skip
    proc.start()
    yield proc
    assert proc.stop() == 0


def bronze_prompt(index: int) -> str:
    # distinct from the first token on, so no two bronze requests share a cached block
    words = [WORDS[(index * 7 + i * (index + 3)) % len(WORDS)] for i in range(110)]
    return f"{index} " + " ".join(words)


def sample_blocks(proc: ServerProcess, stop: threading.Event, samples: list[dict]) -> None:
    while not stop.is_set():
        samples.append(proc.debug()["running_device_blocks_by_class"])
        time.sleep(0.1)


def test_bronze_flood_keeps_out_of_golds_reserve(isolated):
    stop, samples, bronze_codes = threading.Event(), [], []
    sampler = threading.Thread(target=sample_blocks, args=(isolated, stop, samples))
    flood = [
        threading.Thread(target=lambda i=i: bronze_codes.append(isolated.post(
            "/v1/completions", {"prompt": bronze_prompt(i), "max_tokens": 40, "ignore_eos": True,
                                "temperature": 0}, headers={"x-slo-class": "bronze"}).status_code))
        for i in range(12)
    ]  # fmt: skip
    sampler.start()
    for thread in flood:
        thread.start()
    time.sleep(4.0)  # the flood has filled what bronze may take
    gold = []
    for i in range(3):
        body = {"prompt": f"Gold question {i}: what is {i} plus {i}?", "max_tokens": 8,
                "temperature": 0, "slo": {"class": "gold"}}  # fmt: skip
        gold.append(isolated.post("/v1/completions", body).json()["slo"])
    for thread in flood:
        thread.join(600)
    stop.set()
    sampler.join()

    assert bronze_codes == [200] * 12
    bronze_peak = max(s.get("bronze", 0) for s in samples)
    limit = NUM_DEVICE_BLOCKS - int(GOLD_SHARE * NUM_DEVICE_BLOCKS)
    print(f"\nbronze peak {bronze_peak} of {limit} blocks; gold TTFT "
          f"{[round(g['ttft_ms']) for g in gold]} ms")  # fmt: skip
    assert bronze_peak <= limit, f"bronze held {bronze_peak} device blocks, limit {limit}"
    assert bronze_peak >= limit * 0.6, "the flood never pressed on the reserve"
    assert all(g["ttft_met"] and g["class"] == "gold" for g in gold), gold
    report = isolated.wait_idle()
    assert report["invariants"] == "ok"
    assert report["device_blocks_used"] == 0 and report["host_blocks_used"] == 0
