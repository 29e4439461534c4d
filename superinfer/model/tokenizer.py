"""The tokenizer (and chat template) that comes with a model.

A vision-language checkpoint may keep its chat template only in its processor's
`chat_template.json` (Mistral Small 3.1), which transformers' tokenizer does not read; it
is taken from there when the tokenizer has none, as vLLM resolves it.

Building one from a GGUF file is slow: transformers parses the file again and converts its
vocabulary (about 3.5 s for SmolLM2, against 0.3 s to load a saved copy). The converted
tokenizer is therefore kept on disk, keyed by the file's path, size and mtime, under
$SUPERINFER_CACHE_DIR (default ~/.cache/superinfer; set it empty to disable the cache).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile

import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)
PROCESSOR_CHAT_TEMPLATE = "chat_template.json"


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a Hugging Face directory or of a .gguf file."""
    if not path.endswith(".gguf"):
        tokenizer = AutoTokenizer.from_pretrained(path)
        if getattr(tokenizer, "chat_template", None) is None:
            tokenizer.chat_template = _processor_chat_template(path)
        return tokenizer
    cached = _cache_path(path)
    if cached is not None and os.path.isdir(cached):
        try:
            return AutoTokenizer.from_pretrained(cached)
        except (OSError, ValueError) as e:
            logger.warning("ignoring unreadable tokenizer cache %s: %s", cached, e)
    directory, filename = os.path.split(os.path.abspath(path))
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    if cached is not None:
        _save(tokenizer, cached)
    return tokenizer


def _processor_chat_template(path: str) -> str | None:
    """The chat template of a processor's `chat_template.json` in `path`, if any."""
    try:
        with open(os.path.join(path, PROCESSOR_CHAT_TEMPLATE)) as f:
            template = json.load(f).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) else None


def cache_root() -> str:
    default = os.path.join(os.path.expanduser("~"), ".cache", "superinfer")
    return os.environ.get("SUPERINFER_CACHE_DIR", default)


def _cache_path(gguf_path: str) -> str | None:
    root = cache_root()
    if not root:
        return None
    stat = os.stat(gguf_path)
    identity = (
        f"{os.path.abspath(gguf_path)}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return os.path.join(root, "tokenizers", key)


def _save(tokenizer: PreTrainedTokenizerBase, target: str) -> None:
    """Write to a temporary directory, then rename: readers never see a partial copy."""
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(dir=parent)
    except OSError as e:
        logger.info("not caching the tokenizer: %s", e)
        return
    try:
        tokenizer.save_pretrained(staging)
        os.rename(staging, target)
    except OSError as e:  # e.g. another process saved it first
        logger.info("not caching the tokenizer: %s", e)
        shutil.rmtree(staging, ignore_errors=True)
