"""The flat CPU decode loop (`cpu_decode.py`) against the modules it stands in for: the same
logits and the same cache, bit for bit, and the steps and models it leaves to them; and its
C form (`csrc/decode_layers.c`) against its Python one, for each kind of GGUF layer."""

from __future__ import annotations

import shutil

import pytest
import torch
from gguf import GGMLQuantizationType
from transformers import AutoModelForCausalLM, LlamaConfig

from superinfer.model.attention import AttentionMetadata, SeqEntry
from superinfer.model.attention_backend import CpuBackend, ReferenceBackend
from superinfer.model.cpu_decode import FlatDecode
from superinfer.model.cpu_gemv import gemv_kernel
from superinfer.model.cpu_w4a8 import w4a8_kernel
from superinfer.model.loader import load_gguf_model, load_model
from tests.model.gguf_tiny import write_gguf
from tests.model.paged import PagedRun
from tests.model.tiny import TINY, save_tiny, tiny_configs

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler"
)

CONFIGS = tiny_configs()
PROMPTS = [[1, 17, 42, 99, 5, 63, 8, 120, 33, 71, 3], [1, 9, 4, 77, 31], list(range(3, 60))]


def _decode_both_ways(model, num_steps: int = 6, block_size: int = 4, seed: int = 0,
                      prompts=PROMPTS, use=None):  # fmt: skip
    """Prefill `prompts` through the modules, then decode all of them together `num_steps`
    times with the flat loop and, from the same state, through the modules (or, with
    `use`, after `use(True)` and then `use(False)`). Returns (flat logits, module logits,
    flat cache, module cache)."""
    flat = model.model.flat_decode
    assert flat is not None, "the loader turns the flat loop on for this model"
    if use is None:
        use = lambda is_flat: setattr(model.model, "flat_decode", flat if is_flat else None)
    run = PagedRun(model, num_blocks=96, block_size=block_size, seed=seed, backend="cpu")
    seqs = [run.add(p) for p in prompts]
    run.step([(s, len(p)) for s, p in zip(seqs, prompts)])
    results = []
    for is_flat in (True, False):
        twin = run.clone()
        use(is_flat)
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


Q4_0, Q4_1, Q8_0 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0
Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
K_QUANT = {**TINY, "hidden_size": 256, "intermediate_size": 512}  # super-blocks of 256
# (model, GGUF arch, matrices' type, ffn_down's, --quantization): Q4 GEMV and GEMM, Q8_0 GEMV
# (and GEMM on AMX), Qwen3's q/k norms, Q4_K with Q6_K's GEMV and GEMM, 8-bit activations
C_LOOP_MODELS = {
    "llama-q4_1": (LlamaConfig(**TINY), "llama", Q4_1, Q4_1, "auto"),
    "llama-q8_0": (LlamaConfig(**TINY), "llama", Q8_0, Q8_0, "auto"),
    "qwen3-q4_0": (tiny_configs()["qwen3"], "qwen3", Q4_0, Q4_0, "auto"),
    "llama-q4_k-q6_k": (LlamaConfig(**K_QUANT), "llama", Q4_K, Q6_K, "auto"),
    "llama-q4_1-w4a8": (LlamaConfig(**TINY), "llama", Q4_1, Q8_0, "gguf-w4a8"),
}
MORE_PROMPTS = PROMPTS + [[1, 2, 3], list(range(40, 51)), [5] * 9, [1, 88]]  # 7 rows


@pytest.mark.skipif(gemv_kernel() is None, reason="no AVX-512 BF16 GEMV: no C projections")
@pytest.mark.parametrize("name", C_LOOP_MODELS)
def test_the_c_loop_is_the_python_loop_bit_for_bit(name, tmp_path):
    """Steps of 1, 3 and 7 rows: the few-row GEMV, and the GEMMs beyond it (on AMX from 4
    rows); the C loop runs where every projection is a C call at that size."""
    config, arch, qtype, down_type, quantization = C_LOOP_MODELS[name]
    if quantization == "gguf-w4a8" and w4a8_kernel() is None:
        pytest.skip("no 8-bit-activation GEMM here")
    hf = AutoModelForCausalLM.from_pretrained(save_tiny(tmp_path / "hf", config, seed=5))
    down = {f"blk.{i}.ffn_down.weight": down_type for i in range(config.num_hidden_layers)}
    path = write_gguf(hf.eval(), tmp_path / "m.gguf", arch, qtype, types=down)
    model = load_gguf_model(str(path), torch.bfloat16, torch.device("cpu"), quantization)[0]
    model.use_flat_decode()  # as `load_model` does (it also wants a tokenizer in the file)
    flat = model.model.flat_decode
    c_loop, num_c_calls = flat.c_loop, []
    assert c_loop is not None

    def counted(*args):
        num_c_calls.append(1)
        return c_loop(*args)

    def use(is_c: bool) -> None:
        flat.c_loop = counted if is_c else None

    for prompts in (PROMPTS[:1], PROMPTS, MORE_PROMPTS):
        before = len(num_c_calls)
        c_logits, py_logits, c_cache, py_cache = _decode_both_ways(
            model, num_steps=3, prompts=prompts, use=use
        )
        assert torch.equal(c_logits, py_logits)
        assert torch.equal(c_cache, py_cache)
        assert len(num_c_calls) - before == (3 if flat._plan(len(prompts)) else 0)
    assert num_c_calls, "the one-row steps at least ran in C"
    flat.c_loop = c_loop


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
