"""Fused GGUF layers whose parts differ in type (`quant_parts.MixedLinear`): each part on
the few-row GEMV for steps of a few rows and on the GEMM for larger ones, against the
weights the GEMM multiplies by, the file dequantized, the flat decode loop and the engine."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from gguf import GGMLQuantizationType
from torch import Tensor, nn
from transformers import AutoTokenizer, LlamaConfig, Qwen2Config, Qwen3Config

from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import gemv_kernel
from superinfer.model.cpu_linear import pack_linears
from superinfer.model.cpu_q4 import Q6K_SCALED_MAX_ROWS, q4_kernel
from superinfer.model.cpu_w4a8 import w4a8_kernel
from superinfer.model.loader import load_gguf_model
from superinfer.model.quant import int4_kernel_available
from superinfer.model.quant_parts import MixedLinear
from tests.model.gguf_tiny import MIXED_PROMPTS, engine_greedy, q4_k_m_types, write_gguf
from tests.model.paged import greedy_logits
from tests.model.test_cpu_decode import _decode_both_ways
from tests.model.test_quant import K_QUANT_SIZES, _k_quant_model
from tests.model.tiny import PROMPT, TINY

pytestmark = pytest.mark.skipif(
    not int4_kernel_available() or gemv_kernel() is None or q4_kernel() is None,
    reason="no int4 CPU kernel, or no AVX-512 BF16 GEMV",
)
CPU = torch.device("cpu")
Q4_0, Q8_0, Q4_K, Q6_K = (GGMLQuantizationType[n] for n in ("Q4_0", "Q8_0", "Q4_K", "Q6_K"))
NUM_LAYERS = TINY["num_hidden_layers"]
# name -> (config, llama.cpp architecture, type of most matrices, the others' types)
FILES = {
    # Q4_K_M: layer 1's attn_v (and ffn_down, the head) Q6_K; q/k rows stored interleaved
    "llama": (LlamaConfig(**{**TINY, **K_QUANT_SIZES}), "llama", Q4_K,
              q4_k_m_types(NUM_LAYERS, is_tied=False)),
    # q/k rows reordered at load (`quant._interleave`); the tied head is the embedding
    "qwen3": (Qwen3Config(**{**TINY, **K_QUANT_SIZES}, head_dim=64, tie_word_embeddings=True),
              "qwen3", Q4_K, q4_k_m_types(NUM_LAYERS, is_tied=True)),
    # q/k/v biases, sliced per part
    "qwen2": (Qwen2Config(**{**TINY, **K_QUANT_SIZES}, tie_word_embeddings=False), "qwen2",
              Q4_K, q4_k_m_types(NUM_LAYERS, is_tied=False)),
    # Q4_0 q/k with a Q8_0 v (one plane and two), Q4_0 gate with a Q8_0 up, in every layer
    "llama-q8": (LlamaConfig(**TINY), "llama", Q4_0,
                 {f"blk.{i}.{p}.weight": Q8_0 for i in range(NUM_LAYERS)
                  for p in ("attn_v", "ffn_up")}),
}  # fmt: skip
QKV, GATE_UP = "model.layers.{}.self_attn.qkv_proj", "model.layers.{}.mlp.gate_up_proj"
MIXED = {"llama": [QKV.format(1)], "qwen3": [QKV.format(1)], "qwen2": [QKV.format(1)],
         "llama-q8": [f.format(i) for i in range(NUM_LAYERS) for f in (QKV, GATE_UP)]}  # fmt: skip
LAST_PART = {"qkv_proj": "attn_v", "gate_up_proj": "ffn_up"}  # the GGUF name of its last part
NEAR_TIE = 0.5  # logits span about +-7; the Q4_K layers' bfloat16 scales move them by 0.4


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """name -> its FILES entry written as a GGUF (norm weights 1: logits of a few units)."""
    files = {}

    def get(name: str):
        if name not in files:
            config, arch, qtype, types = FILES[name]
            tmp_path = tmp_path_factory.mktemp(name)
            hf = _k_quant_model(tmp_path, config)
            files[name] = write_gguf(hf, tmp_path / f"{name}.gguf", arch, qtype, types=types)
        return files[name]

    return get


def _load(path, quantization: str) -> nn.Module:
    return load_gguf_model(str(path), torch.bfloat16, CPU, quantization)[0]


def _mixed_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if isinstance(m, MixedLinear)}


def _gemm_weights(layer: MixedLinear) -> tuple[Tensor, Tensor | None]:
    """The bfloat16 weights `layer`'s larger steps multiply by (its parts' GEMMs times the
    identity, without their biases: one weight per output), and its float biases."""
    eye = torch.eye(layer.in_features, dtype=torch.bfloat16)
    rows, biases = [], []
    for part in layer.parts:
        unbiased = copy.copy(part)
        unbiased.bias = None
        rows.append(layer._gemm(eye, unbiased).t())
        biases.append(part.bias)
    return torch.cat(rows), None if biases[0] is None else torch.cat(biases)


def _assert_steps_match_the_gemm_weights(layer: MixedLinear, seed: int) -> None:
    """1, 3 and 8 rows against the exact products of `_gemm_weights`. The GEMV multiplies
    by each weight as float32 (4-bit parts: (q - 8) s + z with s, z in bfloat16; Q6_K:
    d sc q), not that weight rounded to bfloat16 (at most 2^-9 of it), and rounds its output
    to bfloat16: per output, |gemv - exact| <= 2^-9 sum |x w| + 2^-9 |exact| to first
    order; asserted with twice that. Rows are computed on their own. More rows run the
    GEMMs: a Q6_K part's, up to Q6K_SCALED_MAX_ROWS rows, on the exact weights too (that
    bound); beyond, and a 4-bit part's, on those very bfloat16 weights: float sums in
    another order, then one rounding."""
    g = torch.Generator().manual_seed(seed)
    weight, bias = _gemm_weights(layer)
    w = weight.double()
    differ = False
    with torch.inference_mode():
        for num_rows in [*range(1, GEMV_MAX_ROWS + 1), GEMV_MAX_ROWS + 1, 21, 25, 40]:
            x = torch.randn(num_rows, layer.in_features, generator=g).to(torch.bfloat16)
            got = layer(x).double()
            exact = x.double() @ w.t() + (0 if bias is None else bias.double())
            scale = 2**-8 if num_rows <= Q6K_SCALED_MAX_ROWS else 2**-16
            bound = (x.double().abs() @ w.abs().t()) * scale + exact.abs() * 2**-8 + 1e-6
            assert got.shape == exact.shape and ((got - exact).abs() <= bound).all()
            if num_rows <= GEMV_MAX_ROWS:
                assert torch.equal(layer(x[:1]).double(), got[:1])
                differ |= bool((got != exact.to(torch.bfloat16).double()).any())
        assert differ  # the GEMV ran on the exact weights


@pytest.mark.parametrize("name", list(FILES))
def test_mixed_fused_layers_run_their_parts_on_the_gemv(name, gguf_file) -> None:
    """Under auto (and gguf) the fused layers whose parts mix types become MixedLinear, its
    steps within bfloat16 rounding of the weights its GEMM multiplies by, in the dense
    fused layer's row order (q/k reordered for Qwen, biases per part); under none and
    gguf-w4a8 they stay nn.Linear. The GEMM's Q6_K rows are the loader's; the 4-bit and
    Q8_0 ones are made of their scales and zeros rounded to bfloat16 (each weight off by
    2^-9 of 8 |scale| + |zero|, and its own rounding), near the loader's."""
    path = gguf_file(name)
    auto = _load(path, "auto")
    expected = set(MIXED[name])
    assert set(_mixed_layers(auto)) == expected
    assert set(_mixed_layers(_load(path, "gguf"))) == expected
    dense = _load(path, "none")
    for seed, (module, layer) in enumerate(_mixed_layers(auto).items()):
        assert layer.max_gemv_rows == GEMV_MAX_ROWS
        assert len(layer.parts) == 2  # q and k (one layout) in one GEMV call
        _assert_steps_match_the_gemm_weights(layer, seed)
        weight, bias = _gemm_weights(layer)
        loaded = dense.get_submodule(module)
        assert type(loaded) is nn.Linear
        first, last = slice(-layer.parts[-1].num_out), slice(-layer.parts[-1].num_out, None)
        last_name = f"blk.{module.split('.')[2]}.{LAST_PART[module.rpartition('.')[2]]}.weight"
        last_is_q6 = FILES[name][3].get(last_name) == Q6_K
        assert torch.equal(weight[last], loaded.weight[last]) == last_is_q6
        assert not torch.equal(weight[first], loaded.weight[first])
        gap = (weight.float() - loaded.weight.float()).abs().max()
        assert gap <= 2**-6 * loaded.weight.float().abs().max()  # measured: up to 2^-7.4
        if name == "qwen2":
            assert torch.equal(bias, loaded.bias.float())
    others = ["none"] + (["gguf-w4a8"] if w4a8_kernel() is not None else [])
    for other in others:
        model = dense if other == "none" else _load(path, other)
        assert not _mixed_layers(model)
        assert all(type(model.get_submodule(m)) is nn.Linear for m in expected)


