"""GGUF experts kept quantized (`quant_moe`) against the same file's experts dequantized:
the layer's function, greedy tokens, the bytes held, and the engine serving the file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, AutoTokenizer

from superinfer.model.cpu_w4a8 import w4a8_kernel
from superinfer.model.gemv_linear import GemvLinear
from superinfer.model.loader import load_gguf_model
from superinfer.model.moe import Experts
from superinfer.model.quant import Int4Linear, Q6KLinear, int4_kernel_available
from superinfer.model.quant_moe import QuantExperts
from tests.model.gguf_tiny import (
    MIXED_PROMPTS,
    engine_greedy,
    recorded_dequantizations,
    tiny_qwen2_moe_gguf_config,
    tiny_qwen3_moe_gguf_config,
    write_gguf,
)
from tests.model.paged import greedy_logits
from tests.model.tiny import PROMPT, save_tiny, tiny_configs

pytestmark = pytest.mark.skipif(not int4_kernel_available(), reason="no int4 CPU kernel")

CPU = torch.device("cpu")
Q4_0, Q4_1, Q8_0 = GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0
Q4_K, Q6_K = GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K
# llama.cpp's Q4_K_M of the experts: gate and up Q4_K, down Q6_K in every other layer
Q4_K_M = "Q4_K_M"
# tiny model -> (config, llama.cpp's architecture); Mixtral is llama.cpp's llama with experts
MODELS = {
    "qwen3moe": (lambda: tiny_qwen3_moe_gguf_config(moe_intermediate_size=64), "qwen3moe"),
    "mixtral": (lambda: tiny_configs()["mixtral"], "llama"),
    "qwen2moe": (tiny_qwen2_moe_gguf_config, "qwen2moe"),  # and a gated shared expert
    # down_exps' rows (48) do not divide into blocks: written F32, kept dense
    "qwen3moe-48": (tiny_qwen3_moe_gguf_config, "qwen3moe"),
    # every matrix divides into Q4_K's super-blocks of 256
    "qwen3moe-256": (lambda: tiny_qwen3_moe_gguf_config(hidden_size=256, head_dim=64,
                                                        moe_intermediate_size=256), "qwen3moe"),
}  # fmt: skip
NEAR_TIE = 0.02  # logits of the tiny models span about +-0.7; bfloat16 steps there are 2**-9


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """(model, qtype) -> a GGUF file with every matrix, the experts too, in qtype (Q4_K_M:
    Q4_K, but the experts' down projections of every other layer in Q6_K)."""
    files: dict[tuple[str, str], Path] = {}

    def get(name: str, qtype: GGMLQuantizationType | str) -> Path:
        key = (name, _id(qtype))
        if key not in files:
            config, arch = MODELS[name]
            directory = save_tiny(tmp_path_factory.mktemp(name), config(), seed=5)
            hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
            kind = Q4_K if qtype == Q4_K_M else qtype
            types = {}
            if qtype == Q4_K_M:
                for layer in range(0, hf.config.num_hidden_layers, 2):
                    types[f"blk.{layer}.ffn_down_exps.weight"] = Q6_K
            path = directory / f"{_id(qtype)}.gguf"
            files[key] = write_gguf(hf, path, arch, kind, expert_qtype=kind, types=types)
        return files[key]

    return get


def _load(path: Path, quantization: str) -> nn.Module:
    return load_gguf_model(str(path), torch.bfloat16, CPU, quantization)[0]


def _sorted_rows(counts: Sequence[int], size: int) -> tuple[Tensor, Tensor]:
    """Rows (N, size) bfloat16 and their experts (N,), sorted, `counts[e]` rows for e."""
    generator = torch.Generator().manual_seed(0)
    experts = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    x = torch.randn(len(experts), size, generator=generator).to(torch.bfloat16)
    return x, experts


# (model, qtype, quantization, projections kept quantized a layer, of which on the GEMV's
# layouts in both layers: the 8-bit one (Q8_0) or Q6_K's own)
LAYER_CASES = [("qwen3moe", Q4_0, "auto", 2, 0), ("qwen3moe", Q8_0, "auto", 2, 4),
               ("mixtral", Q4_1, "auto", 2, 0), ("mixtral", Q4_0, "gguf", 2, 0),
               ("mixtral", Q8_0, "gguf", 2, 4),
               ("qwen3moe-48", Q4_0, "auto", 1, 0), ("qwen3moe-256", Q4_K, "auto", 2, 0),
               ("qwen3moe-256", Q6_K, "auto", 2, 4), ("qwen3moe-256", Q6_K, "gguf-w4a8", 2, 4),
               ("qwen3moe-256", Q4_K_M, "auto", 2, 1)]  # fmt: skip


def _id(value: object) -> str:
    return value.name if isinstance(value, GGMLQuantizationType) else str(value)


@pytest.mark.parametrize(("name", "qtype", "quantization", "num_quantized", "num_gemv"),
                         LAYER_CASES, ids=_id)  # fmt: skip
def test_quantized_experts_compute_the_dequantized_experts(
    name, qtype, quantization, num_quantized, num_gemv, gguf_file
) -> None:
    """One batch of rows over every kernel path: an expert with more rows than the few-row
    GEMV takes (the 4-bit and Q6_K GEMMs under auto; Q8_0 weights unpacked to bfloat16), one
    with a few, one with none."""
    if quantization == "gguf-w4a8" and w4a8_kernel() is None:
        pytest.skip("no AVX-512 VNNI and BF16 here")
    path = gguf_file(name, qtype)
    dense, quantized = _load(path, "none"), _load(path, quantization)
    x, ids = _sorted_rows([11, 0, 3, 26], dense.config.hidden_size)
    on_gemv = num_unpacked = 0
    for layer in range(2):
        experts = [m.model.layers[layer].mlp.experts for m in (dense, quantized)]
        assert isinstance(experts[0], Experts) and isinstance(experts[1], QuantExperts)
        projections = [experts[1].gate_up_proj, experts[1].down_proj]
        assert sum(isinstance(p, nn.ModuleList) for p in projections) == num_quantized
        on_gemv += sum(isinstance(p, nn.ModuleList) and isinstance(p[0], (GemvLinear, Q6KLinear))
                       for p in projections)  # fmt: skip
        num_unpacked += sum(isinstance(p, nn.ModuleList) and type(p[0]) is GemvLinear
                            for p in projections)  # fmt: skip
        with torch.inference_mode():
            expected, got = experts[0](x, ids).float(), experts[1](x, ids).float()
        scale = expected.abs().max()
        assert scale > 1  # the experts compute something
        # bfloat16 weights (the kernels round the GGUF scales to bfloat16), bfloat16
        # products: measured at about half these bounds
        assert (got - expected).abs().max() < 2**-6 * scale
        assert (got - expected).abs().mean() < 2**-9 * scale
        if num_unpacked == 2 * (layer + 1):  # > 8 rows: `none`'s bfloat16 weights, unpacked
            for rows in (slice(0, 11), slice(14, None)):
                assert torch.equal(got[rows], expected[rows])
    assert on_gemv == num_gemv


@pytest.mark.parametrize("qtype", [Q4_0, Q8_0], ids=_id)
def test_w4a8_experts_compute_the_dequantized_experts_on_8_bit_activations(
    qtype, gguf_file
) -> None:
    """Q8_0 experts too, on `cpu_w4a8`'s GEMM (not the 8-bit GEMV layout)."""
    if w4a8_kernel() is None:
        pytest.skip("no AVX-512 VNNI and BF16 here")
    path = gguf_file("qwen3moe", qtype)
    dense, quantized = _load(path, "none"), _load(path, "gguf-w4a8")
    assert not [m for m in quantized.modules() if isinstance(m, GemvLinear)]
    experts = [m.model.layers[1].mlp.experts for m in (dense, quantized)]
    x, ids = _sorted_rows([2, 9, 0, 30], dense.config.hidden_size)
    with torch.inference_mode():
        expected, got = experts[0](x, ids).float(), experts[1](x, ids).float()
    assert torch.cosine_similarity(got, expected, dim=-1).min() > 0.999


def _assert_same_or_near_tie(got: list[int], expected: list[int], logits: Sequence[Tensor]) -> int:
    """Equal tokens, or the first that differ were near-tied in each model's logits at
    that step (the same context); returns how many steps agree."""
    same = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(expected))
    if same < len(expected):
        for step_logits in logits:
            gap = (step_logits[same, got[same]] - step_logits[same, expected[same]]).abs()
            assert gap < NEAR_TIE, f"step {same}: {got[same]} != {expected[same]}, gap {gap}"
    return same


