"""What a request gets when it does not say: the chat template, the default sampling
parameters and the tool-call format, from `--chat-template`, `--generation-config` and
`--tool-call-parser` as vLLM reads them."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from superinfer.config import EngineConfig
from superinfer.server.config import ServerConfig

logger = logging.getLogger(__name__)

# generation_config.json key -> the request field it is the default of (vLLM's list)
_SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                  "max_new_tokens": "max_tokens"}  # fmt: skip


@dataclass
class ServingDefaults:
    chat_template: str | None = None  # None: the tokenizer's own
    sampling: dict[str, Any] = field(default_factory=dict)  # request field -> default
    tool_call_parser: str = "hermes"  # superinfer.server.tools.PARSERS


def serving_defaults_of(server: ServerConfig, engine: EngineConfig) -> ServingDefaults:
    """The defaults `--chat-template` and `--generation-config` give the served model."""
    return ServingDefaults(
        load_chat_template(server.chat_template),
        load_generation_defaults(server.generation_config, engine.model.model),
        server.tool_call_parser,
    )


def load_chat_template(value: str | None) -> str | None:
    """`--chat-template`: a file holding a Jinja template, or the template itself."""
    if value is None:
        return None
    path = os.path.expanduser(value)
    if os.path.isfile(path):
        with open(path) as f:
            return f.read()
    if "{" not in value:  # neither a file nor a template: most likely a mistyped path
        raise FileNotFoundError(f"--chat-template {value!r}: no such file")
    return value


def load_generation_defaults(setting: str, model_path: str | None) -> dict[str, Any]:
    """`--generation-config`: `auto` reads the model directory's generation_config.json,
    `vllm` (or `none`) uses none, anything else is a directory holding that file.
    Returns request field -> default, for the sampling fields superinfer has."""
    if setting in ("vllm", "none"):
        return {}
    directory = model_path if setting == "auto" else os.path.expanduser(setting)
    if directory is None or not os.path.isdir(directory):
        if setting != "auto":
            raise FileNotFoundError(f"--generation-config {setting!r}: no such directory")
        return {}  # a GGUF file carries no generation config
    path = os.path.join(directory, "generation_config.json")
    if not os.path.isfile(path):
        if setting != "auto":
            raise FileNotFoundError(
                f"--generation-config: no generation_config.json in {setting!r}"
            )
        return {}
    with open(path) as f:
        config = json.load(f)
    defaults = {_SAMPLING_KEYS[k]: v for k, v in config.items() if k in _SAMPLING_KEYS}
    if defaults:
        logger.info("default sampling parameters from %s: %s", path, defaults)
    return defaults