def _agreeing_steps(tokens: list[int], expected: list[int], logits: Tensor) -> int:
    """How many steps pick the expected tokens; where they part, the expected model's top
    two logits nearly tie."""
    step = next((i for i, (a, b) in enumerate(zip(tokens, expected)) if a != b), len(tokens))
    if step < len(tokens):
        gap = logits[step, expected[step]] - logits[step, tokens[step]]
        assert float(gap) < NEAR_TIE, f"parted at step {step} (gap {float(gap):.3f})"
    return step


def _mixed_kept_dense(model: nn.Module) -> nn.Module:
    """`model` with each MixedLinear replaced by a dense layer of the same weights
    (`_gemm_weights`), as it was before MixedLinear existed."""
    for name, module in _mixed_layers(model).items():
        weight, bias = _gemm_weights(module)
        dense = nn.Linear(module.in_features, module.out_features, bias=bias is not None,
                          dtype=torch.bfloat16).requires_grad_(False)  # fmt: skip
        dense.weight.copy_(weight)
        if bias is not None:
            dense.bias.copy_(bias)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, dense)
    return model


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_greedy_tokens_under_auto_are_those_of_the_dequantized_file(name, gguf_file) -> None:
    """24 decode steps under auto pick the dequantized model's tokens (or part from them at
    a near-tie); against auto with the mixed layers dense, the parts' GEMV moves the logits
    by bfloat16 roundings only: the same tokens."""
    load = functools.partial(_load, gguf_file(name))
    expected, reference = greedy_logits(load("none"), PROMPT, 24)
    auto = load("auto")
    assert _mixed_layers(auto)
    tokens, logits = greedy_logits(auto, PROMPT, 24)
    same = _agreeing_steps(tokens, expected, reference)
    assert same >= 12 and len(set(expected)) > 8  # not one token over and over
    assert (logits[: same + 1] - reference[: same + 1]).abs().max() < 0.1 * reference.abs().max()
    dense_tokens, dense_logits = greedy_logits(_mixed_kept_dense(load("auto")), PROMPT, 24)
    assert dense_tokens == tokens
    assert (logits - dense_logits).abs().max() <= 2**-6 * dense_logits.abs().max()


