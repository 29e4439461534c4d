"""`configure_logging`: vLLM-like lines, uvicorn at the same level."""

from __future__ import annotations

import logging
import re

import pytest

from superinfer.logs import configure_logging


@pytest.fixture
def restore_logging():
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error")]
    handlers, levels = loggers[0].handlers[:], [logger.level for logger in loggers]
    yield
    loggers[0].handlers[:] = handlers
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


def test_format_names_our_module_or_the_library(restore_logging):
    configure_logging("warning")
    formatter = logging.getLogger().handlers[0].formatter
    ours = logging.LogRecord("superinfer.server.state", logging.INFO, "/x/state.py", 1, "hi %d",
                             (1,), None)  # fmt: skip
    theirs = logging.LogRecord("uvicorn.error", logging.WARNING, "/y/server.py", 1, "up", (), None)
    assert re.fullmatch(r"INFO \d\d-\d\d \d\d:\d\d:\d\d \[state\] hi 1", formatter.format(ours))
    assert formatter.format(theirs).endswith("[uvicorn] up")
    assert logging.getLogger().level == logging.WARNING
    assert logging.getLogger("uvicorn.error").level == logging.WARNING


def test_unknown_level_is_refused(restore_logging):
    with pytest.raises(ValueError, match="log level"):
        configure_logging("verbose")
