"""The flat CPU decode loop (`cpu_decode.py`) against the modules it stands in for: the same
logits and the same cache, bit for bit, and the steps and models it leaves to them."""

from __future__ import annotations

import shutil

import pytest
import torch

from superinfer.model.attention import AttentionMetadata, SeqEntry
from superinfer.model.attention_backend import CpuBackend, ReferenceBackend
from superinfer.model.cpu_decode import FlatDecode
from superinfer.model.loader import load_model
from tests.model.paged import PagedRun
from tests.model.tiny import save_tiny, tiny_configs

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)

CONFIGS = tiny_configs()
PROMPTS = [[1, 17, 42, 99, 5, 63, 8, 120, 33, 71, 3], [1, 9, 4, 77, 31], list(range(3, 60))]


def _decode_both_ways(model, num_steps: int = 6, block_size: int = 4, seed: int = 0):
    """Prefill PROMPTS through the modules, then decode all of them together `num_steps`
    times with the flat loop and, from the same state, through the modules. Returns
    (flat logits, module logits, flat cache, module cache)."""
    flat = model.model.flat_decode
    assert flat is not None, "the loader turns the flat loop on for this model"
    run = PagedRun(model, num_blocks=96, block_size=block_size, seed=seed, backend="cpu")
    seqs = [run.add(p) for p in PROMPTS]
    run.step([(s, len(p)) for s, p in zip(seqs, PROMPTS)])
    results = []
    for is_flat in (True, False):
        twin = run.clone()
        model.model.flat_decode = flat if is_flat else None
        steps = []
        for i in range(num_steps):
            for s in seqs:  # the same next tokens both ways
                twin.tokens[s].append((7 * i + 3 * s) % 100 + 3)
            steps.append(twin.step([(s, 1) for s in seqs]))
        results.append((torch.stack(steps), twin.kv_cache))
    model.model.flat_decode = flat
    (flat_logits, flat_cache), (module_logits, module_cache) = results
    return flat_logits, module_logits, flat_cache, module_cache


NAMES = ["llama", "llama-bias", "granite", "qwen2", "qwen3", "gemma", "phi3", "phi3-longrope"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_logits_and_cache_as_the_modules(name, dtype, tmp_path):
    """Llama (llama3 RoPE; and with a bias on every projection), Granite (multipliers),
    Qwen2 (q/k/v bias), Qwen3
    (q/k norms), Gemma (norm offset, GeGLU, embedding scale), Phi-3 (fused checkpoint
    projections; and LongRoPE on 3/4 of each head), in both dtypes the kernels take."""
    directory = save_tiny(tmp_path / name, CONFIGS[name], seed=5)
    model = load_model(str(directory), dtype, "cpu").model
    flat_logits, module_logits, flat_cache, module_cache = _decode_both_ways(model)
    assert torch.equal(flat_logits, module_logits)
    assert torch.equal(flat_cache, module_cache)


def test_default_model_in_bfloat16_is_the_modules_bit_for_bit(smollm_bf16):
    """Head size 64, three kv heads of three query heads each, int4 projections: the
    vectorized attention and the rotation of the real model."""
    model = smollm_bf16.model
    flat_logits, module_logits, flat_cache, module_cache = _decode_both_ways(
        model, num_steps=4, block_size=16
    )
    assert torch.equal(flat_logits, module_logits)
    assert torch.equal(flat_cache, module_cache)


def _meta(entries, backend=None) -> AttentionMetadata:
    return AttentionMetadata.build(entries, 4, "cpu", backend=backend)


def test_takes_decode_only_steps_with_the_cpu_backend(smollm_bf16):
    flat = smollm_bf16.model.model.flat_decode
    config = smollm_bf16.config
    cache = torch.zeros(8, config.num_layers, 2, 4, config.num_kv_heads, config.head_dim,
                        dtype=torch.bfloat16)  # fmt: skip
    decode = [SeqEntry(1, 5, [0, 1]), SeqEntry(1, 2, [2])]
    mixed = [SeqEntry(1, 5, [0, 1]), SeqEntry(3, 0, [2])]
    assert flat.takes(_meta(decode), cache)
    assert flat.takes(_meta(decode, CpuBackend(4, torch.device("cpu"))), cache)
    assert not flat.takes(_meta(mixed), cache), "a prefill chunk in the step"
    assert not flat.takes(_meta(decode, ReferenceBackend(4, torch.device("cpu"))), cache)
    assert not flat.takes(_meta(decode), cache.float()), "a cache of another dtype"


def test_a_slot_outside_the_cache_raises(smollm_bf16):
    model, config = smollm_bf16.model, smollm_bf16.config
    cache = torch.zeros(4, config.num_layers, 2, 4, config.num_kv_heads, config.head_dim,
                        dtype=torch.bfloat16)  # fmt: skip
    meta = _meta([SeqEntry(1, 5, [0, 1])])
    meta.slot_blocks[0] = 9
    with torch.inference_mode(), pytest.raises(RuntimeError, match="status -3"):
        model(torch.tensor([5]), meta.positions, cache, meta)
    assert not cache.any(), "nothing was written"


@pytest.mark.parametrize(
    "name, reason",
    [("mistral", "sliding windows"), ("gemma2", "sandwich"), ("gemma3", "rotary base"),
     ("mixtral", "experts")],
)  # fmt: skip
def test_declines_layers_it_does_not_run(name, reason, tmp_path):
    directory = save_tiny(tmp_path / name, CONFIGS[name], seed=5)
    model = load_model(str(directory), torch.float32, "cpu", pack_weights=False).model
    flat, why = FlatDecode.build(model.model)
    assert flat is None and model.model.flat_decode is None
    assert reason in why
