"""A real `superinfer serve` process on a free port, driven over HTTP (127.0.0.1 only).

`ServerProcess` counts the generation requests it sends, so a test can check that the SLO
log holds exactly one whole line per request. Servers run with --enable-debug-routes so
tests can read KV ownership and the invariant check from /debug/engine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

API_KEY = "test-key"
REPO = Path(__file__).resolve().parents[2]
BOOT_TIMEOUT_S = 240

SLO_YAML = """
classes:
  - name: gold
    ttft_ms: 3000
    tbt_ms: 1000
  - name: silver
    ttft_ms: 5000
    tbt_ms: 2000
  - name: bronze
    ttft_ms: 60000
    tbt_ms: 10000
    reject_infeasible: false
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, tmp: Path, *args: str, api_key: str | None = None, slo_yaml: str = SLO_YAML):
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "slo.jsonl"
        self.stderr_path = tmp / "server.log"
        self.api_key = api_key
        self.num_posts = 0  # generation requests sent (each must leave one log line)
        (tmp / "slo.yaml").write_text(slo_yaml)
        self.args = [
            sys.executable, "-m", "superinfer.cli", "serve", "--port", str(self.port),
            "--enable-debug-routes", "--slo-log", str(self.log_path),
            "--slo-config", str(tmp / "slo.yaml"), "--device", "cpu", *args,
        ]  # fmt: skip
        if api_key:
            self.args += ["--api-key", api_key]
        self.process: subprocess.Popen[bytes] | None = None
        self.boot_observations: dict[str, Any] = {}

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self) -> ServerProcess:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(self.args, cwd=REPO, env=env, stdout=err, stderr=err)
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT_S
        with httpx.Client(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited during boot:\n{self.stderr_tail()}")
                try:
                    status = client.get(self.url + "/health").status_code
                except httpx.TransportError:
                    time.sleep(0.2)
                    continue
                if status == 200:
                    return
                self._observe_not_ready(client)
                time.sleep(0.2)
        raise RuntimeError(f"server not healthy in {BOOT_TIMEOUT_S} s:\n{self.stderr_tail()}")

    def _observe_not_ready(self, client: httpx.Client) -> None:
        """While /health says 503, a generation request must get 503 too (once)."""
        if "post" in self.boot_observations:
            return
        response = self.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}, client=client)
        self.boot_observations["post"] = (response.status_code, response.json())

    def post(self, path: str, body: Any = None, client: httpx.Client | None = None, **kwargs):
        """A generation request (counted): JSON body, or raw `content=`."""
        self.num_posts += 1
        headers = {**self.headers, **kwargs.pop("headers", {})}
        if body is not None:
            kwargs["json"] = body
        if client is not None:
            return client.post(self.url + path, headers=headers, **kwargs)
        timeout = kwargs.pop("timeout", 120)
        with httpx.Client(timeout=timeout) as own:
            return own.post(self.url + path, headers=headers, **kwargs)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers, timeout=60)

    def debug(self) -> dict[str, Any]:
        return self.get("/debug/engine").json()

    def wait_idle(self, timeout_s: float = 120) -> dict[str, Any]:
        """/debug/engine once nothing is unfinished and no KV copy is in flight."""
        deadline = time.monotonic() + timeout_s
        while True:
            report = self.debug()
            is_idle = report["num_unfinished"] == 0 and report["num_inflight"] == 0
            if is_idle and report["num_inflight_transfers"] == 0:
                return report
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle: {report}")
            time.sleep(0.2)

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def log_lines(self) -> list[dict[str, Any]]:
        """The SLO log; every line must be whole JSON ending in a newline."""
        text = self.log_path.read_text() if self.log_path.exists() else ""
        assert text == "" or text.endswith("\n"), "the SLO log ends in a partial line"
        return [json.loads(line) for line in text.splitlines()]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 90) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def stderr_tail(self, num_chars: int = 4000) -> str:
        return self.stderr_path.read_text(errors="replace")[-num_chars:]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The default-configured server (default pool sizes), with an API key."""
    proc = ServerProcess(tmp_path_factory.mktemp("server"), api_key=API_KEY)
    proc.start()
    yield proc
    code = proc.stop()
    lines = proc.log_lines()
    assert code == 0, proc.stderr_tail()
    assert len(lines) == proc.num_posts, "one SLO log line per generation request"