# (model, qtype, the fewest steps that must agree before a near-tie): Q8_0 experts on the
# 8-bit GEMV (exact scales, closer to `none`'s weights than the int4 kernel's bfloat16
# ones: test_quantized_experts_compute_the_dequantized_experts) part from `none` on a
# near-tie at step 4 of the tiny Qwen3-MoE
GREEDY_CASES = [(name, qtype, 4 if (name, qtype) == ("qwen3moe", Q8_0) else 12)
                for name in ("qwen3moe", "mixtral") for qtype in (Q4_0, Q4_1, Q8_0)]  # fmt: skip
# the Q4_K_M one parts on a near-tie at step 3 since its Q6_K experts' GEMM multiplies by
# the exact weights up to 24 rows (q4_linear.c), as the GEMV does, not by bfloat16 ones
GREEDY_CASES += [("qwen3moe-256", Q6_K, 12), ("qwen3moe-256", Q4_K_M, 3)]
# the tiny Qwen2-MoE in Q4_1 parts from `none` on a near-tie at step 4 (24 steps agree in
# Q4_0 and Q8_0)
GREEDY_CASES += [("qwen2moe", Q4_0, 12), ("qwen2moe", Q4_1, 4), ("qwen2moe", Q8_0, 12)]


@pytest.mark.parametrize(("name", "qtype", "min_same"), GREEDY_CASES, ids=_id)
def test_greedy_tokens_match_the_dequantized_file(name, qtype, min_same, gguf_file) -> None:
    path = gguf_file(name, qtype)
    dense, quantized = _load(path, "none"), _load(path, "auto")
    assert sum(isinstance(m, QuantExperts) for m in quantized.modules()) == 2
    expected, expected_logits = greedy_logits(dense, PROMPT, 24)
    tokens, logits = greedy_logits(quantized, PROMPT, 24)
    same = _assert_same_or_near_tie(tokens, expected, [logits, expected_logits])
    assert same >= min_same  # at most a late divergence
    similarity = torch.cosine_similarity(logits[: same + 1], expected_logits[: same + 1], dim=-1)
    # a step may route a token to another expert on a near-tie of the router's logits (the
    # Q6_K Qwen3-MoE: 0.994 at one step of 24)
    assert similarity.min() > 0.99
    assert (similarity > 0.999).float().mean() > 0.9


