"""What the client checks (lm_eval_check.py, vllm_bench_check.py) share: the offline
environment their subprocesses run in, where `import superinfer` comes from, a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def offline_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}


def superinfer_source() -> str:
    """Where the servers' `import superinfer` comes from (PYTHONPATH can point at a clean
    `git archive` of a commit while the working tree is being edited)."""
    return subprocess.run([sys.executable, "-c", "import superinfer; print(superinfer.__file__)"],
                          capture_output=True, text=True, cwd="/").stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
