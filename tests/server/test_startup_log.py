"""What `superinfer serve` tells its operator at info: what it loaded, the ready line with
the URL and the KV capacity, each admitted request (--enable-log-requests), refusals with
their request id, and the periodic stats line."""

from __future__ import annotations

import re
import time

import pytest

from tests.server.conftest import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    proc = ServerProcess(
        tmp_path_factory.mktemp("logged"), "--num-device-blocks", "256", "--num-host-blocks",
        "512", "--log-stats-interval", "1", "--enable-log-requests",
    )  # fmt: skip
    proc.start()
    yield proc
    assert proc.stop() == 0, proc.stderr_tail()


def wait_for(proc: ServerProcess, pattern: str, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = proc.stderr_path.read_text(errors="replace")
        if re.search(pattern, text, re.MULTILINE):
            return text
        time.sleep(0.2)
    raise AssertionError(f"no line matching {pattern!r} in:\n{proc.stderr_tail()}")


def test_startup_lines_and_ready_line_with_url_and_kv_capacity(logged):
    text = wait_for(logged, r"\[state\] Ready in")
    assert re.search(r"^INFO \d\d-\d\d \d\d:\d\d:\d\d \[load_report\] Model: .*architecture "
                     r"llama.*quantization Q4_1", text, re.MULTILINE)  # fmt: skip
    # what runs the quantized layers, as the loader found this CPU (model/quant.py)
    assert re.search(r"run quantized, (superinfer's GEMV|PyTorch's int4 kernel)", text)
    assert "KV cache: device pool 256 blocks = 4096 tokens" in text
    assert re.search(r"Attention backend: (cpu|reference) .*; CUDA graphs: off", text)
    assert "Warm-up done in" in text
    ready = re.search(r"^INFO .* \[state\] Ready in .*$", text, re.MULTILINE).group(0)
    assert f"on {logged.url} " in ready
    assert "device 256 blocks = 4096 tokens, host 512 blocks = 8192 tokens" in ready
    # the boot-time request (ServerProcess checks it gets 503) was logged as a refusal
    assert re.search(r"^WARNING .* Rejected request \S+: 503 not_ready", text, re.MULTILINE)


def test_requests_refusals_and_stats_are_logged(logged):
    body = {"prompt": "Say hi.", "max_tokens": 4, "temperature": 0, "request_id": "log-me"}
    assert logged.post("/v1/completions", body).status_code == 200
    wrong = logged.post("/v1/completions", {**body, "request_id": "wrong", "model": "nope"})
    assert wrong.status_code == 404
    wait_for(logged, r"Avg generation throughput: [1-9][\d.]* tokens/s")
    text = wait_for(logged, r"\[stats_log\] .*SLO: 1 ended \(1 finished")  # not the 404
    assert re.search(r"Received request log-me: prompt: \d+ tokens, params: SamplingParams\("
                     r"max_tokens=4.*slo: SLOTargets\(ttft_ms=", text)  # fmt: skip
    assert re.search(r"^INFO .* Rejected request wrong: 404 model_not_found", text, re.MULTILINE)
