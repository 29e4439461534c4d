"""Process-wide logging: one format, one level, uvicorn's loggers included.

    INFO 12-01 20:31:02 [llm_engine] Model: SmolLM2-135M-Instruct (llama, ...)

The bracket names the module for superinfer's own loggers and the library otherwise
(`[uvicorn]`), as vLLM's lines do.
"""

from __future__ import annotations

import logging

LEVELS = ("critical", "error", "warning", "info", "debug")
FORMAT = "%(levelname)s %(asctime)s [%(source)s] %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"


class SourceFormatter(logging.Formatter):
    """vLLM-like lines; `source` is the module of a superinfer logger, else the library."""

    def format(self, record: logging.LogRecord) -> str:
        is_ours = record.name.split(".")[0] == "superinfer"
        record.source = record.module if is_ours else record.name.split(".")[0]
        return super().format(record)


def configure_logging(level: str) -> None:
    """Log to stderr at `level` (one of LEVELS), replacing any earlier configuration;
    uvicorn's loggers get the same level and format (its access log stays off)."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {LEVELS}, got {level!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(SourceFormatter(FORMAT, DATE_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(level.upper())
