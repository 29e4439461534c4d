"""AWQ, GPTQ and FP8 checkpoints: read exactly, run quantized, refused when unsupported.

Each tiny quantized checkpoint (tests/model/quant_tiny.py) comes with a plain checkpoint of
the weights it stands for, which transformers runs as the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from superinfer.model.cpu_gemv import gemv_kernel
from superinfer.model.fp8_linear import Fp8Linear, quantize_rows
from superinfer.model.loader import load_model
from superinfer.model.quant import Int4Linear
from superinfer.model.quant_checkpoint import (
    QuantizedTensors,
    QuantScheme,
    int4_kernel_planes,
    quant_scheme,
    quantized_kernel,
    unpack_int4,
)
from tests.model.paged import PagedRun
from tests.model.quant_tiny import (
    AWQ_ORDER,
    fp8_tensors,
    int4_tensors,
    pack_columns,
    pack_rows,
    save_quantized,
    tiny_quant_qwen2_config,
)
from tests.model.test_architectures import PROMPTS, _chunked_greedy, _reference

NUM_LAYERS = 2
LINEARS_PER_LAYER = 4  # qkv, o, gate_up, down as the model fuses them


def _int4_config(method: str, group_size: int) -> dict:
    if method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemm",
                "zero_point": True}  # fmt: skip
    return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": False,
            "sym": False, "checkpoint_format": "gptq" if method == "gptq" else "gptq_v2"}  # fmt: skip


_SAVED: dict[tuple, tuple[Path, Path]] = {}


def _saved(
    tmp_path_factory, key: tuple, config: dict, make_layer, model_config=None
) -> tuple[Path, Path]:
    if key not in _SAVED:
        directory = tmp_path_factory.mktemp("-".join(map(str, key)))
        _SAVED[key] = save_quantized(directory, key[0], config, make_layer,
                                     config=model_config)  # fmt: skip
    return _SAVED[key]


def _int4_checkpoint(tmp_path_factory, method: str, group_size: int) -> tuple[Path, Path]:
    return _saved(tmp_path_factory, (method, group_size), _int4_config(method, group_size),
                  lambda _name, w: int4_tensors(w, method, group_size))  # fmt: skip


def _act_order_groups(num_inputs: int, seed: int, is_block_aligned: bool) -> torch.Tensor:
    """Each input's group (of 32 inputs), in a shuffled order: whole runs of 32 inputs
    shuffled, or single inputs."""
    gen = torch.Generator().manual_seed(seed)
    groups = torch.arange(num_inputs) // 32
    if is_block_aligned:
        order = torch.randperm(num_inputs // 32, generator=gen)
        return order.repeat_interleave(32)
    return groups[torch.randperm(num_inputs, generator=gen)]


@pytest.mark.parametrize("method", ["awq", "gptq", "gptq_v2"])
def test_unpack_reads_back_what_was_packed(method) -> None:
    torch.manual_seed(0)
    w = torch.randn(96, 128) * 0.1
    tensors, reference = int4_tensors(w, method, 32)
    scheme = quant_scheme({"quantization_config": _int4_config(method, 32)})
    q, z, s, groups = unpack_int4(scheme, tensors)
    assert q.shape == (128, 96) and z.shape == s.shape == (4, 96)
    torch.testing.assert_close(((q.float() - z[groups]) * s[groups]).t(), reference)
    assert 0 < (reference - w).abs().max() < 0.1  # a real quantization of w


def test_packers_put_each_value_where_the_formats_say() -> None:
    v = torch.arange(16, dtype=torch.int32).remainder(16).repeat(2, 1)[:, :16]  # 0..15
    awq = pack_columns(v, AWQ_ORDER)
    assert int(awq[0, 0]) & 15 == 0 and (int(awq[0, 0]) >> 4) & 15 == 2  # outputs 0, 2, ...
    rows = pack_rows(torch.arange(8, dtype=torch.int32).view(8, 1))
    assert [(int(rows[0, 0]) >> (4 * i)) & 15 for i in range(8)] == list(range(8))


@pytest.mark.parametrize("group_size", [32, 64, -1])
@pytest.mark.parametrize("method", ["awq", "gptq", "gptq_v2"])
def test_dequantized_greedy_matches_transformers(method, group_size, tmp_path_factory) -> None:
    """`--quantization none` in float32: the model holds exactly the weights the
    checkpoint stands for, so its tokens are transformers' on those weights."""
    quantized, reference = _int4_checkpoint(tmp_path_factory, method, group_size)
    loaded = load_model(str(quantized), torch.float32, "cpu", quantization="none")
    assert loaded.checkpoint.quantization == ("awq" if method == "awq" else "gptq")
    assert loaded.checkpoint.num_quantized_linears == 0
    expected = _reference(reference)
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == expected