@pytest.mark.parametrize("name", ["llama", "qwen2", "llama-q8"])
def test_flat_decode_runs_the_mixed_layers_as_the_modules_do(name, gguf_file) -> None:
    """As the loader leaves a model on the CPU (dense layers packed for oneDNN, the flat
    loop on): the flat loop calls the MixedLinear, and its logits and cache are the
    modules' bit for bit."""
    model = _load(gguf_file(name), "auto")
    pack_linears(model)
    assert "on" in model.use_flat_decode()
    layers, flat = model.model.layers[1], model.model.flat_decode.layers[1]
    assert isinstance(layers.self_attn.qkv_proj, MixedLinear)
    assert flat.qkv.__self__ is layers.self_attn.qkv_proj
    assert flat.gate_up.__self__ is layers.mlp.gate_up_proj
    flat_logits, module_logits, flat_cache, module_cache = _decode_both_ways(model)
    assert torch.equal(flat_logits, module_logits) and torch.equal(flat_cache, module_cache)


def test_engine_serves_a_q4_k_m_file_with_mixed_layers(gguf_file, monkeypatch) -> None:
    """The engine (auto: bfloat16, the flat loop; prefill chunks of up to 16 tokens on the
    parts' GEMM, decode batches on their GEMV) on prompts of mixed lengths: each request's
    tokens are those of the dequantized file alone, up to a near-tie."""
    path = gguf_file("qwen3")
    word_tokenizer = AutoTokenizer.from_pretrained(path.parent / "hf")  # the GGUF holds none
    outputs, checkpoint = engine_greedy(path, word_tokenizer, monkeypatch, MIXED_PROMPTS)
    assert checkpoint.num_quantized_linears == 4 * NUM_LAYERS + 1
    dense = _load(path, "none")
    for prompt, tokens in zip(MIXED_PROMPTS, outputs):
        expected, logits = greedy_logits(dense, prompt, 12)
        assert _agreeing_steps(tokens, expected, logits) >= 6
