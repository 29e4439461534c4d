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
    """Two long streams run, two requests wait, and only then do three more arrive: the
    order is established by the server's own counters, not by sleeps."""
    long_body = {"prompt": "Write an essay.", "max_tokens": 300, "ignore_eos": True,
                 "temperature": 0, "stream": True}  # fmt: skip
    body = {"prompt": "Tell me a story.", "max_tokens": 16, "ignore_eos": True, "temperature": 0}
    streams: list[list] = [[], []]
    responses: list[httpx.Response] = []
    threads = [
        threading.Thread(target=stream_lines, args=(small, long_body, out)) for out in streams
    ]
    small.num_posts += len(threads)
    for thread in threads:
        thread.start()
    wait_for(lambda: all(any(kind == "data" for kind, _ in out) for out in streams), "2 running")
    queued = [threading.Thread(target=lambda: responses.append(small.post("/v1/completions", body)))
              for _ in range(2)]  # fmt: skip
    for thread in queued:
        thread.start()
    wait_for(lambda: num_waiting(small) == 2, "2 waiting")
    overflow = [small.post("/v1/completions", body) for _ in range(3)]
    for thread in threads + queued:
        thread.join(300)
    assert [r.status_code for r in overflow] == [429, 429, 429], [r.text for r in overflow]
    assert sorted(r.status_code for r in responses) == [200, 200]
    assert all(out[0] == ("status", 200) and out[-1] == ("data", "[DONE]") for out in streams)
    assert overflow[0].json()["error"]["code"] == "queue_full"
    assert int(overflow[0].headers["retry-after"]) >= 1
    small.wait_idle()


def wait_for(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def num_waiting(small: ServerProcess) -> int:
    for line in small.get("/metrics").text.splitlines():
        if line.startswith("vllm:num_requests_waiting"):
            return int(float(line.split()[-1]))
    raise AssertionError("vllm:num_requests_waiting is not exported")


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
    # long enough to outlast the 5 s drain on a fast CPU too (AMX bf16 decodes ~60 tok/s)
    long_body = {"prompt": "Write an essay.", "max_tokens": 1500, "ignore_eos": True,
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