@pytest.mark.parametrize("is_block_aligned", [True, False])
def test_gptq_act_order(is_block_aligned, tmp_path_factory) -> None:
    """A g_idx out of input order: runs quantized where every 32 inputs share a group,
    dequantized otherwise; the tokens are transformers' either way (float32)."""
    config = {**_int4_config("gptq", 32), "desc_act": True}

    def make_layer(_name: str, w: torch.Tensor):
        groups = _act_order_groups(w.shape[1], seed=w.shape[0], is_block_aligned=is_block_aligned)
        return int4_tensors(w, "gptq", 32, groups)

    quantized, reference = _saved(tmp_path_factory, ("gptq", "act", is_block_aligned), config,
                                  make_layer)  # fmt: skip
    loaded = load_model(str(quantized), torch.float32, "cpu", quantization="none")
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == _reference(
        reference
    )
    bf16 = load_model(str(quantized), torch.bfloat16, "cpu", pack_weights=False)
    expected_swapped = NUM_LAYERS * LINEARS_PER_LAYER if is_block_aligned else 0
    assert bf16.checkpoint.num_quantized_linears == expected_swapped


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_auto_runs_the_int4_kernels_on_the_checkpoints_groups(method, tmp_path_factory) -> None:
    """bfloat16 on the CPU: every linear layer but lm_head (not quantized) runs on the int4
    kernels, whose weights are the checkpoint's with scales and zeros in bfloat16; the
    logits stay those of the dequantized model."""
    quantized, _ = _int4_checkpoint(tmp_path_factory, method, 64)
    loaded = load_model(str(quantized), torch.bfloat16, "cpu")
    assert loaded.checkpoint.num_quantized_linears == NUM_LAYERS * LINEARS_PER_LAYER
    layer = loaded.model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Int4Linear)
    assert isinstance(layer.mlp.down_proj, Int4Linear)
    assert not isinstance(loaded.model.lm_head, Int4Linear)
    if gemv_kernel() is not None:
        assert layer.mlp.down_proj.gemv is not None
    dense = load_model(str(quantized), torch.bfloat16, "cpu", quantization="none")
    _assert_same_layers(loaded.model, dense.model, rel=0.02)
    logits = _prefill_logits(loaded.model)
    expected = _prefill_logits(dense.model)
    assert (logits - expected).abs().max() < 0.05 * expected.abs().max()
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() > 0.9


def _assert_same_layers(model, dense_model, rel: float) -> None:
    """Each swapped layer computes its dense counterpart's function (rows in the same
    order: q/k reordered for RoPE as the dense ones are), up to `rel` of its outputs."""
    torch.manual_seed(4)
    for layer, dense in zip(model.model.layers, dense_model.model.layers):
        for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):  # fmt: skip
            quantized, expected = layer.get_submodule(name), dense.get_submodule(name)
            x = torch.randn(5, quantized.in_features, dtype=torch.bfloat16)
            y, y_ref = quantized(x).float(), expected(x).float()
            assert (y - y_ref).norm() < rel * y_ref.norm(), name


def _prefill_logits(model) -> torch.Tensor:
    run = PagedRun(model, num_blocks=64, block_size=4)
    seqs = [run.add(p) for p in PROMPTS]
    logits = run.step([(s, len(p)) for s, p in zip(seqs, PROMPTS)], all_logits=True)
    return logits.float()


