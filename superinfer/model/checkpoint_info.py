"""What a checkpoint is, for the startup log: its format, architecture and quantization.

For a GGUF file only the leading key/values of the header are read (llama.cpp writes the
`general.*` keys first), not the tokenizer arrays that make a full parse take seconds.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, BinaryIO

from gguf import LlamaFileType

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class CheckpointInfo:
    format: str  # "gguf" | "safetensors"
    architecture: str  # e.g. "llama", "LlamaForCausalLM"
    quantization: str  # e.g. "Q4_1", "none"


def checkpoint_info(path: str) -> CheckpointInfo:
    """Format, architecture and quantization of a `.gguf` file or a Hugging Face directory
    (fields it cannot tell are "unknown")."""
    if path.endswith(".gguf"):
        try:
            fields = gguf_fields(path, ("general.architecture", "general.file_type"))
        except (OSError, ValueError, struct.error):
            fields = {}
        architecture = fields.get("general.architecture", "unknown")
        return CheckpointInfo("gguf", architecture, _file_type(fields.get("general.file_type")))
    try:
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        config = {}
    architecture = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
    quantization = (config.get("quantization_config") or {}).get("quant_method", "none")
    return CheckpointInfo("safetensors", architecture, quantization)


def _file_type(value: int | None) -> str:
    """llama.cpp's file type (the quantization of most tensors): 3 -> "Q4_1"."""
    try:
        return LlamaFileType(value).name.removeprefix("MOSTLY_")
    except ValueError:
        return "unknown"


def gguf_fields(path: str, keys: Collection[str]) -> dict[str, Any]:
    """The values of `keys` in a GGUF file's header; stops reading once all are found."""
    found: dict[str, Any] = {}
    with open(path, "rb") as f:
        magic, version, _, num_kv = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path!r} is not a GGUF file of version 2 or later")
        for _ in range(num_kv):
            if len(found) == len(keys):
                break
            key = _read_string(f)
            value = _read_value(f, _unpack(f, "<I"))
            if key in keys:
                found[key] = value
    return found


def _unpack(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _read_string(f: BinaryIO) -> str:
    return f.read(_unpack(f, "<Q")).decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, value_type: int) -> Any:
    if value_type == _STRING:
        return _read_string(f)
    if value_type == _ARRAY:
        item_type, count = _unpack(f, "<I"), _unpack(f, "<Q")
        return [_read_value(f, item_type) for _ in range(count)]
    if value_type not in _SCALARS:
        raise ValueError(f"unknown GGUF value type {value_type}")
    return _unpack(f, _SCALARS[value_type])