def _held_bytes(module: nn.Module) -> int:
    """Bytes of the tensors `module` holds: parameters, buffers and the kernels' packed
    weights of its Int4Linear and GemvLinear layers (each storage once)."""
    storages: dict[int, int] = {}

    def add(obj: object) -> None:
        if isinstance(obj, Tensor):
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        elif obj is not None and hasattr(obj, "__dict__") and not isinstance(obj, nn.Module):
            for value in vars(obj).values():  # Q4Weights, Q8Weights, W4A8Weights
                if isinstance(value, Tensor):
                    add(value)

    for tensor in [*module.parameters(), *module.buffers()]:
        add(tensor)
    for layer in module.modules():
        if isinstance(layer, Int4Linear):
            for value in (layer.packed, layer.scales_zeros, layer.q4, layer.gemv_weights):
                add(value)
        elif isinstance(layer, (GemvLinear, Q6KLinear)):
            add(layer.weights)
    return sum(storages.values())


# (model, qtype, quantization, bounds of the bytes held over bfloat16's)
HELD_CASES = [("qwen3moe", Q4_0, "auto", 0.25, 0.34), ("qwen3moe", Q4_0, "gguf", 0.25, 0.34),
              ("qwen3moe", Q8_0, "gguf", 0.6, 0.7), ("qwen3moe", Q8_0, "auto", 0.62, 0.63),
              ("qwen3moe-256", Q6_K, "auto", 0.41, 0.42),
              # layer 0: 0.625 bytes a weight for gate/up, 0.83 for down; layer 1: 0.625
              ("qwen3moe-256", Q4_K_M, "auto", 0.3, 0.35)]  # fmt: skip


