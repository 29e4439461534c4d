"""The engine host on the real default model, without HTTP: every admitted request leaves
exactly one SLO record (finished, aborted by its client, aborted by the drain), a reused
request id is refused, the debug report sees a clean engine afterwards, and admission
refuses a TBT target no step keeps unless its TBT check is turned off."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from superinfer.config import EngineConfig
from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.engine_host import EngineHost
from superinfer.server.errors import APIError
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.prepare import RequestPreparer
from superinfer.server.prometheus import ServerMetrics
from superinfer.server.protocol import CompletionRequest
from superinfer.slo.classes import SLOConfig
from superinfer.slo.record_log import SLOLog

pytestmark = pytest.mark.slow

ENGINE = EngineConfig.from_flat(device="cpu", num_device_blocks=64, num_host_blocks=64,
                                max_model_len=512)  # fmt: skip


async def run_host(tmp_path) -> tuple[dict, list]:
    slo_log = SLOLog(tmp_path / "slo.jsonl")
    reports: list = []
    error_log = RateLimitedLog(logging.getLogger(__name__))
    host = EngineHost(ServerConfig(), ENGINE, slo_log, ServerMetrics("m", None), error_log,
                      on_report=reports.append)  # fmt: skip
    assert host.snapshot is None and await host.debug_report() is None
    await host.start()
    engine = host.engine.engine
    preparer = RequestPreparer(engine.tokenizer, engine.model_config.vocab_size, 512, SLOConfig())

    def admit(request_id: str, max_tokens: int):
        body = CompletionRequest.model_validate(
            {"prompt": "Hello", "request_id": request_id, "max_tokens": max_tokens,
             "ignore_eos": True}
        )  # fmt: skip
        arrival = Arrival(time.monotonic(), time.time())
        return host.admit(preparer.prepare(body, {}, arrival), arrival, max_tokens)

    try:
        stream, inflight = admit("done", 3)
        with pytest.raises(APIError) as duplicate:
            admit("done", 3)
        assert (duplicate.value.status, duplicate.value.code) == (400, "duplicate_request_id")
        outputs = [output async for output in stream]
        assert outputs[-1].finished and inflight.report is not None

        _, left = admit("left", 400)
        host.abort(left, "client_disconnected")
        await host.engine.wait_idle(30)
        host.abort(left, "again")  # ended: a no-op

        admit("cut", 400)
        await host.drain(0.0)
        report = await host.debug_report()
    finally:
        await host.shutdown()
        slo_log.close()
    return report, reports


def test_each_admitted_request_leaves_exactly_one_record(tmp_path):
    report, reports = asyncio.run(run_host(tmp_path))
    lines = [json.loads(text) for text in (tmp_path / "slo.jsonl").read_text().splitlines()]
    by_id = {line["id"]: line for line in lines}
    assert len(lines) == len(by_id) == 3 == len(reports)
    assert (by_id["done"]["outcome"], by_id["done"]["status"], by_id["done"]["reason"]) == (
        "finished", 200, None
    )  # fmt: skip
    assert by_id["done"]["output_tokens"] == 3
    assert (by_id["left"]["outcome"], by_id["left"]["reason"]) == ("aborted", "client_disconnected")
    assert (by_id["cut"]["outcome"], by_id["cut"]["reason"]) == ("aborted", "shutdown")
    assert report["num_inflight"] == 0 and report["num_unfinished"] == 0
    assert report["invariants"] == "ok" and report["num_block_tables"] == 0


async def estimates_of_a_repeated_prompt(tmp_path) -> tuple[float, float, float, int]:
    """Compute estimates at admission: a prompt, another as long, then the first again
    (its prefix cached), each on an idle engine; and the hit its prefill took."""
    slo_log = SLOLog(tmp_path / "slo.jsonl")
    host = EngineHost(ServerConfig(), ENGINE, slo_log, ServerMetrics("m", None),
                      RateLimitedLog(logging.getLogger(__name__)))  # fmt: skip
    await host.start()
    host.warmup_prefill_s_per_token = 1e-3  # what a warm-up measures (none runs here)
    engine = host.engine.engine
    preparer = RequestPreparer(engine.tokenizer, engine.model_config.vocab_size, 512, SLOConfig())
    estimates = []
    try:
        for request_id, word in (("a", "apple"), ("b", "berry"), ("a-again", "apple")):
            body = CompletionRequest.model_validate(
                {"prompt": " ".join([word] * 200), "request_id": request_id, "max_tokens": 2}
            )
            arrival = Arrival(time.monotonic(), time.time())
            stream, inflight = host.admit(preparer.prepare(body, {}, arrival), arrival, 2)
            estimates.append(inflight.estimate.compute_s)
            _ = [output async for output in stream]
            await host.engine.wait_idle(30)
        num_hit = host.snapshot.prefix_cache_hits
    finally:
        await host.shutdown()
        slo_log.close()
    return (*estimates, num_hit)


def test_admission_leaves_out_the_prefix_the_cache_holds(tmp_path):
    first, other, again, num_hit = asyncio.run(estimates_of_a_repeated_prompt(tmp_path))
    assert num_hit >= 192  # the repeat's prefill read 12 of its ~13 blocks from the cache
    assert min(first, other) >= 0.2  # 200 tokens and more at 1 ms
    assert again < 0.5 * min(first, other)


async def tbt_answers(tmp_path) -> dict[bool, str]:
    """A request whose TBT target no step of this engine keeps (1 ms against the 10 ms a
    warm-up would have measured), under the default flags and with the TBT check off: the
    refusal's reason, or "admitted"."""
    answers = {}
    for is_checked in (True, False):
        config = ServerConfig() if is_checked else ServerConfig(reject_infeasible_tbt=False)
        slo_log = SLOLog(tmp_path / f"slo_{is_checked}.jsonl")
        host = EngineHost(config, ENGINE, slo_log, ServerMetrics("m", None),
                          RateLimitedLog(logging.getLogger(__name__)))  # fmt: skip
        await host.start()
        host.warmup_step_time_s, host.warmup_prefill_s_per_token = 0.01, 1e-3  # no warm-up here
        engine = host.engine.engine
        preparer = RequestPreparer(engine.tokenizer, engine.model_config.vocab_size, 512,
                                   SLOConfig())  # fmt: skip
        body = CompletionRequest.model_validate({"prompt": "Hello", "max_tokens": 8})
        arrival = Arrival(time.monotonic(), time.time())
        try:
            stream, _ = host.admit(preparer.prepare(body, {"x-slo-tbt-ms": "1"}, arrival),
                                   arrival, 8)  # fmt: skip
            _ = [output async for output in stream]
            answers[is_checked] = "admitted"
        except APIError as error:
            answers[is_checked] = error.reason
        finally:
            await host.shutdown()
            slo_log.close()
    return answers


def test_the_tbt_check_is_on_by_default(tmp_path):
    assert asyncio.run(tbt_answers(tmp_path)) == {True: "tbt_infeasible", False: "admitted"}
