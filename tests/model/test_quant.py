"""GGUF Q4_0, Q4_1, Q8_0 and Q4_K kept quantized (int4 kernel), and Q6_K (the few-row GEMV),
against the same file dequantized, and GGUF round trips of Llama and Qwen3 against
transformers."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import gemv_kernel
from superinfer.model.cpu_q4 import Q6K_SCALED_MAX_ROWS, q4_kernel
from superinfer.model.cpu_w4a8 import w4a8_kernel
from superinfer.model.gguf_embedding import GGUFEmbedding
from superinfer.model.loader import load_gguf_model
from superinfer.model.quant import (
    AMX_GEMV_MAX_ROWS,
    LM_HEAD_GEMV_MAX_ROWS,
    LM_HEAD_MAX_INT4_ROWS,
    Int4Linear,
    Q6KEmbedding,
    Q6KLinear,
    Q8Embedding,
    int4_kernel_available,
    int4_planes,
    q6_k_parts,
)
from superinfer.model.quant_parts import MixedLinear
from tests.model.gguf_tiny import (
    q4_k_m_types,
    q6_k_quants,
    quantize_q4_k,
    quantize_q6_k,
    recorded_dequantizations,
    tiny_gemma2_gguf_config,
    tiny_gemma3_gguf_config,
    tiny_qwen2_moe_gguf_config,
    tiny_qwen3_moe_gguf_config,
    write_gguf,
)
from tests.model.paged import PagedRun, greedy_logits
from tests.model.tiny import PROMPT, TINY, save_tiny, tiny_configs

CPU = torch.device("cpu")
Q6_K = GGMLQuantizationType.Q6_K
QTYPES = [GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0]
needs_kernel = pytest.mark.skipif(not int4_kernel_available(), reason="no int4 CPU kernel")
needs_gemv = pytest.mark.skipif(not int4_kernel_available() or gemv_kernel() is None,
                                reason="no int4 CPU kernel or no AVX-512 BF16 GEMV")  # fmt: skip
# hidden and intermediate sizes that divide into K-quants' super-blocks of 256
K_QUANT_SIZES = {"hidden_size": 256, "intermediate_size": 512}


@pytest.fixture(scope="module")
def hf_models(tmp_path_factory) -> dict:
    configs = {**tiny_configs(), "llama": LlamaConfig(**TINY),  # plain RoPE in a GGUF
               "gemma2": tiny_gemma2_gguf_config(), "gemma3": tiny_gemma3_gguf_config(),
               "qwen3moe": tiny_qwen3_moe_gguf_config(),
               "qwen2moe": tiny_qwen2_moe_gguf_config()}  # fmt: skip
    out = {}
    for name in {n for n, _ in GGUF_ARCHS}:
        directory = save_tiny(tmp_path_factory.mktemp(name), configs[name], seed=5)
        out[name] = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    return out


@needs_kernel
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_int4_planes_reproduce_the_dequantized_blocks(qtype, tmp_path) -> None:
    torch.manual_seed(0)
    weight = torch.randn(96, 64) * 0.2
    from gguf import GGUFWriter
    from gguf.quants import quantize

    writer = GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    writer.add_tensor("w", quantize(weight.numpy(), qtype), raw_dtype=qtype)
    writer.write_header_to_file(), writer.write_kv_data_to_file()
    writer.write_tensors_to_file(), writer.close()
    (tensor,) = GGUFReader(str(tmp_path / "w.gguf")).tensors
    exact = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type)).reshape(96, 64)
    nibbles, scales, zeros = int4_planes(tensor)
    planes = nibbles.shape[1] // 64
    rebuilt = ((nibbles.float() - 8) * scales.repeat_interleave(32, 1)
               + zeros.repeat_interleave(32, 1)).view(96, planes, 64).sum(1)  # fmt: skip
    torch.testing.assert_close(rebuilt, exact, rtol=0, atol=1e-6)  # float32 rounding only
    x = torch.randn(5, 64)
    got = Int4Linear(nibbles, scales, zeros, 64)(x)
    expected = F.linear(x, exact)
    assert (got - expected).abs().max() < 2e-2 * expected.abs().max()  # bfloat16 compute


# (tiny model, llama.cpp's architecture): Mixtral is llama.cpp's llama with experts
GGUF_ARCHS = [("llama", "llama"), ("llama-bias", "llama"), ("qwen3", "qwen3"),
              ("gemma2", "gemma2"), ("gemma3", "gemma3"), ("phi3", "phi3"),
              ("phi3-longrope", "phi3"), ("qwen3moe", "qwen3moe"), ("mixtral", "llama"),
              ("qwen2moe", "qwen2moe")]  # fmt: skip
# MoE: own tests
DENSE_GGUF_ARCHS = [a for a in GGUF_ARCHS if a[0] not in ("qwen3moe", "mixtral", "qwen2moe")]


@pytest.mark.parametrize(("name", "arch"), GGUF_ARCHS)
def test_gguf_round_trip_matches_transformers(name, arch, hf_models, tmp_path) -> None:
    hf = hf_models[name]
    path = write_gguf(hf, tmp_path / f"{name}.gguf", arch, GGMLQuantizationType.F32)
    model, info = load_gguf_model(str(path), torch.float32, CPU, "none")
    assert info.architecture == arch and info.num_quantized_linears == 0
    assert model.config.architecture == hf.config.architectures[0]
    with torch.inference_mode():
        expected = hf(torch.tensor([PROMPT])).logits[0]
        ids = list(PROMPT)  # plain argmax, as PagedRun.greedy (no end-of-sequence rule)
        for _ in range(16):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
        tokens = ids[len(PROMPT) :]
    run = PagedRun(model, 16, 4)
    logits = run.step([(run.add(PROMPT), len(PROMPT))], all_logits=True)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    assert PagedRun(model, 16, 4).greedy(PROMPT, 16)[:8] == tokens[:8]


@needs_kernel
@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize(("name", "arch"), DENSE_GGUF_ARCHS)
def test_quantized_execution_agrees_with_the_dequantized_file(
    name, arch, qtype, hf_models, tmp_path
) -> None:
    path = write_gguf(hf_models[name], tmp_path / "q.gguf", arch, qtype)
    dense, _ = load_gguf_model(str(path), torch.bfloat16, CPU, "none")
    quantized, info = load_gguf_model(str(path), torch.bfloat16, CPU, "gguf")
    num_linears = 4 * hf_models[name].config.num_hidden_layers + 1  # + lm_head
    assert info.num_quantized_linears == num_linears
    assert sum(isinstance(m, Int4Linear) for m in quantized.modules()) == num_linears
    runs = [PagedRun(m, 16, 4) for m in (dense, quantized)]
    logits = [r.step([(r.add(PROMPT), len(PROMPT))], all_logits=True) for r in runs]
    assert torch.cosine_similarity(logits[0], logits[1], dim=-1).min() > 0.999
    agree = (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean()
    assert agree >= 0.9  # bfloat16 roundings differ: a near-tie may flip


def test_quantization_flag_values(tmp_path, hf_models) -> None:
    path = write_gguf(hf_models["llama"], tmp_path / "f.gguf", "llama",
                      GGMLQuantizationType.F32)  # fmt: skip
    with pytest.raises(ValueError, match="no Q4_0, Q4_1, Q8_0 or Q4_K"):
        load_gguf_model(str(path), torch.bfloat16, CPU, "gguf")
    from superinfer.model.loader import load_model

    with pytest.raises(ValueError, match="quantization must be one of"):
        load_model(str(path), torch.float32, CPU, quantization="bitsandbytes")
    with pytest.raises(ValueError, match="awq is for awq checkpoints; .* is a GGUF file"):
        load_model(str(path), torch.float32, CPU, quantization="awq")


@needs_kernel
@pytest.mark.parametrize("qtype", QTYPES[1:], ids=lambda q: q.name)
def test_auto_runs_small_steps_on_int4_and_large_ones_on_the_same_weights(
    qtype, hf_models, tmp_path
) -> None:
    """4-bit layers run larger steps on the 4-bit GEMM (no dense copy), Q8_0 ones on its
    Q8_0 form where it runs on AMX (no dense copy either) and else on a dense copy; either
    way on the weights the int4 kernel uses. Steps of up to
    max_int4_rows rows run the few-row GEMV where it runs here (else the int4 kernel): the
    int4 kernel's function of the same weights, each row on its own."""
    path = write_gguf(hf_models["llama"], tmp_path / "a.gguf", "llama", qtype)
    models = {q: load_gguf_model(str(path), torch.bfloat16, CPU, q)[0]
              for q in ("auto", "gguf", "none")}  # fmt: skip
    layers = {q: m.model.layers[0].mlp.gate_up_proj for q, m in models.items()}
    auto = layers["auto"]
    is_q4 = qtype == GGMLQuantizationType.Q4_1 and q4_kernel() is not None
    is_q8_gemm = (qtype == GGMLQuantizationType.Q8_0 and q4_kernel() is not None
                  and q4_kernel().use_amx() and gemv_kernel() is not None)  # fmt: skip
    is_gemm = is_q4 or is_q8_gemm
    assert isinstance(auto, Int4Linear) and (auto.q4 is not None) == is_gemm
    assert (auto.dense is None) == is_gemm
    num_rows = auto.max_int4_rows + 13
    x = torch.randn(num_rows, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    has_gemv = gemv_kernel() is not None
    assert (auto.gemv is not None) == has_gemv and (auto.packed is None) == has_gemv
    with torch.inference_mode():
        small, int4 = auto(x[: auto.max_int4_rows]), layers["gguf"](x[: auto.max_int4_rows])
        assert torch.equal(auto(x[:1]), small[:1])  # a row's result is its own
        if has_gemv:  # rounded from sums in another order: at most one bfloat16 step apart
            torch.testing.assert_close(small.float(), int4.float(), rtol=2**-7, atol=1e-5)
            assert (small == int4).float().mean() > 0.95
        else:
            assert torch.equal(small, int4)
        large = auto(x)
        if is_gemm:  # the dense copy's weights, summed in another order
            eye = torch.eye(64, dtype=torch.bfloat16)
            weight = auto.q4(eye).t().float()  # each output is one weight, exactly
            if is_q8_gemm:  # those the GEMV's 8-bit values give, d q rounded once
                assert torch.equal(weight, gemv_kernel().unpack(auto.gemv_weights).float())
            reference = x.float() @ weight.t()
            torch.testing.assert_close(large.float(), reference, rtol=2**-7, atol=1e-5)
        else:
            assert torch.equal(large, auto.dense(x))
        kernel, exact = layers["gguf"](x).float(), layers["none"](x).float()
        # the kernel rounds the GGUF scales to bfloat16; the large-step path does the same
        gap, exact_gap = (large.float() - kernel).abs().mean(), (exact - kernel).abs().mean()
        assert gap < exact_gap
    # the 4-bit GEMM on AMX takes steps from fewer rows
    is_amx = is_q4 and q4_kernel().use_amx()
    assert auto.max_int4_rows == (AMX_GEMV_MAX_ROWS if is_amx else GEMV_MAX_ROWS)
    head = models["auto"].lm_head  # on the int4 kernel, leaves it sooner than the others
    head_rows = LM_HEAD_GEMV_MAX_ROWS if has_gemv else LM_HEAD_MAX_INT4_ROWS
    head_rows = min(head_rows, AMX_GEMV_MAX_ROWS) if is_amx else head_rows
    assert head.max_int4_rows == head_rows and (is_amx or head_rows < auto.max_int4_rows)
    assert (head.q4 is not None) == is_gemm and (head.gemv is not None) == has_gemv
    hidden = torch.randn(head_rows + 1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        larger = head.q4 if is_gemm else head.dense
        assert torch.equal(head(hidden), larger(hidden))
        small, int4 = head(hidden[:1]), models["gguf"].lm_head(hidden[:1])
        torch.testing.assert_close(small.float(), int4.float(), rtol=2**-7, atol=1e-5)
        assert has_gemv or torch.equal(small, int4)
    runs = {q: PagedRun(m, 16, 4) for q, m in models.items()}
    prefill = {q: r.step([(r.add(PROMPT + [5]), len(PROMPT))], all_logits=True)
               for q, r in runs.items()}  # fmt: skip
    assert torch.cosine_similarity(prefill["auto"], prefill["none"], dim=-1).min() > 0.999


@needs_kernel
def test_q8_embedding_reads_the_rows_the_dense_table_holds(hf_models, tmp_path) -> None:
    path = write_gguf(hf_models["qwen3"], tmp_path / "e.gguf", "qwen3", GGMLQuantizationType.Q8_0)
    dense, dense_info = load_gguf_model(str(path), torch.bfloat16, CPU, "none")
    quantized, info = load_gguf_model(str(path), torch.bfloat16, CPU, "gguf")
    assert info.is_embedding_quantized and not dense_info.is_embedding_quantized
    table = quantized.model.embed_tokens
    assert isinstance(table, Q8Embedding) and quantized.dtype == torch.bfloat16
    assert table.values.dtype == torch.int8  # 1 byte a weight, not the dense table's 2
    ids = torch.tensor([0, 7, 7, TINY["vocab_size"] - 1, 3])
    with torch.inference_mode():
        assert torch.equal(table(ids), dense.model.embed_tokens(ids))


def test_q4_k_planes_reproduce_gguf_s_dequantization(tmp_path) -> None:
    """Q4_K blocks (written by tests' packer, read back by gguf-py's own dequantizer) become
    32-input (scale, zero) groups exactly, in float32."""
    torch.manual_seed(0)
    weight = torch.randn(96, 512) * 0.2
    from gguf import GGUFWriter

    qtype = GGMLQuantizationType.Q4_K
    writer = GGUFWriter(str(tmp_path / "w.gguf"), "llama")
    writer.add_tensor("w", quantize_q4_k(weight.numpy()), raw_dtype=qtype)
    writer.write_header_to_file(), writer.write_kv_data_to_file()
    writer.write_tensors_to_file(), writer.close()
    (tensor,) = GGUFReader(str(tmp_path / "w.gguf")).tensors
    exact = torch.from_numpy(dequantize(tensor.data, qtype)).reshape(96, 512)
    assert (exact - weight).abs().max() < 0.1  # a real quantization of the weights
    nibbles, scales, zeros = int4_planes(tensor)
    rebuilt = (nibbles.float() - 8) * scales.repeat_interleave(32, 1) + zeros.repeat_interleave(
        32, 1
    )
    torch.testing.assert_close(rebuilt, exact, rtol=0, atol=1e-6)  # float32 rounding only


@needs_kernel
def test_q4_k_runs_quantized_and_agrees_with_the_dequantized_file(tmp_path) -> None:
    """A Llama whose matrices all divide into Q4_K's super-blocks of 256."""
    config = LlamaConfig(**{**TINY, "hidden_size": 256, "intermediate_size": 512})
    directory = save_tiny(tmp_path / "hf", config, seed=5)
    hf = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    path = write_gguf(hf, tmp_path / "q4k.gguf", "llama", GGMLQuantizationType.Q4_K)
    dense, _ = load_gguf_model(str(path), torch.bfloat16, CPU, "none")
    quantized, info = load_gguf_model(str(path), torch.bfloat16, CPU, "auto")
    num_linears = 4 * TINY["num_hidden_layers"] + 1
    assert info.num_quantized_linears == num_linears
    runs = [PagedRun(m, 16, 4) for m in (dense, quantized)]
    logits = [r.step([(r.add(PROMPT), len(PROMPT))], all_logits=True) for r in runs]
    assert torch.cosine_similarity(logits[0], logits[1], dim=-1).min() > 0.999
    assert (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean() >= 0.9


def _one_tensor_file(path, blocks, qtype) -> GGUFReader:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("w", blocks, raw_dtype=qtype)
    writer.write_header_to_file(), writer.write_kv_data_to_file()
    writer.write_tensors_to_file(), writer.close()
    return GGUFReader(str(path))


def test_q6_k_packer_round_trips_through_gguf_s_dequantizer(tmp_path) -> None:
    """Tests' Q6_K writer, read back by gguf-py: its own numbers exactly, the weights within
    half a step of their block of 16."""
    weight = np.random.default_rng(0).standard_normal((96, 512)).astype(np.float32) * 0.2
    weight[3, :16] = 0  # a block of zeros (scale 0), and a whole super-block of them
    weight[4, :256] = 0
    (tensor,) = _one_tensor_file(tmp_path / "w.gguf", quantize_q6_k(weight), Q6_K).tensors
    read = dequantize(tensor.data, Q6_K).reshape(96, 512)
    d, sc, q = q6_k_quants(weight)
    step = (d.astype(np.float32) * sc.astype(np.float32))[..., None]  # (n, 16, 1)
    own = (step * (q.reshape(-1, 16, 16).astype(np.float32) - 32)).reshape(96, 512)
    assert np.array_equal(read, own)
    half_step = np.broadcast_to(step / 2, (step.shape[0], 16, 16)).reshape(96, 512)
    assert (np.abs(read - weight) <= half_step * (1 + 2**-20)).all()
    assert (read[3, :16] == 0).all() and (read[4, :256] == 0).all()


def test_q6_k_parts_reproduce_gguf_s_dequantization(tmp_path) -> None:
    """(d sc) value in float32 is gguf-py's own dequantization, bit for bit."""
    weight = np.random.default_rng(1).standard_normal((40, 768)).astype(np.float32)
    (tensor,) = _one_tensor_file(tmp_path / "w.gguf", quantize_q6_k(weight), Q6_K).tensors
    values, sc, d = q6_k_parts(tensor)
    assert values.dtype == sc.dtype == torch.int8 and values.shape == (40, 768)
    assert sc.shape == (40, 48) and d.shape == (40, 3)
    assert values.min() >= -32 and values.max() <= 31
    scales = d.repeat_interleave(16, 1) * sc.float()  # exact: an fp16 d times an int8
    rebuilt = scales.repeat_interleave(16, 1) * values.float()
    assert torch.equal(rebuilt, torch.from_numpy(dequantize(tensor.data, Q6_K)).view(40, 768))


def _k_quant_model(tmp_path, config):
    """save_tiny's model, but its norms' weights 1 (not 0.15 at random): logits of a few
    units, whose top two rarely tie (with hidden size 256, they were within 0.3)."""
    directory = save_tiny(tmp_path / "hf", config, seed=5)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
    return model


@pytest.fixture(scope="module")
def q4_k_m_file(tmp_path_factory):
    """A Llama as llama.cpp's Q4_K_M writes it: Q4_K, but Q6_K for output.weight and, in
    layer 1, for attn_v (its fused q/k/v then mixes types) and ffn_down."""
    tmp_path = tmp_path_factory.mktemp("q4_k_m")
    hf = _k_quant_model(tmp_path, LlamaConfig(**{**TINY, **K_QUANT_SIZES}))
    types = q4_k_m_types(TINY["num_hidden_layers"], is_tied=False)
    assert types == {"output.weight": Q6_K, "blk.1.attn_v.weight": Q6_K,
                     "blk.1.ffn_down.weight": Q6_K}  # fmt: skip
    return write_gguf(hf, tmp_path / "q4_k_m.gguf", "llama", GGMLQuantizationType.Q4_K,
                      types=types)  # fmt: skip


def _assert_q6_k_layer_matches_the_dense_one(layer: Q6KLinear, dense: nn.Linear,
                                             seed: int) -> None:  # fmt: skip
    """`layer` against `dense`, the same layer of the dequantized file (bfloat16 weights).
    Up to max_gemv_rows rows the GEMV, and up to Q6K_SCALED_MAX_ROWS the GEMM on AVX-512, of
    the exact weights, rounded once (the dense weights are each rounded: at most 2^-9 of
    |w x| a product); more rows, or on AMX, the GEMM of those very bfloat16 weights, whose
    sums only run in another order."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(Q6K_SCALED_MAX_ROWS + 13, layer.in_features, generator=g).to(torch.bfloat16)
    with torch.inference_mode():
        for rows in (layer.max_gemv_rows, Q6K_SCALED_MAX_ROWS):
            got, expected = layer(x[:rows]).float(), dense(x[:rows]).float()
            bound = (x[:rows].float().abs() @ dense.weight.float().abs().t()) * 2**-8
            assert got.shape == expected.shape
            assert ((got - expected).abs() <= bound + expected.abs() * 2**-7 + 1e-6).all()
            if rows == layer.max_gemv_rows or not q4_kernel().use_amx():
                assert (got != expected).any()  # it ran on the exact weights
        large, large_expected = layer(x).float(), dense(x).float()
    assert layer.gemv is not None
    sums = (x.float().abs() @ dense.weight.float().abs().t()) * 2**-16
    assert ((large - large_expected).abs() <= sums + large_expected.abs() * 2**-7 + 1e-6).all()


@needs_gemv
def test_q4_k_m_file_runs_its_q6_k_layers_on_the_gemv(q4_k_m_file) -> None:
    """lm_head and layer 1's ffn_down (all Q6_K) run the GEMV; layer 1's q/k/v (Q4_K and
    Q6_K) runs each part on its own (`quant_parts`, tests/model/test_quant_parts.py); the
    other layers are Q4_K; under `none` nothing is swapped, and under gguf-w4a8 the Q6_K
    layers stay dense."""
    auto, info = load_gguf_model(str(q4_k_m_file), torch.bfloat16, CPU, "auto")
    assert info.num_quantized_linears == 4 * TINY["num_hidden_layers"] + 1
    # a Q6_K head's GEMV beats the Q6_K GEMM up to 8 rows (a Q8_0 head's, the dense one: 4)
    assert isinstance(auto.lm_head, Q6KLinear) and auto.lm_head.max_gemv_rows == GEMV_MAX_ROWS
    layers = auto.model.layers
    assert isinstance(layers[1].mlp.down_proj, Q6KLinear)
    assert layers[1].mlp.down_proj.max_gemv_rows == GEMV_MAX_ROWS
    assert isinstance(layers[1].self_attn.qkv_proj, MixedLinear)
    assert isinstance(layers[0].mlp.down_proj, Int4Linear)
    assert isinstance(layers[1].mlp.gate_up_proj, Int4Linear)
    dense, info = load_gguf_model(str(q4_k_m_file), torch.bfloat16, CPU, "none")
    for seed, name in enumerate(["lm_head", "model.layers.1.mlp.down_proj"]):
        _assert_q6_k_layer_matches_the_dense_one(auto.get_submodule(name),
                                                 dense.get_submodule(name), seed)  # fmt: skip
    assert info.num_quantized_linears == 0
    assert not any(isinstance(m, (Q6KLinear, Int4Linear, MixedLinear)) for m in dense.modules())
    if w4a8_kernel() is not None:
        w4a8, _ = load_gguf_model(str(q4_k_m_file), torch.bfloat16, CPU, "gguf-w4a8")
        assert type(w4a8.lm_head) is nn.Linear and isinstance(w4a8.model.layers[0].mlp.down_proj,
                                                              Int4Linear)  # fmt: skip
        assert not any(isinstance(m, Q6KLinear) for m in w4a8.modules())


def _q6_k_kept_dense(model: nn.Module, dense: nn.Module) -> nn.Module:
    """`model` with each Q6KLinear replaced by `dense`'s layer of that name (the file
    dequantized): Q6_K dense, as before."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Q6KLinear):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, dense.get_submodule(name))
    return model


@needs_gemv
def test_q4_k_m_greedy_tokens_under_auto_are_those_of_the_dequantized_file(q4_k_m_file) -> None:
    """24 decode steps (lm_head, the Q6_K ffn_down and the mixed q/k/v on the GEMV) pick
    the tokens of the bfloat16 dequantized model, but where its top two logits nearly tie. The
    logits span about +-7: the Q4_K layers (their scales and zeros rounded to bfloat16)
    move them by up to 0.42, the Q6_K layers on the GEMV by a bfloat16 step of them."""
    load = functools.partial(load_gguf_model, str(q4_k_m_file), torch.bfloat16, CPU)
    none = load("none")[0]
    models = {"none": none, "auto": load("auto")[0],
              "auto, Q6_K dense": _q6_k_kept_dense(load("auto")[0], none)}  # fmt: skip
    runs = {name: greedy_logits(model, PROMPT, 24) for name, model in models.items()}
    (expected, reference), (tokens, logits) = runs["none"], runs["auto"]
    step = next((i for i, (a, b) in enumerate(zip(expected, tokens)) if a != b), len(tokens))
    for ref, got in zip(reference[: step + 1], logits):  # the same tokens so far
        assert (got - ref).abs().max() < 0.1 * ref.abs().max()
    if step < len(tokens):
        top2 = reference[step].topk(2).values
        assert float(top2[0] - top2[1]) < 0.5, f"parted at step {step}"
    assert len(set(expected)) > 8  # not one token over and over
    dense_tokens, dense_logits = runs["auto, Q6_K dense"]
    assert dense_tokens == tokens
    for dense, got in zip(dense_logits, logits):
        assert (got - dense).abs().max() <= 2**-7 * dense.abs().max()


@needs_gemv
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_q6_k_layers_and_tied_head_run_quantized(arch, tmp_path) -> None:
    """A file of Q6_K matrices only: every linear layer runs the GEMV and the GEMM, q/k rows
    in the model's order (Llama's are permuted in the file); the token embedding looks its
    rows up in the Q6_K bits, and Qwen3's (tied: no output.weight) shares lm_head's."""
    sizes = {**TINY, **K_QUANT_SIZES}
    config = (LlamaConfig(**sizes) if arch == "llama"
              else Qwen3Config(**sizes, head_dim=64, tie_word_embeddings=True))  # fmt: skip
    path = write_gguf(_k_quant_model(tmp_path, config), tmp_path / "q6k.gguf", arch, Q6_K)
    dense, _ = load_gguf_model(str(path), torch.bfloat16, CPU, "none")
    for quantization in ("auto", "gguf"):
        model, info = load_gguf_model(str(path), torch.bfloat16, CPU, quantization)
        swapped = {n: m for n, m in model.named_modules() if isinstance(m, Q6KLinear)}
        assert info.num_quantized_linears == len(swapped) == 4 * TINY["num_hidden_layers"] + 1
        for seed, (name, layer) in enumerate(swapped.items()):
            _assert_q6_k_layer_matches_the_dense_one(layer, dense.get_submodule(name), seed)
        assert not any(isinstance(m, nn.Linear) for m in model.modules())  # no dense copy
        table = model.model.embed_tokens
        assert info.is_embedding_quantized and isinstance(table, Q6KEmbedding)
        assert (table.weights is model.lm_head.weights) == (arch == "qwen3")
        ids = torch.tensor([[0, 7, 7], [TINY["vocab_size"] - 1, 3, 100]])
        with torch.inference_mode():
            assert torch.equal(table(ids), dense.model.embed_tokens(ids))


# (config, type of the matrices, the others' types): every matrix is kept quantized under auto
NEVER_DEQUANTIZED = {
    # Q4_K_M: a tied Q6_K embedding shared by lm_head, mixed and Q4_K q/k/v with biases
    "qwen2-q4_k_m": (Qwen2Config(**{**TINY, **K_QUANT_SIZES}, tie_word_embeddings=True),
                     GGMLQuantizationType.Q4_K, q4_k_m_types(TINY["num_hidden_layers"], True)),
    # as the default model: a tied Q8_0 embedding, whose lm_head keeps a dense copy
    "llama-q4_0": (LlamaConfig(**TINY, tie_word_embeddings=True), GGMLQuantizationType.Q4_0,
                   {"token_embd.weight": GGMLQuantizationType.Q8_0}),
    # Q4_K_M of an untied model (Llama 3.1 8B's layout): a Q4_K embedding, a Q6_K head
    "llama-q4_k_m": (LlamaConfig(**{**TINY, **K_QUANT_SIZES}, tie_word_embeddings=False),
                     GGMLQuantizationType.Q4_K, q4_k_m_types(TINY["num_hidden_layers"], False)),
}  # fmt: skip
EMBEDDINGS = {"qwen2-q4_k_m": Q6KEmbedding, "llama-q4_0": Q8Embedding,
              "llama-q4_k_m": GGUFEmbedding}  # fmt: skip


@needs_gemv
@pytest.mark.parametrize("name", NEVER_DEQUANTIZED)
def test_quantized_layers_are_never_dequantized(name, tmp_path, monkeypatch) -> None:
    """Under auto, the layers kept quantized (and the embedding) are swapped in before the
    parameters are allocated: their GGUF matrices are never dequantized, no dense weight is
    held but the Q8_0 head's copy for larger steps (none where the GEMM runs on AMX), and
    the biases are the dense model's."""
    config, qtype, types = NEVER_DEQUANTIZED[name]
    arch = "qwen2" if name.startswith("qwen2") else "llama"
    path = write_gguf(_k_quant_model(tmp_path, config), tmp_path / "m.gguf", arch, qtype,
                      types=types)  # fmt: skip
    dequantized = recorded_dequantizations(monkeypatch)
    dense, _ = load_gguf_model(str(path), torch.bfloat16, CPU, "none")
    matrices = {t.name for t in GGUFReader(str(path)).tensors if len(t.shape) == 2}
    assert matrices <= set(dequantized)
    dequantized.clear()
    model, info = load_gguf_model(str(path), torch.bfloat16, CPU, "auto")
    assert dequantized and not matrices & set(dequantized)
    assert info.num_quantized_linears == 4 * TINY["num_hidden_layers"] + 1
    assert info.is_embedding_quantized
    assert type(model.model.embed_tokens) is EMBEDDINGS[name]
    ids = torch.tensor([0, 5, TINY["vocab_size"] - 1])
    with torch.inference_mode():
        assert torch.equal(model.model.embed_tokens(ids), dense.model.embed_tokens(ids))
    held = [n for n, p in model.named_parameters() if p.dim() == 2]
    is_q8_gemm = q4_kernel() is not None and q4_kernel().use_amx() and gemv_kernel() is not None
    is_head_dense = name == "llama-q4_0" and not is_q8_gemm  # a Q8_0 head (tied embedding)
    assert held == (["lm_head.dense.weight"] if is_head_dense else [])
    biases = {n: p for n, p in model.named_parameters() if n.endswith(".bias")}
    assert len(biases) == (1 if name.startswith("qwen2") else 0)  # layer 0's Q4_K q/k/v
    for n, bias in biases.items():
        assert torch.equal(bias, dense.get_parameter(n))
    runs = [PagedRun(m, 16, 4) for m in (dense, model)]
    logits = [r.step([(r.add(PROMPT), len(PROMPT))], all_logits=True) for r in runs]
    assert torch.cosine_similarity(logits[0], logits[1], dim=-1).min() > 0.999