@pytest.mark.parametrize(("name", "qtype", "quantization", "min_ratio", "max_ratio"),
                         HELD_CASES, ids=_id)  # fmt: skip
def test_experts_are_kept_quantized_and_never_dequantized(
    name, qtype, quantization, min_ratio, max_ratio, gguf_file, monkeypatch
) -> None:
    """No float expert weights in the model, nor dequantized at load; 4-bit experts hold
    0.625 bytes a weight (4 bits, a bfloat16 scale and zero per 32), Q8_0 ones 1.25 (8 bits,
    a float scale per 32 inputs, and unused offsets), Q6_K ones 0.83 (6.5 bits, an int8
    scale per 16 inputs, a float d per 256)."""
    path = gguf_file(name, qtype)
    dequantized = recorded_dequantizations(monkeypatch)
    dense = _load(path, "none")
    assert sum("_exps." in name for name in dequantized) == 3 * 2
    dequantized.clear()
    quantized = _load(path, quantization)
    assert not [name for name in dequantized if "_exps." in name]
    assert not [name for name, _ in quantized.named_parameters() if ".experts." in name]
    for layer in range(2):
        float_bytes = _held_bytes(dense.model.layers[layer].mlp.experts)
        config = dense.config
        weights = config.num_experts * 3 * config.moe_intermediate_size * config.hidden_size
        assert float_bytes == 2 * weights  # bfloat16
        held = _held_bytes(quantized.model.layers[layer].mlp.experts)
        assert min_ratio * float_bytes < held < max_ratio * float_bytes


def test_engine_serves_a_gguf_moe_with_quantized_experts(gguf_file, monkeypatch) -> None:
    """The engine (auto: bfloat16, quantized experts) on requests of mixed lengths, batched
    and chunked: each request's tokens are those of the file's dequantized model alone, up
    to a near-tie."""
    path = gguf_file("qwen3moe", Q4_0)
    word_tokenizer = AutoTokenizer.from_pretrained(path.parent)  # the GGUF holds none
    outputs, checkpoint = engine_greedy(path, word_tokenizer, monkeypatch, MIXED_PROMPTS)
    assert checkpoint.num_quantized_expert_layers == 2
    dense = _load(path, "none")
    for prompt, tokens in zip(MIXED_PROMPTS, outputs):
        expected, expected_logits = greedy_logits(dense, prompt, 12)
        assert _assert_same_or_near_tie(tokens, expected, [expected_logits]) >= 6


def test_the_shared_expert_runs_quantized(gguf_file) -> None:
    """Qwen2-MoE's shared expert (llama.cpp's `ffn_*_shexp`) is two linear layers like any
    other: kept quantized, never dequantized; its gate, a vector, stays float."""
    path = gguf_file("qwen2moe", Q4_0)
    model = _load(path, "auto")
    for layer in model.model.layers:
        shared = layer.mlp.shared_expert
        assert isinstance(shared.gate_up_proj, Int4Linear)
        assert isinstance(shared.down_proj, Int4Linear)
        assert layer.mlp.shared_expert_gate.weight.shape == (1, model.config.hidden_size)