def test_int4_planes_are_the_checkpoints_weights_in_bfloat16() -> None:
    torch.manual_seed(1)
    w = torch.randn(64, 128) * 0.1
    tensors, reference = int4_tensors(w, "awq", 64)
    q, z, s, groups = unpack_int4(QuantScheme("awq", 64), tensors)
    planes = int4_kernel_planes(q, z, s, groups)
    layer = Int4Linear(*planes, in_features=128)
    weight = layer.dequantized(*planes, torch.float32)
    # only the (scale, zero) pairs are rounded: to bfloat16, 8 bits of mantissa
    torch.testing.assert_close(weight, reference, rtol=0, atol=float(reference.abs().max()) / 64)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x).float(), x.float() @ weight.t(), rtol=0.02, atol=0.02)


def test_int4_planes_need_runs_of_32_inputs_in_one_group() -> None:
    q = torch.zeros(64, 8, dtype=torch.uint8)
    z, s = torch.zeros(2, 8), torch.ones(2, 8)
    assert int4_kernel_planes(q, z, s, torch.arange(64) // 32) is not None
    assert int4_kernel_planes(q, z, s, torch.arange(64) % 2) is None


@pytest.mark.parametrize(
    "variant", ["fp8-tensor-dynamic", "fp8-tensor-static", "ct-channel", "fp8-block"]
)
def test_fp8_dequantized_greedy_matches_transformers(variant, tmp_path_factory) -> None:
    quantized, reference = _fp8_checkpoint(tmp_path_factory, variant)
    loaded = load_model(str(quantized), torch.float32, "cpu")  # auto: dequantized on a CPU
    assert loaded.checkpoint.quantization == "fp8"
    assert loaded.checkpoint.num_quantized_linears == 0
    assert "dequantized" in loaded.checkpoint.kernel
    expected = _reference(reference)
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == expected


@pytest.mark.parametrize("variant", ["fp8-tensor-dynamic", "fp8-tensor-static", "ct-channel"])
def test_fp8_forced_runs_scaled_mm(variant, tmp_path_factory) -> None:
    """`--quantization fp8` on the CPU runs the layers the GPU runs (torch._scaled_mm on
    FP8 activations): the logits stay near the dequantized model's."""
    quantized, _ = _fp8_checkpoint(tmp_path_factory, variant)
    loaded = load_model(str(quantized), torch.bfloat16, "cpu", quantization="fp8")
    assert loaded.checkpoint.num_quantized_linears == NUM_LAYERS * LINEARS_PER_LAYER
    qkv = loaded.model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, Fp8Linear)
    assert (qkv.input_scale is None) == (variant != "fp8-tensor-static")
    dense = load_model(str(quantized), torch.bfloat16, "cpu", quantization="none")
    _assert_same_layers(loaded.model, dense.model, rel=0.1)  # FP8 activations: 3 bits
    logits, expected = _prefill_logits(loaded.model), _prefill_logits(dense.model)
    assert (logits - expected).abs().max() < 0.1 * expected.abs().max()
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() > 0.8


