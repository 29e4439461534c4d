from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from superinfer.model.cpu_linear import PackedLinear
from superinfer.model.loader import default_model_path, load_model
from tests.model.paged import PagedRun
from tests.model.tiny import PROMPT

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _reference(directory: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["tiny_llama", "tiny_qwen2"])
def test_hf_directory_matches_transformers(name: str, device: str, request) -> None:
    directory = request.getfixturevalue(name)
    assert len(list(directory.glob("*.safetensors"))) > 1
    loaded = load_model(str(directory), torch.float32, device)
    reference = _reference(directory)
    with torch.inference_mode():
        expected = reference(torch.tensor([PROMPT])).logits[0]
        generated = reference.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=8,
            do_sample=False,
            min_new_tokens=8,
            pad_token_id=0,
        )
    run = PagedRun(loaded.model, num_blocks=16, block_size=4)
    seq = run.add(PROMPT)
    torch.testing.assert_close(
        run.step([(seq, len(PROMPT))], all_logits=True), expected, rtol=1e-4, atol=1e-4
    )
    new_tokens = generated[0, len(PROMPT) :].tolist()
    assert PagedRun(loaded.model, 16, 4).greedy(PROMPT, 8) == new_tokens
    assert loaded.tokenizer.convert_tokens_to_ids(["w3", "w7"]) == [3, 7]
    assert loaded.config.name == directory.name


def test_qwen2_config_has_bias_and_tied_embeddings(tiny_qwen2: Path) -> None:
    loaded = load_model(str(tiny_qwen2), torch.float32, "cpu", pack_weights=False)
    assert loaded.config.attention_bias and loaded.config.tie_word_embeddings
    model = loaded.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.model.layers[0].self_attn.qkv_proj.bias.abs().sum() > 0


def test_llama_config_and_packing(tiny_llama: Path) -> None:
    packed = load_model(str(tiny_llama), torch.float32, "cpu")
    plain = load_model(str(tiny_llama), torch.float32, "cpu", pack_weights=False)
    assert plain.config.rope_scaling["rope_type"] == "llama3"
    assert not plain.config.tie_word_embeddings and plain.config.eos_token_ids == [2]
    if any(isinstance(m, PackedLinear) for m in packed.model.modules()):
        assert not any(isinstance(m, PackedLinear) for m in plain.model.modules())
    runs = [PagedRun(m.model, 16, 4) for m in (packed, plain)]
    logits = [run.step([(run.add(PROMPT), len(PROMPT))]) for run in runs]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_is_close_to_float32(tiny_llama: Path, device: str) -> None:
    loaded = load_model(str(tiny_llama), torch.bfloat16, device)
    assert loaded.model.dtype == torch.bfloat16
    run = PagedRun(loaded.model, 16, 4)
    logits = run.step([(run.add(PROMPT), len(PROMPT))], all_logits=True)
    with torch.inference_mode():
        expected = _reference(tiny_llama)(torch.tensor([PROMPT])).logits[0]
    assert logits.dtype == torch.float32
    assert torch.cosine_similarity(logits, expected, dim=-1).min() > 0.99


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_model(str(tmp_path / "nowhere"), torch.float32, "cpu")
    with pytest.raises(ValueError, match="config.json"):
        load_model(str(tmp_path), torch.float32, "cpu")  # exists, but holds no model


def test_unsupported_architecture_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        load_model(str(tmp_path), torch.float32, "cpu")


def test_directory_without_safetensors_is_a_clear_error(tmp_path: Path, tiny_llama: Path) -> None:
    (tmp_path / "config.json").write_text((tiny_llama / "config.json").read_text())
    with pytest.raises(ValueError, match="safetensors"):
        load_model(str(tmp_path), torch.float32, "cpu")


def test_default_model_path_points_at_the_shipped_gguf() -> None:
    path = default_model_path()
    assert os.path.isfile(path) and path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.mark.slow
def test_default_gguf_config_and_tokenizer(smollm) -> None:
    c = smollm.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads) == (30, 576, 9, 3)
    assert c.head_dim == 64
    assert c.vocab_size == 49152 and c.tie_word_embeddings and c.rope_scaling is None
    assert c.eos_token_ids == [2] and c.rope_theta == 100000.0
    chat = smollm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>assistant" in chat


def _cache_snapshot(cache: Path, repo_id: str, source: Path) -> Path:
    """Lay `source` out as the Hugging Face cache holds a downloaded snapshot."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in source.iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    return snapshot


def test_model_id_resolves_through_the_hf_cache_offline(tmp_path, tiny_llama, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = _cache_snapshot(tmp_path, "tiny-org/tiny-llama", tiny_llama)
    loaded = load_model("tiny-org/tiny-llama", torch.float32, "cpu", pack_weights=False)
    assert loaded.checkpoint.path == str(snapshot)
    assert PagedRun(loaded.model, 16, 4).greedy(PROMPT, 4) == PagedRun(
        load_model(str(tiny_llama), torch.float32, "cpu", pack_weights=False).model, 16, 4
    ).greedy(PROMPT, 4)
    with pytest.raises(ValueError, match="Hugging Face cache"):
        load_model("tiny-org/not-cached", torch.float32, "cpu")


@pytest.mark.slow
def test_loading_the_default_model_does_not_import_what_a_server_never_uses() -> None:
    """Building the model must not run PyTorch's Python references (initialising or
    materialising meta tensors), which import sympy and torch._dynamo: tens of MB of
    resident memory for nothing. (transformers imports sympy itself when it reads an HF
    directory or converts a GGUF tokenizer, so this loads the GGUF default twice: the
    second load reads the tokenizer the first one cached.)"""
    code = (
        "import sys, torch\n"
        "from superinfer.model.loader import load_model\n"
        f"load_model({default_model_path()!r}, torch.bfloat16, 'cpu')\n"
        "print(sorted(m for m in ('sympy', 'torch._dynamo') if m in sys.modules))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env=env, check=True)  # fmt: skip
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_a_model_id_downloads_what_the_loader_and_tokenizer_read() -> None:
    """The files `snapshot_download` takes by HUB_PATTERNS, through huggingface_hub's own
    filter: the chat template in its own file (transformers reads chat_template.jinja)
    included, other weight formats not."""
    from huggingface_hub.utils import filter_repo_objects

    from superinfer.model.loader import HUB_PATTERNS

    wanted = ["config.json", "generation_config.json", "model-00001-of-00002.safetensors",
              "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
              "tokenizer.model", "chat_template.jinja", "additional_chat_templates/tools.jinja"]  # fmt: skip
    unwanted = ["pytorch_model.bin", "original/consolidated.00.pth", "model.gguf"]
    taken = list(filter_repo_objects(wanted + unwanted, allow_patterns=HUB_PATTERNS))
    assert taken == wanted
