"""docs/models.md, generated from the registry: `python -m superinfer.model.docs > docs/models.md`
(tests/model/test_docs_models.py checks that the page matches the registry)."""

from __future__ import annotations

from superinfer.model.registry import architectures

HEADER = """# Supported models

Generated from the registry (`superinfer/model/registry.py`, one module per family under
`superinfer/model/families/`) by `python -m superinfer.model.docs > docs/models.md`; a test
checks that this page matches it.

`--model` takes a local Hugging Face directory (config.json + *.safetensors), a llama.cpp
`.gguf` file, or a Hugging Face model id (`org/name`), resolved through the Hugging Face
cache with `huggingface_hub` as vLLM does: downloaded when the network allows, the cached
snapshot used offline (`HF_HUB_OFFLINE=1`). An architecture not listed here is refused with
the list of those that are. `--trust-remote-code`, `--revision` and `--tokenizer` are refused.

| architecture (`architectures` in config.json) | family | GGUF (`general.architecture`) | what differs from Llama | tested |
|---|---|---|---|---|
"""

FOOTER = """
Every architecture runs the one shared decoder (`superinfer/model/decoder.py`): RMSNorm
(optionally 1 + weight), RoPE (default, linear, llama3, yarn, dynamic, longrope, as
transformers computes them, over all of each head or its first dims; GGUF `rope_freqs` and
LongRoPE factors), fused q/k/v and gate/up projections, a gated MLP
or a mixture of experts (`superinfer/model/moe.py`, grouped matmuls), and the paged
attention of `superinfer/model/attention.py` (on sliding-window layers, blocks out of the
window are neither gathered nor read, by the CPU decode kernel too). The tests build tiny
random models with transformers' own config classes and compare greedy tokens over 32
steps in float32,
batched with mixed lengths and chunked prefill (`tests/model/test_architectures.py`), and,
for Mistral, Gemma 3 and Qwen3-MoE, through the engine under KV pressure with rotation.

LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini) takes its long factors for every sequence when
`--max-model-len` is past the model's original context (4,096 tokens for these), else its
short ones, as vLLM and llama.cpp choose; transformers switches per forward pass by the
longest sequence in it, which gives the same tokens while every sequence stays on one side
of the original context. The startup log names the choice.

The vision-language checkpoints (Gemma 3 from 4B up, Mistral 3, Qwen2-VL and Qwen2.5-VL)
serve their language model on text (`superinfer/model/vision_language.py`): the vision tower
is not loaded, and a chat message with an image part gets a 400 naming the part's type. A
chat template kept only in the processor's `chat_template.json` is read from there.

Not supported yet: the vision towers, GGUF files of Gemma 1 and Granite. In GGUF files of
the MoE families (Mixtral as llama.cpp's `llama` with experts, `qwen3moe`, `qwen2moe`) the
experts run quantized where the other layers do (`superinfer/model/quant_moe.py`, below), as
does Qwen2-MoE's shared expert (its gate, a vector, stays float); under
`--quantization none` they are dequantized to `--dtype`.

GGUF files follow llama.cpp's conventions (its tensor names, fused q/k/v and gate/up for
Phi-3; its q/k row order for Llama;
Gemma 2/3's norm weights stored as 1 + weight, their local-layer patterns, Gemma 3's local
RoPE base). `benchmarks/gguf_vs_llama_cpp.py` writes a tiny random model of a GGUF family
as the tests do and compares greedy tokens of transformers, llama.cpp and superinfer on it
(docs/results/models/gguf_gemma3_1205/: all three agree for Llama, Qwen3, Phi-3, Gemma 2,
Gemma 3, Qwen3-MoE and Mixtral; docs/results/models/qwen2moe_gguf_1206/: Qwen2-MoE).

Sliding windows: when every layer is windowed (Mistral; Mixtral, Phi-3 or Qwen2 with a
window on all layers), the KV blocks no future query can see are freed as decoding
proceeds, so a long generation holds about window / block_size + 1 blocks in the device
tier (`tests/model/test_sliding_window.py`, `tests/core/test_sliding_window.py`). Models
with global layers (Gemma 2/3) keep every block: their global layers read the whole
context; their local layers still skip the blocks out of the window.

## Quantization

| format | `--quantization` | how it runs |
|---|---|---|
| GGUF Q4_0, Q4_1, Q8_0, Q4_K | `gguf` | kept quantized: each 32-weight block becomes one (scale, zero) group of PyTorch's CPU int4 kernel (`aten._weight_int4pack_mm_for_cpu`, bfloat16 activations); Q8_0 as two 4-bit planes; Q4_K's blocks of 32 with their 6-bit scales and mins (`superinfer/model/quant.py`). A fused q/k/v or gate/up whose parts differ in type (Q4_K q/k with a Q6_K v, as Q4_K_M files hold in about half their layers; 4-bit parts with a Q8_0 one) runs, where the few-row GEMV runs (not under `gguf-w4a8`), each part on its own kernels: the GEMV for steps of up to 8 rows, the 4-bit or Q6_K GEMM for larger steps (a Q8_0 part unpacked for the step), with no dense copy (`superinfer/model/quant_parts.py`); elsewhere, or with a part in a type not listed here, it is dequantized. A quantized token embedding stays in its blocks (Q8_0 and Q6_K in the kernels' layouts; Q4_K and the other types in the file's memory map, read by gguf's dequantizer), and a step dequantizes the rows it reads. The loader swaps these layers in before the model's parameters are allocated, so their weights are never dequantized whole: loading holds about the quantized model, not a dense one. MoE experts (`ffn_{gate,up,down}_exps`) stay quantized too (Q6_K ones as well, in Q6_K's own bits, where the few-row GEMV runs), one layer per expert, never in float (`superinfer/model/quant_moe.py`): Qwen3-30B-A3B's 29 billion expert weights take about 18 GB as 4-bit planes, 58 GB in bfloat16 |
| GGUF Q6_K (Q4_K_M files' lm_head, some ffn_down and attn_v) | `gguf` | where the few-row GEMV runs (AVX-512 BF16), steps of up to 8 rows (lm_head included) run it on Q6_K's own bits, 6.625 a weight (the 6-bit values as a 4-bit and a 2-bit plane, an int8 scale per 16 inputs, a float d per 256: `q6k_gemv` in `superinfer/model/csrc/q_gemv.c`); larger steps run a GEMM that unpacks each strip of those bits once per step: up to 24 rows to q - 32 (a table lookup, exact in bfloat16), with d sc applied to each row's sums per 16 inputs as the GEMV does, beyond to the weights rounded to bfloat16 (`q6k_linear` in `superinfer/model/csrc/q4_linear.c`), so no dense copy is kept. A Q6_K token embedding stays in those bits too (shared with a tied lm_head), and a step dequantizes the rows it reads. Elsewhere, and under `gguf-w4a8`, Q6_K layers are dequantized to `--dtype` |
| GGUF, any type gguf-py dequantizes (F16, Q6_K, Q5_K, ...) | `none` | dequantized to `--dtype` at load |
| safetensors float checkpoints | `none` | as stored, in `--dtype` |
| AWQ (4-bit, GEMM packing), GPTQ (4-bit, v1 and v2 formats) | `auto`, `awq`, `gptq` | kept quantized in bfloat16: each group's scale s and integer zero z become the int4 kernels' (scale, zero) pair, w = (q - 8) s + (8 - z) s, per 32 inputs (a group of 64 or 128 repeats its pair); on the CPU they run as GGUF Q4_1 does (PyTorch's int4 kernel, the few-row GEMV, the 4-bit GEMM), on CUDA on PyTorch's tinygemm (`aten._weight_int4pack_mm`) (`superinfer/model/quant_checkpoint.py`). GPTQ act-order runs where every 32 inputs share a group, else dequantized |
| FP8 (`fp8` with a per-tensor scale, compressed-tensors with 8-bit float weights per tensor or channel) | `auto`, `fp8` | on CUDA `torch._scaled_mm` on FP8 activations (one scale per row, or the checkpoint's static `input_scale`); on a CPU dequantized to `--dtype` under `auto` (PyTorch's CPU FP8 matmul is about 30x slower than bfloat16's), run as on CUDA with `fp8`. Block-scaled FP8 (`weight_block_size`) is dequantized everywhere |
| other quantized checkpoints (bitsandbytes, 8-bit AWQ/GPTQ, AWQ GEMV packing, compressed-tensors integer) | - | refused, naming what is supported |

`auto` (the default) is `gguf` where benchmarks/quantized_decode.py measured it faster
(the CPU, in bfloat16), else `none` (`superinfer.model.loader.auto_quantizes`). On the CPU
it is a hybrid, by the rows a step multiplies (`benchmarks/int4_rows.py`). Steps of at
most 8 rows (decode of a few requests) are bound by reading the weights; on CPUs with
AVX-512 BF16 they run superinfer's few-row GEMV (`superinfer/model/csrc/q_gemv.c`), which
multiplies each block's 4-bit or 8-bit values as they are and applies the block's scale and
zero once per row: the int4 kernel's function of the same weights, in 0.7x its time at one
row (lm_head: 0.6x), each row computed on its own (elsewhere PyTorch's int4 kernel runs
them). Larger steps (prefill, big batches) of a 4-bit layer run superinfer's 4-bit GEMM
(`superinfer/model/csrc/q4_linear.c`), which dequantizes each weight once per step, to the
weights rounded to bfloat16, and is faster than oneDNN's bfloat16 GEMM from 5 rows to 256.
On CPUs with AMX (Intel Sapphire Rapids and later) its tiles run on AMX, 3-6x faster from 16
rows, so 4-bit layers take it from 4 rows (`SUPERINFER_AMX=0` keeps it on AVX-512).
Q6_K layers and the parts of a fused layer of mixed types run a GEMM of the same kind on
their own bits (`q6k_linear`; a Q8_0 part is unpacked for the step). A Q8_0 layer (the
default model's lm_head) runs larger steps on AMX with the GEMM's Q8_0 form over the GEMV's
8-bit weights (`q8_linear`); elsewhere it, and any layer where those kernels cannot run,
keeps a dense bfloat16 copy of the same weights for steps of more than 8 rows (lm_head: 4
with the GEMV, 2 without).
MoE experts never keep a dense copy: a step multiplies each expert that received rows by
its group of rows (a loop over the active experts, as llama.cpp's `mul_mat_id`), on the
GEMV or the 4-bit GEMM by the expert's rows. Q6_K experts (Q4_K_M files' ffn_down_exps in
about half the layers) are held in Q6_K's own bits (0.83 bytes a weight) and run the GEMV
and the Q6_K GEMM. Q8_0 ones (not under `gguf-w4a8`) are held only in the GEMV's 8-bit
layout (1.25 bytes a weight, `superinfer/model/gemv_linear.py`): steps of up to 8 rows run
the GEMV, larger ones unpack the expert's weights to a transient bfloat16 matrix. Where
the GEMV cannot run, Q6_K experts are dequantized and Q8_0 ones, like 4-bit ones without
the GEMM, run every step on PyTorch's int4 kernel.

AWQ and GPTQ checkpoints take the same CPU path as GGUF Q4_1, after their groups are
converted (above); `auto` reads the method from config.json and runs them in bfloat16 (an
AWQ checkpoint states float16, the dtype of the GPU kernels it was made for; PyTorch's int4
kernels compute in bfloat16). `benchmarks/quant_checkpoint_speed.py` measures them against
the bfloat16 checkpoint they were made from (docs/results/models/quant_checkpoint_1205/).
The CUDA layers (`superinfer/model/cuda_int4.py`, `superinfer/model/fp8_linear.py`) have
CUDA-only tests (`tests/model/test_cuda_quant.py`) that `scripts/gpu_check.py` runs; they
have not run on a GPU yet.

`gguf-w4a8` runs every step of those layers on 8-bit activations, as llama.cpp computes
its Q4 and Q8_0 formats: each row is rounded to int8 per block of 32 inputs and
multiplied by the 4-bit or 8-bit values with AVX-512 VNNI
(`superinfer/model/csrc/q4_q8_linear.c`), 64 multiply-adds an instruction against
bfloat16's 32, with no dequantization and no dense copy. It is faster than `auto` at every
step size, from a single request's decode to prefill (docs/results/models/w4a8_1205/),
and since each row is quantized on its own, a request's tokens do not depend on what
shares its steps. The cost is in quality: on the default model perplexity rises 0.27%
against `auto` (float32 is 0.02% below it), and greedy replies part from `auto`'s as often
as float32's do (`benchmarks/w4a8_quality.py`). It is opt-in for that reason.

## Adding a model

1. Write `superinfer/model/families/<family>.py`: a function from the HF `config.json` dict
   to `ModelConfig` (start from `hf_common(cfg)` and turn on the layer variants the family
   uses), a weight-name mapping if its checkpoints do not use the canonical names
   (`superinfer/model/weights.py` lists them), and `register(Architecture(...))` per HF
   `architectures` name, with GGUF names if llama.cpp converts it. A vision-language
   checkpoint of a registered text family takes `vl_text_config` and `vl_text_weights`
   (`superinfer/model/vision_language.py`) to serve its language model.
2. If the family needs a layer variant the decoder lacks, add it to `ModelConfig` (off by
   default) and to `superinfer/model/decoder.py`, shared with every family.
3. Import the module in `superinfer/model/families/__init__.py`.
4. Add a tiny config built with transformers' own config class to `tiny_configs()` in
   `tests/model/tiny.py`: the parity tests of `tests/model/test_architectures.py` then run
   on it.
5. Regenerate this page: `python -m superinfer.model.docs > docs/models.md`.
"""


def models_markdown() -> str:
    rows = [
        f"| `{a.name}` | {a.family} | {a.gguf_arch or '-'} | {a.features} | {a.tested} |"
        for a in architectures().values()
    ]
    return HEADER + "\n".join(rows) + "\n" + FOOTER


if __name__ == "__main__":
    print(models_markdown(), end="")