def _fp8_checkpoint(tmp_path_factory, variant: str) -> tuple[Path, Path]:
    if variant.startswith("ct"):
        config = {"quant_method": "compressed-tensors", "format": "float-quantized",
                  "config_groups": {"group_0": {
                      "targets": ["Linear"],
                      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                      "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}},
                  "ignore": ["lm_head"]}  # fmt: skip
    else:
        scheme = "static" if variant.endswith("static") else "dynamic"
        config = {"quant_method": "fp8", "activation_scheme": scheme}
        if variant.endswith("block"):
            config["weight_block_size"] = [16, 16]

    def make_layer(_name: str, w: torch.Tensor):
        return fp8_tensors(w, per_channel=variant.startswith("ct"),
                           is_static=variant.endswith("static"),
                           block=16 if variant.endswith("block") else None)  # fmt: skip

    return _saved(tmp_path_factory, ("fp8", variant), config, make_layer)


def test_fp8_linear_is_the_product_of_its_rounded_inputs() -> None:
    torch.manual_seed(2)
    w = torch.randn(48, 64) * 0.1
    tensors, weight = fp8_tensors(w, per_channel=True, is_static=False)
    layer = Fp8Linear(tensors["weight"], tensors["weight_scale"].view(-1), None, None,
                      torch.float32)  # fmt: skip
    x = torch.randn(5, 64)
    x_fp8, x_scale = quantize_rows(x)
    expected = (x_fp8.float() * x_scale) @ weight.t()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert (x_fp8.float() * x_scale - x).abs().max() < 0.07 * x.abs().max()


@pytest.mark.parametrize(
    ("quantization_config", "fragment"),
    [
        ({"quant_method": "awq", "bits": 8, "group_size": 128}, "AWQ with 8 bits"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "version 'gemv'"),
        ({"quant_method": "gptq", "bits": 3}, "GPTQ with 3 bits"),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {
            "num_bits": 4, "type": "int", "strategy": "group"}}}}, "'compressed-tensors'"),
    ],
)  # fmt: skip
def test_unsupported_quantizations_are_refused_with_what_is_supported(
    quantization_config, fragment, tmp_path
) -> None:
    with pytest.raises(ValueError, match="supported") as info:
        quant_scheme({"quantization_config": quantization_config})
    assert fragment in str(info.value) and "GPTQ" in str(info.value)
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "quantization_config": quantization_config}))  # fmt: skip
    with pytest.raises(ValueError, match="quantized checkpoints supported"):
        load_model(str(tmp_path), torch.float32, "cpu")


def test_quantization_flag_must_fit_the_checkpoint(tmp_path_factory) -> None:
    quantized, reference = _int4_checkpoint(tmp_path_factory, "awq", 32)
    with pytest.raises(ValueError, match="does not apply .* a awq checkpoint"):
        load_model(str(quantized), torch.bfloat16, "cpu", quantization="gptq")
    with pytest.raises(ValueError, match="does not apply .* non-quantized"):
        load_model(str(reference), torch.bfloat16, "cpu", quantization="awq")
    with pytest.raises(ValueError, match="does not apply"):
        load_model(str(quantized), torch.bfloat16, "cpu", quantization="gguf")
    loaded = load_model(str(quantized), torch.bfloat16, "cpu", quantization="awq")
    assert loaded.checkpoint.num_quantized_linears == NUM_LAYERS * LINEARS_PER_LAYER


def test_engine_flags_know_the_loaders_methods() -> None:
    from superinfer.config import QUANTIZATIONS, ModelConfig
    from superinfer.model.loader import QUANTIZATIONS as LOADER_QUANTIZATIONS

    assert QUANTIZATIONS == LOADER_QUANTIZATIONS
    assert ModelConfig(quantization="awq_marlin").quantization == "awq"
    with pytest.raises(ValueError, match="gptq"):
        ModelConfig(quantization="bitsandbytes")


def test_an_awq_checkpoint_serves_through_the_engine(tmp_path_factory) -> None:
    """The default dtype (auto: bfloat16 here, not the checkpoint's float16) runs the
    int4 kernels; the engine generates with its invariants checked."""
    from superinfer import LLM, SamplingParams
    from superinfer.model.dtype import resolve_dtype

    quantized, _ = _int4_checkpoint(tmp_path_factory, "awq", 32)
    config = json.loads((quantized / "config.json").read_text())
    (quantized / "config.json").write_text(json.dumps({**config, "torch_dtype": "float16"}))
    if resolve_dtype("auto", str(quantized), torch.device("cpu")) != torch.bfloat16:
        pytest.skip("this CPU does not compute bfloat16 natively")
    llm = LLM(str(quantized), device="cpu", block_size=4, num_device_blocks=64, max_model_len=64,
              check_invariants=True)  # fmt: skip
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                               SamplingParams(max_tokens=8, min_tokens=8, temperature=0))  # fmt: skip
        assert [len(o.outputs[0].token_ids) for o in outputs] == [8] * len(PROMPTS)
        assert llm.engine.checkpoint.num_quantized_linears == NUM_LAYERS * LINEARS_PER_LAYER
    finally:
        llm.engine.close()


