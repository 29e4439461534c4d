"""A small server (2 running, 2 queued at most): the bounded queue answers 429 with
Retry-After; SIGTERM mid-load drains it (503 for newcomers, short requests finish, long
ones are aborted at the timeout), the SLO log is whole, and the process exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    proc = ServerProcess(
        tmp_path_factory.mktemp("small"), "--max-num-seqs", "2", "--max-num-queued-reqs", "2",
        "--shutdown-timeout", "5", "--num-device-blocks", "256", "--num-host-blocks", "256",
    )  # fmt: skip
    proc.start()
    yield proc
    proc.stop(signal.SIGKILL)


def test_queue_full_is_429_with_retry_after(small):
    body = {"prompt": "Tell me a story.", "max_tokens": 16, "ignore_eos": True, "temperature": 0}
    responses: list[httpx.Response] = []

    def send(delay_s: float) -> None:
        time.sleep(delay_s)
        responses.append(small.post("/v1/completions", body))

    threads = [threading.Thread(target=send, args=(0.05 * i,)) for i in range(7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 4 and statuses.count(429) >= 1, statuses
    assert set(statuses) <= {200, 429}
    rejected = next(r for r in responses if r.status_code == 429)
    assert rejected.json()["error"]["code"] == "queue_full"
    assert int(rejected.headers["retry-after"]) >= 1
    small.wait_idle()


def stream_lines(small: ServerProcess, body: dict, out: list) -> None:
    """Collect the SSE data lines of one streaming request (it may be aborted)."""
    try:
        with (
            httpx.Client(timeout=120, headers=small.headers) as client,
            client.stream("POST", small.url + "/v1/completions", json=body) as response,
        ):
            out.append(("status", response.status_code))
            for line in response.iter_lines():
                if line.startswith("data: "):
                    out.append(("data", line[6:]))
    except httpx.TransportError as error:
        out.append(("error", repr(error)))


def test_sigterm_mid_load_drains_and_exits_0(small):
    long_body = {"prompt": "Write an essay.", "max_tokens": 400, "ignore_eos": True,
                 "temperature": 0, "stream": True}  # fmt: skip
    short_body = {**long_body, "prompt": "Say hi.", "max_tokens": 20}
    streams: list[list] = [[] for _ in range(3)]
    bodies = [long_body, short_body, long_body]  # the last one waits for a free slot
    threads = [
        threading.Thread(target=stream_lines, args=(small, b, s)) for b, s in zip(bodies, streams)
    ]
    small.num_posts += len(threads)
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    time.sleep(0.5)  # the first two are decoding, the third waits for a slot
    small.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    late = small.post("/v1/completions", {"prompt": "late", "max_tokens": 2})
    assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
    code = small.process.wait(60)
    for thread in threads:
        thread.join(60)
    assert code == 0, small.stderr_tail()

    finish = []
    for stream in streams:
        data = [json.loads(d) for kind, d in stream if kind == "data" and d != "[DONE]"]
        assert ("data", "[DONE]") in stream, stream[-3:]
        finish.append(data[-1]["choices"][0]["finish_reason"])
        assert "slo" in data[-1]
    assert finish == ["abort", "length", "abort"], finish  # the short one finished in time

    lines = small.log_lines()
    assert len(lines) == small.num_posts
    aborted = [line for line in lines if line["outcome"] == "aborted"]
    assert len(aborted) == 2 and all(line["reason"] == "shutdown" for line in aborted)
    assert (
        sum(line["outcome"] == "rejected" and line["reason"] == "draining" for line in lines) == 1
    )
