"""docs/configuration.md names every flag of `superinfer serve`, with its default."""

from __future__ import annotations

import argparse
from pathlib import Path

from superinfer.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def serve_actions() -> list[argparse.Action]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [
        a
        for a in sub.choices["serve"]._actions
        if a.option_strings and a.dest not in ("help", "verbose")
    ]


def test_every_serve_flag_is_documented_with_its_default():
    text = DOC.read_text()
    rows = {
        line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `--")
    }
    for action in serve_actions():
        flag = action.option_strings[0]  # --name (booleans also have --no-name)
        row = next((line for key, line in rows.items() if f"`{flag}`" in key), None)
        assert row is not None, f"{flag} is missing from docs/configuration.md"
        assert f"`{action.default}`" in row, (
            f"{flag}: the documented default is not {action.default}"
        )
