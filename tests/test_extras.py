"""A command that needs a missing extra says which one to install: one line, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from superinfer.extras import missing_extra_message

# runs the CLI with a module made unimportable, as on an install without its extra
_RUN = "import sys; sys.modules[{module!r}] = None; from superinfer.cli import main; sys.exit(main({argv!r}))"


def run_without(module: str, argv: list[str]) -> subprocess.CompletedProcess:
    code = _RUN.format(module=module, argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("module, argv, extra", [
    ("ray", ["serve", "--replicas", "2", "--router", "ray"], "ray"),
    ("tqdm", ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"], "bench"),
])  # fmt: skip
def test_missing_extra_is_one_line_naming_it(module, argv, extra):
    result = run_without(module, argv)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and f"superinfer[{extra}]" in result.stderr


def test_other_missing_modules_stay_errors():
    assert missing_extra_message(ModuleNotFoundError("x", name="numpy")) is None
    assert "'ray' extra" in missing_extra_message(ModuleNotFoundError("x", name="ray.serve"))