def test_int4_rule_prefers_bfloat16_for_int4_checkpoints(tmp_path, monkeypatch) -> None:
    from superinfer.model import dtype as dtype_module

    monkeypatch.setattr(dtype_module, "supported_dtypes",
                        lambda _device: (torch.bfloat16, torch.float16, torch.float32))  # fmt: skip
    config = {"torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert dtype_module.resolve_dtype("auto", str(tmp_path), torch.device("cpu")) == torch.float16
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert dtype_module.resolve_dtype("auto", str(tmp_path), torch.device("cpu")) == torch.bfloat16


def test_gptq_zero_biases_the_model_lacks_are_skipped(tmp_path_factory) -> None:
    """AutoGPTQ writes a bias for every layer, zeros where the model has none: skipped, as
    vLLM does. A nonzero one is still an error."""

    def make_layer(bias_value: float):
        def make(_name: str, w: torch.Tensor):
            parts, weight = int4_tensors(w, "gptq", 32)
            return {**parts, "bias": torch.full((w.shape[0],), bias_value)}, weight

        return make

    config = _int4_config("gptq", 32)
    quantized, reference = _saved(tmp_path_factory, ("gptq", "bias0"), config, make_layer(0.0))
    loaded = load_model(str(quantized), torch.float32, "cpu", quantization="none")
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == _reference(
        reference
    )
    nonzero, _ = _saved(tmp_path_factory, ("gptq", "bias1"), config, make_layer(0.5))
    with pytest.raises(ValueError, match="unexpected weight .*bias"):
        load_model(str(nonzero), torch.float32, "cpu")


def test_awq_qwen2_keeps_its_qkv_biases(tmp_path_factory) -> None:
    """Qwen2's q/k/v biases (reordered for RoPE with their rows) ride along with the
    quantized q/k/v: float32 parity with transformers, and the swapped layer computes the
    dense one's function, bias included."""
    quantized, reference = _saved(
        tmp_path_factory, ("awq", "qwen2"), _int4_config("awq", 32),
        lambda _name, w: int4_tensors(w, "awq", 32), tiny_quant_qwen2_config(),
    )  # fmt: skip
    loaded = load_model(str(quantized), torch.float32, "cpu", quantization="none")
    assert loaded.model.model.layers[0].self_attn.qkv_proj.bias is not None
    assert _chunked_greedy(PagedRun(loaded.model, num_blocks=64, block_size=4)) == _reference(
        reference
    )
    bf16 = load_model(str(quantized), torch.bfloat16, "cpu")
    assert bf16.checkpoint.num_quantized_linears == NUM_LAYERS * LINEARS_PER_LAYER
    dense = load_model(str(quantized), torch.bfloat16, "cpu", quantization="none")
    _assert_same_layers(bf16.model, dense.model, rel=0.02)


def test_what_will_not_run_quantized_is_not_kept() -> None:
    """A load that dequantizes (a float32 model, FP8 on a CPU) keeps no quantized copy."""
    torch.manual_seed(5)
    w = torch.randn(64, 64) * 0.1
    tensors, reference = int4_tensors(w, "awq", 32)
    named = [(f"layer.{k}", v) for k, v in tensors.items()]
    for keeps in (True, False):
        kept = QuantizedTensors(QuantScheme("awq", 32), keeps_quantized=keeps)
        ((name, weight),) = kept.dequantize(named)
        torch.testing.assert_close(weight, reference)
        assert (name, len(kept.planes)) == ("layer.weight", int(keeps))
    assert quantized_kernel(QuantScheme("fp8"), torch.bfloat16, torch.device("cpu"))[0] is False
    assert quantized_kernel(QuantScheme("fp8"), torch.bfloat16, torch.device("cpu"), True)[0]
    assert quantized_kernel(QuantScheme("awq", 32), torch.float32, torch.device("cpu"))[0] is False
