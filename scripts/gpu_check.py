"""One-shot GPU check: correctness and speed of the real `ModelRunner` against the roofline
measured in the same run, on seeded random weights (no checkpoint, no network).

Sections, most important first (each one's failure is recorded and the run goes on):

  env           GPU, versions, measured copy bandwidth (GB/s, read + write) and bf16 matmul
                rate (TFLOP/s, 8192^3): the two peaks every roofline below divides by
  correctness   greedy tokens of 3 prompts on a 4-layer SmolLM2-135M shape: CPU reference
                backend vs CUDA triton, eager and with CUDA graphs, fp32 (must match) and
                bf16 (may diverge)
  decode_8b     Llama-3-8B shape, bf16: decode step at batch 1..256 (context 512), eager and
                with graphs, vs (weight + KV bytes) / bandwidth and flops / matmul rate
  prefill_8b    one sequence of 512, 2048, 8192 tokens: achieved TFLOP/s vs the matmul rate
  decode_135m   as decode_8b, SmolLM2-135M shape
  prefill_135m  as prefill_8b, SmolLM2-135M shape
  pipeline      `launch` overlapped with building the next step vs `execute`, 135M, batch 32
  profile       GPU kernel time of an eager decode step by kernel (torch.profiler), both
                shapes, batch 1 and 32
  quant         AWQ/GPTQ int4 (tinygemm) and FP8 (torch._scaled_mm) layers against bf16, on
                Llama-3-8B's projection shapes at 1-64 rows, vs weight bytes / bandwidth
  cuda_tests    the CUDA tests of the runner, attention, KV cache, transfer and the
                quantized layers (--skip-tests)

On the device (about 4 to 6 minutes; sections stop starting after --budget-s, 420 s):

    python scripts/gpu_check.py --out $OUT/gpu_check.json

The JSON is rewritten after every section, so a run killed midway keeps what it measured.
`--smoke` runs every section on this CPU with tiny shapes (under 2 minutes):

    HF_HUB_OFFLINE=1 python scripts/gpu_check.py --smoke --skip-tests --out /tmp/smoke.json

docs/results/gpu/README.md says what every row of the table means.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from superinfer.core.outputs import ScheduledSequence, SchedulerOutput
from superinfer.model.config import ModelConfig
from superinfer.model.decoder import DecoderForCausalLM
from superinfer.sampling_params import SamplingParams

REPO = Path(__file__).resolve().parents[1]
GB, GIB = 1e9, 1 << 30
NOMINAL_H200 = {"copy_gb_s": 4800.0, "matmul_tflop_s": 989.0}  # spec sheet, if env fails
GRACE_S = 60  # a section still running this long after the budget is interrupted

LLAMA3_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_layers": 32,
    "num_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
    "max_position_embeddings": 16384,
}
SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
    "max_position_embeddings": 16384,
    "tie_word_embeddings": True,
}
TINY_BIG = {  # --smoke's stand-in for the 8B shape
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 32,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
}
TINY_SMALL = {  # --smoke's stand-in for the 135M shape
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}

GREEDY = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)


# --- what to measure ------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Shapes and sizes of the run: the real ones on a GPU, tiny ones with --smoke."""

    smoke: bool
    device: torch.device
    backend: str  # attention backend of the device runs
    use_graphs: bool
    big: dict[str, Any]
    small: dict[str, Any]
    correctness_shape: dict[str, Any]
    prompt_lengths: tuple[int, ...] = (5, 37, 130)
    num_new_tokens: int = 16
    decode_batches: tuple[int, ...] = (1, 8, 32, 128, 256)
    decode_context: int = 512
    prefill_lengths: tuple[int, ...] = (512, 2048, 8192)
    prefill_step_tokens: int = 8192  # tokens per step when prefilling the decode contexts
    pipeline_batch: int = 32
    copy_bytes: int = 2 * GIB
    matmul_size: int = 8192
    warmup: int = 5
    iters: int = 20
    block_size: int = 16

    @classmethod
    def for_run(cls, smoke: bool) -> Plan:
        if not smoke:
            return cls(
                smoke=False,
                device=torch.device("cuda"),
                backend="triton",
                use_graphs=True,
                big=LLAMA3_8B,
                small=SMOLLM2_135M,
                correctness_shape={**SMOLLM2_135M, "num_layers": 4},
            )
        return cls(
            smoke=True,
            device=torch.device("cpu"),
            backend="reference",
            use_graphs=False,
            big=TINY_BIG,
            small=TINY_SMALL,
            correctness_shape=TINY_SMALL,
            prompt_lengths=(5, 11, 23),
            num_new_tokens=8,
            decode_batches=(1, 4),
            decode_context=32,
            prefill_lengths=(64,),
            prefill_step_tokens=256,
            pipeline_batch=4,
            copy_bytes=64 << 20,
            matmul_size=256,
            warmup=2,
            iters=5,
        )


@dataclass
class Peaks:
    """The rates the rooflines divide by: measured in `env`, else nominal."""

    copy_gb_s: float = NOMINAL_H200["copy_gb_s"]
    matmul_tflop_s: float = NOMINAL_H200["matmul_tflop_s"]
    source: str = "nominal H200 (env did not run)"


@dataclass
class Budget:
    total_s: float
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.total_s - self.elapsed()


# --- the report -------------------------------------------------------------------------------


class Report:
    """Results by section, the table's rows, and the JSON file, rewritten after each section."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta, "sections": {}}
        self.rows: list[dict[str, Any]] = []

    def row(
        self,
        section: str,
        measure: str,
        value: Any,
        unit: str = "",
        bound: float | None = None,
        note: str = "",
    ) -> None:
        """One table row; `bound` is the roofline in the same unit, ratio = value / bound."""
        ratio = value / bound if isinstance(value, float | int) and bound else None
        row = {
            "section": section,
            "measure": measure,
            "value": value,
            "unit": unit,
            "bound": bound,
            "ratio": ratio,
            "note": note,
        }
        self.rows.append(row)
        say(f"  {format_row(row)}")

    def section(self, name: str, record: dict[str, Any]) -> None:
        self.data["sections"][name] = record
        self.save()

    def save(self) -> None:
        self.data["rows"] = self.rows
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


COLUMNS = (
    ("section", 13),
    ("measure", 30),
    ("value", 14),
    ("unit", 9),
    ("bound", 10),
    ("ratio", 7),
    ("note", 0),
)


def format_row(row: dict[str, Any]) -> str:
    cells = [_cell(row[name]).ljust(width) for name, width in COLUMNS]
    return " ".join(cells).rstrip()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = " ".join(name.ljust(width) for name, width in COLUMNS).rstrip()
    print("\n" + header + "\n" + "-" * len(header), flush=True)
    for row in rows:
        print(format_row(row), flush=True)


def say(message: str) -> None:
    print(message, flush=True)


# --- the run's shared state -------------------------------------------------------------------


@dataclass
class Context:
    plan: Plan
    report: Report
    budget: Budget
    peaks: Peaks = field(default_factory=Peaks)
    models: dict[str, DecoderForCausalLM] = field(default_factory=dict)

    def model(self, name: str) -> DecoderForCausalLM:
        """The bf16 perf model "big" or "small", built once on the device."""
        if name not in self.models:
            shape = self.plan.big if name == "big" else self.plan.small
            say(f"  building the {name} model on {self.plan.device} (bf16, seeded)")
            self.models[name] = random_model(model_config(shape), torch.bfloat16, self.plan.device)
        return self.models[name]

    def row(self, *args: Any, **kwargs: Any) -> None:
        self.report.row(*args, **kwargs)


def model_config(shape: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**shape)


def random_model(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> DecoderForCausalLM:
    """Allocated on `device` directly (meta init, no fp32 copy), weights ~ N(0, 0.02), norms 1."""
    with torch.device("meta"):
        model = DecoderForCausalLM(config).to(dtype)
    model.to_empty(device=device)
    model.tie_weights()  # to_empty unties shared parameters
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:  # norm weights
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    return model.eval()


@dataclass(frozen=True)
class ModelCosts:
    """What one token costs a model: bytes read per decode step, matmul parameters."""

    weight_bytes: int  # read by every decode step (the embedding only gathers rows)
    layer_params: int  # matmul weights of the decoder layers
    lm_head_params: int
    kv_bytes_per_token: int
    attention_width: int  # num_layers * num_heads * head_dim

    @classmethod
    def of(cls, model: DecoderForCausalLM) -> ModelCosts:
        config, embed = model.config, model.model.embed_tokens.weight
        unique = {id(p): p for p in model.parameters()}.values()
        weight_bytes = sum(p.numel() * p.element_size() for p in unique)
        if not config.tie_word_embeddings:
            weight_bytes -= embed.numel() * embed.element_size()
        layer_params = sum(p.numel() for p in model.model.layers.parameters() if p.dim() == 2)
        kv_bytes = (
            2 * config.num_layers * config.num_kv_heads * config.head_dim * embed.element_size()
        )
        width = config.num_layers * config.num_heads * config.head_dim
        return cls(weight_bytes, layer_params, model.lm_head.weight.numel(), kv_bytes, width)

    def decode_flops(self, batch: int, context: int) -> float:
        return batch * (
            2 * (self.layer_params + self.lm_head_params) + 4 * self.attention_width * context
        )

    def prefill_flops(self, num_tokens: int) -> tuple[float, float]:
        """(matmul flops, causal attention flops) of one sequence's prefill."""
        linear = 2 * self.layer_params * num_tokens + 2 * self.lm_head_params
        return linear, 2 * self.attention_width * num_tokens**2


# --- timing -----------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_kernel(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Best seconds of `fn` (CUDA events on CUDA, perf_counter elsewhere)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            start_s = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start_s)
    return min(times)


def time_steps(step: Callable[[int], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds of `step(i)` (host work included), after `warmup` steps; i counts on."""
    for i in range(warmup):
        step(i)
    sync(device)
    times = []
    for i in range(warmup, warmup + iters):
        start = time.perf_counter()
        step(i)
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --- steps as the scheduler would send them ---------------------------------------------------


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def block_tables(num_seqs: int, blocks_per_seq: int) -> list[list[int]]:
    """Disjoint tables from block 1 on (graph capture writes into block 0)."""
    return [
        list(range(1 + i * blocks_per_seq, 1 + (i + 1) * blocks_per_seq)) for i in range(num_seqs)
    ]


def random_prompts(lengths: Sequence[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]


def prefill_sequence(
    index: int, prompt: list[int], table: list[int], block_size: int
) -> ScheduledSequence:
    """Request r<index>'s whole prompt in one step, sampling its first token."""
    return ScheduledSequence(
        request_id=f"r{index}",
        token_ids=prompt,
        num_context_tokens=0,
        block_table=table[: blocks_for(len(prompt), block_size)],
        is_sampling=True,
        sampling_params=GREEDY,
        num_output_tokens=0,
        prompt_token_ids=prompt,
    )


def decode_sequence(
    index: int, token: int, context: int, table: list[int], block_size: int
) -> ScheduledSequence:
    """Request r<index>'s next token after `context` cached ones."""
    return ScheduledSequence(
        request_id=f"r{index}",
        token_ids=[token],
        num_context_tokens=context,
        block_table=table[: blocks_for(context + 1, block_size)],
        is_sampling=True,
        sampling_params=GREEDY,
        num_output_tokens=1,
    )


def decode_step(
    step_id: int,
    tokens: Sequence[int],
    contexts: Sequence[int],
    tables: Sequence[list[int]],
    block_size: int,
) -> SchedulerOutput:
    seqs = [
        decode_sequence(i, t, c, tables[i], block_size)
        for i, (t, c) in enumerate(zip(tokens, contexts))
    ]
    return SchedulerOutput(step_id, seqs)


def prefill_chunks(
    prompts: list[list[int]], tables: list[list[int]], block_size: int, step_tokens: int
) -> Iterator[SchedulerOutput]:
    """Whole prompts packed into steps of at most `step_tokens` tokens (one prompt at least)."""
    batch: list[ScheduledSequence] = []
    for i, (prompt, table) in enumerate(zip(prompts, tables)):
        if batch and sum(s.num_query_tokens for s in batch) + len(prompt) > step_tokens:
            yield SchedulerOutput(0, batch)
            batch = []
        batch.append(prefill_sequence(i, prompt, table, block_size))
    if batch:
        yield SchedulerOutput(0, batch)


# --- runners ----------------------------------------------------------------------------------


@dataclass
class Bench:
    """A model over its own KV cache, with an eager runner and (maybe) a graph runner."""

    kv: Any
    transfer: Any
    eager: Any
    graphs: Any  # None when graphs are off or unavailable
    graph_info: dict[str, Any]
    blocks_per_seq: int

    def runners(self) -> dict[str, Any]:
        return {"eager": self.eager, **({"graphs": self.graphs} if self.graphs else {})}

    def close(self) -> None:
        for runner in self.runners().values():
            runner.close()
        if self.transfer is not None:
            self.transfer.close()


def open_bench(
    model: DecoderForCausalLM,
    plan: Plan,
    num_seqs: int,
    tokens_per_seq: int,
    graph_sizes: Sequence[int] = (),
    backend: str | None = None,
    device: torch.device | None = None,
) -> Bench:
    """KV for `num_seqs` x `tokens_per_seq` (+ block 0), runners on it; graphs captured
    before any step."""
    from superinfer.engine.kv_cache import KVCacheTiers
    from superinfer.engine.transfer import create_transfer_engine

    config, device = model.config, device or plan.device
    blocks_per_seq = blocks_for(tokens_per_seq, plan.block_size)
    kv = KVCacheTiers.allocate(
        1 + num_seqs * blocks_per_seq,
        16,
        config.num_layers,
        plan.block_size,
        config.num_kv_heads,
        config.head_dim,
        model.dtype,
        device,
    )
    transfer = create_transfer_engine(kv)
    backend = backend or plan.backend
    try:
        eager = new_runner(model, kv, plan.block_size, device, transfer, backend)
        graphs, info = graph_runner(
            model, kv, plan, device, transfer, backend, graph_sizes, blocks_per_seq
        )
    except BaseException:
        transfer.close()
        raise
    return Bench(kv, transfer, eager, graphs, info, blocks_per_seq)


def new_runner(model, kv, block_size, device, transfer, backend, **graph_kwargs):
    from superinfer.engine.model_runner import ModelRunner

    return ModelRunner(
        model, kv, block_size, device, transfer=transfer, attention_backend=backend, **graph_kwargs
    )


def graph_runner(model, kv, plan, device, transfer, backend, sizes, max_blocks) -> tuple[Any, dict]:
    """A runner with captured decode graphs, or (None, why not): a graph failure never stops
    the eager measurements."""
    if not plan.use_graphs or not sizes:
        return None, {"status": "off" + (" (smoke)" if plan.smoke else "")}
    graph_kwargs = {"graph_batch_sizes": tuple(sizes), "max_blocks_per_seq": max_blocks}
    try:
        runner = new_runner(model, kv, plan.block_size, device, transfer, backend, **graph_kwargs)
    except Exception as error:  # noqa: BLE001 - a ModelRunner without graphs, say
        return None, {"status": f"graphs unavailable: {type(error).__name__}: {error}"}
    capture = getattr(runner, "capture_graphs", None)
    try:
        info = dict(capture()) if capture is not None else {}
    except Exception as error:  # noqa: BLE001 - recorded, eager runs on
        info = {"error": f"{type(error).__name__}: {error}"}
    if not info.get("num_graphs"):
        runner.close()
        why = "no ModelRunner.capture_graphs" if capture is None else "nothing captured"
        return None, {"status": f"graphs unavailable: {why}", **info}
    return runner, {"status": "captured", "sizes": list(sizes), **info}


def replays_graph(runner: Any, output: SchedulerOutput) -> bool | None:
    """Whether `runner` replays a graph for `output` (None when it cannot tell)."""
    from superinfer.model.attention import SeqEntry

    graphs = getattr(runner, "graphs", None)
    if graphs is None or not hasattr(graphs, "can_run"):
        return None
    entries = [
        SeqEntry(s.num_query_tokens, s.num_context_tokens, s.block_table) for s in output.sequences
    ]
    return bool(graphs.can_run(entries))


def backend_name(runner: Any) -> str:
    return getattr(getattr(runner, "attention", None), "name", "?")


# --- sections ---------------------------------------------------------------------------------


def section_env(ctx: Context) -> dict[str, Any]:
    plan, device = ctx.plan, ctx.plan.device
    results = versions(device)
    copy_s, copy_bytes = measure_copy(plan)
    matmul_s, matmul_dtype = measure_matmul(plan)
    flops = 2 * plan.matmul_size**3
    ctx.peaks = Peaks(2 * copy_bytes / copy_s / GB, flops / matmul_s / 1e12, "measured (env)")
    results.update(
        copy_bytes=copy_bytes,
        copy_gb_s=ctx.peaks.copy_gb_s,
        matmul_size=plan.matmul_size,
        matmul_dtype=matmul_dtype,
        matmul_tflop_s=ctx.peaks.matmul_tflop_s,
    )
    ctx.row(
        "env",
        "device",
        results["device_name"],
        note=f"torch {torch.__version__}, triton {results['triton']}",
    )
    ctx.row(
        "env",
        "copy bandwidth (rd+wr)",
        ctx.peaks.copy_gb_s,
        "GB/s",
        NOMINAL_H200["copy_gb_s"],
        note=f"copy_ of {copy_bytes / GIB:.2f} GiB, best of 5; bound: H200 spec",
    )
    ctx.row(
        "env",
        f"matmul {plan.matmul_size}^3 {matmul_dtype}",
        ctx.peaks.matmul_tflop_s,
        "TFLOP/s",
        NOMINAL_H200["matmul_tflop_s"],
        note="best of 10; bound: H200 dense bf16 spec",
    )
    return results


def versions(device: torch.device) -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "fp32_matmul_allows_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device_name=torch.cuda.get_device_name(device),
            memory_gib=props.total_memory / GIB,
            capability=f"{props.major}.{props.minor}",
            sm_count=props.multi_processor_count,
        )
    else:
        info["device_name"] = f"cpu ({platform.processor() or platform.machine()})"
    return info


def measure_copy(plan: Plan) -> tuple[float, int]:
    src = torch.empty(plan.copy_bytes, dtype=torch.uint8, device=plan.device).fill_(1)
    dst = torch.empty_like(src)
    seconds = time_kernel(lambda: dst.copy_(src), plan.device, warmup=2, iters=5)
    return seconds, plan.copy_bytes


def measure_matmul(plan: Plan) -> tuple[float, str]:
    dtype = torch.bfloat16
    n = plan.matmul_size
    generator = torch.Generator(plan.device).manual_seed(0)
    a = torch.randn(n, n, device=plan.device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=plan.device, dtype=dtype, generator=generator)
    out = torch.empty(n, n, device=plan.device, dtype=dtype)
    seconds = time_kernel(lambda: torch.matmul(a, b, out=out), plan.device, warmup=3, iters=10)
    return seconds, "bf16"


def section_correctness(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    config = model_config(plan.correctness_shape)
    torch.manual_seed(0)
    model = DecoderForCausalLM(config).eval()  # float32, on the CPU
    prompts = random_prompts(plan.prompt_lengths, config.vocab_size)
    cpu = torch.device("cpu")
    results: dict[str, Any] = {
        "prompt_lengths": list(plan.prompt_lengths),
        "num_new_tokens": plan.num_new_tokens,
    }
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        weights = model.to(dtype)  # in place: fp32 runs first, then the same weights in bf16
        expected = greedy(weights, prompts, plan, cpu, "reference", graphs=False)
        results[f"{dtype_name}_cpu_reference"] = expected
        device_model = weights if plan.device == cpu else clone_to(weights, plan.device)
        for mode in ("eager", "graphs"):
            key = f"{dtype_name}_{plan.device.type}_{plan.backend}_{mode}"
            results[key] = compare_greedy(
                ctx, key, expected, prompts, device_model, mode == "graphs", dtype_name
            )
        del device_model
    return results


def clone_to(model: DecoderForCausalLM, device: torch.device) -> DecoderForCausalLM:
    twin = copy.deepcopy(model).to(device)
    twin.tie_weights()
    return twin.eval()


def compare_greedy(
    ctx: Context,
    key: str,
    expected: dict[str, Any],
    prompts: list[list[int]],
    model: DecoderForCausalLM,
    graphs: bool,
    dtype_name: str,
) -> dict[str, Any]:
    plan = ctx.plan
    if graphs and not plan.use_graphs:
        ctx.row("correctness", key, "skipped", note="no graphs in smoke mode")
        return {"status": "skipped (smoke)"}
    try:
        got = greedy(model, prompts, plan, plan.device, plan.backend, graphs)
    except Exception as error:  # noqa: BLE001 - recorded; the other comparisons still run
        ctx.row("correctness", key, "ERROR", note=f"{type(error).__name__}: {error}"[:160])
        return {"error": f"{type(error).__name__}: {error}"}
    divergence = first_divergence(expected["tokens"], got["tokens"])
    verdict = "identical" if divergence is None else "DIVERGES"
    note = f"backend {got['backend']}"
    if graphs:
        note += f", graphs: {got['graphs']['status']}"
    if got.get("replayed_graph") is not None:
        note += f", decode replays a graph: {got['replayed_graph']}"
    if divergence is not None:
        note += f"; first at {divergence}" + (
            " (bf16: may diverge)" if dtype_name == "bf16" else ""
        )
    ctx.row("correctness", key, verdict, note=note)
    return {**got, "identical": divergence is None, "first_divergence": divergence}


def greedy(
    model: DecoderForCausalLM,
    prompts: list[list[int]],
    plan: Plan,
    device: torch.device,
    backend: str,
    graphs: bool,
) -> dict[str, Any]:
    """Greedy tokens of `prompts` batched: one prefill step, then decode steps of all."""
    tokens_per_seq = max(map(len, prompts)) + plan.num_new_tokens
    sizes = (1, 2, 4) if graphs else ()  # 3 prompts: the padded bucket 4
    bench = open_bench(model, plan, len(prompts), tokens_per_seq, sizes, backend, device)
    runner = bench.graphs if graphs else bench.eager
    if runner is None:
        bench.close()
        raise RuntimeError(bench.graph_info["status"])
    try:
        return generate(runner, prompts, plan, bench)
    finally:
        bench.close()


def generate(runner: Any, prompts: list[list[int]], plan: Plan, bench: Bench) -> dict[str, Any]:
    tables = block_tables(len(prompts), bench.blocks_per_seq)
    step = SchedulerOutput(
        0, [prefill_sequence(i, p, tables[i], plan.block_size) for i, p in enumerate(prompts)]
    )
    outputs: list[list[int]] = [[] for _ in prompts]
    replayed = None
    for step_id in range(plan.num_new_tokens):
        sampled = runner.execute(step).sampled_token_ids
        for i in range(len(prompts)):
            outputs[i].append(sampled[f"r{i}"])
        contexts = [len(p) + len(o) - 1 for p, o in zip(prompts, outputs)]
        step = decode_step(step_id + 1, [o[-1] for o in outputs], contexts, tables, plan.block_size)
        replayed = replays_graph(runner, step) if replayed is None else replayed
    return {
        "tokens": outputs,
        "backend": backend_name(runner),
        "graphs": bench.graph_info,
        "replayed_graph": replayed,
    }


def first_divergence(expected: list[list[int]], got: list[list[int]]) -> dict[str, int] | None:
    for prompt, (want, have) in enumerate(zip(expected, got)):
        for step, (a, b) in enumerate(zip(want, have)):
            if a != b:
                return {"prompt": prompt, "step": step, "expected": a, "got": b}
    return None


def section_decode(ctx: Context, name: str, model_name: str) -> dict[str, Any]:
    plan = ctx.plan
    model = ctx.model(model_name)
    costs = ModelCosts.of(model)
    batches, context = plan.decode_batches, plan.decode_context
    tokens_per_seq = context + plan.warmup + plan.iters + 1
    bench = open_bench(model, plan, max(batches), tokens_per_seq, batches)
    try:
        tables = block_tables(max(batches), bench.blocks_per_seq)
        prefill_contexts(bench.eager, plan, tables, model.config.vocab_size)
        ctx.row(name, "backend / graphs", backend_name(bench.eager), note=graph_note(bench))
        results = decode_results(ctx, name, bench, tables, costs)
    finally:
        bench.close()
    results.update(
        graphs=bench.graph_info,
        weight_bytes=costs.weight_bytes,
        context=context,
        backend=backend_name(bench.eager),
        peaks=vars(ctx.peaks),
    )
    return results


def graph_note(bench: Bench) -> str:
    info = bench.graph_info
    if info["status"] != "captured":
        return info["status"]
    memory_mib = info.get("graph_memory_bytes", 0) / 2**20
    return f"{info['num_graphs']} graphs captured in {info.get('capture_s', 0):.1f} s, {memory_mib:.0f} MiB"


def prefill_contexts(runner: Any, plan: Plan, tables: list[list[int]], vocab_size: int) -> None:
    prompts = random_prompts([plan.decode_context] * len(tables), vocab_size, seed=1)
    for step in prefill_chunks(prompts, tables, plan.block_size, plan.prefill_step_tokens):
        runner.execute(step)
    sync(plan.device)


def decode_results(
    ctx: Context, name: str, bench: Bench, tables: list[list[int]], costs: ModelCosts
) -> dict[str, Any]:
    plan, peaks = ctx.plan, ctx.peaks
    batch1_roofline_ms = costs.weight_bytes / (peaks.copy_gb_s * GB) * 1e3
    results: dict[str, Any] = {"batch1_roofline_ms": batch1_roofline_ms, "batches": {}}
    weights_gb = costs.weight_bytes / GB
    ctx.row(
        name,
        "roofline b=1: weights / BW",
        batch1_roofline_ms,
        "ms",
        note=f"{weights_gb:.3g} GB read per step",
    )
    for batch in plan.decode_batches:
        if ctx.budget.left() < 0:
            results["batches"][batch] = "skipped (budget)"
            continue
        roofline_ms = decode_roofline_ms(costs, peaks, batch, plan.decode_context)
        per_mode = {}
        for mode, runner in bench.runners().items():
            step_s = time_decode(runner, plan, tables[:batch])
            per_mode[mode] = {
                "step_ms": step_s * 1e3,
                "tokens_per_s": batch / step_s,
                "ratio_to_roofline": step_s * 1e3 / roofline_ms,
            }
            note = f"{batch / step_s:.0f} tok/s"
            if mode == "graphs":
                note += (
                    f", replays a graph: {replays_graph(runner, probe_step(plan, tables[:batch]))}"
                )
            ctx.row(name, f"decode b={batch} {mode}", step_s * 1e3, "ms", roofline_ms, note)
        results["batches"][batch] = {"roofline_ms": roofline_ms, **per_mode}
    record_scaling(ctx, name, results)
    return results


def decode_roofline_ms(costs: ModelCosts, peaks: Peaks, batch: int, context: int) -> float:
    """max(bytes read / copy bandwidth, flops / matmul rate) of one decode step."""
    read_bytes = costs.weight_bytes + batch * context * costs.kv_bytes_per_token
    memory_s = read_bytes / (peaks.copy_gb_s * GB)
    compute_s = costs.decode_flops(batch, context) / (peaks.matmul_tflop_s * 1e12)
    return max(memory_s, compute_s) * 1e3


def probe_step(plan: Plan, tables: list[list[int]]) -> SchedulerOutput:
    return decode_step(
        0, [1] * len(tables), [plan.decode_context] * len(tables), tables, plan.block_size
    )


def time_decode(runner: Any, plan: Plan, tables: list[list[int]]) -> float:
    """Median seconds of a decode step of len(tables) sequences at context ~decode_context."""
    batch = len(tables)

    def step(i: int) -> None:
        contexts = [plan.decode_context + i] * batch
        runner.execute(decode_step(i, [1] * batch, contexts, tables, plan.block_size))

    return time_steps(step, plan.device, plan.warmup, plan.iters)


def record_scaling(ctx: Context, name: str, results: dict[str, Any]) -> None:
    """Throughput of the largest batch over batch 1's, per mode."""
    batches = [b for b, r in results["batches"].items() if isinstance(r, dict)]
    if len(batches) < 2:
        return
    first, last = results["batches"][min(batches)], results["batches"][max(batches)]
    for mode in ("eager", "graphs"):
        if mode in first and mode in last:
            scaling = last[mode]["tokens_per_s"] / first[mode]["tokens_per_s"]
            results[f"throughput_b{max(batches)}_over_b{min(batches)}_{mode}"] = scaling
            ctx.row(
                name,
                f"tok/s b={max(batches)} / b={min(batches)} {mode}",
                scaling,
                "x",
                note="batch-size scaling of throughput",
            )


def section_prefill(ctx: Context, name: str, model_name: str) -> dict[str, Any]:
    plan, peaks = ctx.plan, ctx.peaks
    model = ctx.model(model_name)
    costs = ModelCosts.of(model)
    bench = open_bench(model, plan, 1, max(plan.prefill_lengths))
    results: dict[str, Any] = {
        "lengths": {},
        "backend": backend_name(bench.eager),
        "peaks": vars(peaks),
    }
    try:
        for length in plan.prefill_lengths:
            if ctx.budget.left() < 0:
                results["lengths"][length] = "skipped (budget)"
                continue
            results["lengths"][length] = prefill_result(ctx, name, bench, costs, length)
    finally:
        bench.close()
    return results


def prefill_result(
    ctx: Context, name: str, bench: Bench, costs: ModelCosts, length: int
) -> dict[str, Any]:
    plan, peaks = ctx.plan, ctx.peaks
    prompt = random_prompts([length], bench.eager.model.config.vocab_size, seed=2)[0]
    table = block_tables(1, bench.blocks_per_seq)[0]
    step = SchedulerOutput(0, [prefill_sequence(0, prompt, table, plan.block_size)])
    iters = max(3, plan.iters // 4)
    step_s = time_steps(lambda i: bench.eager.execute(step), plan.device, 2, iters)
    linear_flops, attention_flops = costs.prefill_flops(length)
    linear_tflop_s = linear_flops / step_s / 1e12
    total_tflop_s = (linear_flops + attention_flops) / step_s / 1e12
    ctx.row(
        name,
        f"prefill {length} tok",
        linear_tflop_s,
        "TFLOP/s",
        peaks.matmul_tflop_s,
        f"{length / step_s:.0f} tok/s, {step_s * 1e3:.1f} ms, with attention {total_tflop_s:.3g}",
    )
    return {
        "step_ms": step_s * 1e3,
        "tokens_per_s": length / step_s,
        "linear_tflop_s": linear_tflop_s,
        "with_attention_tflop_s": total_tflop_s,
        "share_of_matmul": linear_tflop_s / peaks.matmul_tflop_s,
    }


def section_pipeline(ctx: Context) -> dict[str, Any]:
    plan = ctx.plan
    model = ctx.model("small")
    batch = plan.pipeline_batch
    tokens_per_seq = plan.decode_context + 2 * (plan.warmup + plan.iters) + 1
    sizes = (batch,)
    bench = open_bench(model, plan, batch, tokens_per_seq, sizes)
    try:
        tables = block_tables(batch, bench.blocks_per_seq)
        prefill_contexts(bench.eager, plan, tables, model.config.vocab_size)
        results = {
            mode: pipeline_times(ctx, runner, tables, mode)
            for mode, runner in bench.runners().items()
        }
    finally:
        bench.close()
    return {**results, "batch": batch, "graphs": bench.graph_info}


def pipeline_times(
    ctx: Context, runner: Any, tables: list[list[int]], mode: str
) -> dict[str, float]:
    plan, batch = ctx.plan, len(tables)
    steps = plan.warmup + plan.iters

    def build(i: int) -> SchedulerOutput:
        contexts = [plan.decode_context + i] * batch
        return decode_step(i, [1] * batch, contexts, tables, plan.block_size)

    build_s = time_steps(build, torch.device("cpu"), 0, plan.iters)
    sequential_s = time_steps(
        lambda i: runner.execute(build(i)), plan.device, plan.warmup, plan.iters
    )
    pipelined_s = time_pipelined(runner, build, steps, plan.device)
    ideal_s = max(sequential_s - build_s, build_s)
    ctx.row(
        "pipeline",
        f"b={batch} {mode} execute",
        sequential_s * 1e3,
        "ms",
        note=f"build the next step: {build_s * 1e6:.0f} us",
    )
    ctx.row(
        "pipeline",
        f"b={batch} {mode} launch+build",
        pipelined_s * 1e3,
        "ms",
        ideal_s * 1e3,
        "bound: execute minus the build, fully overlapped",
    )
    return {
        "execute_ms": sequential_s * 1e3,
        "launch_overlapped_ms": pipelined_s * 1e3,
        "build_ms": build_s * 1e3,
        "ideal_ms": ideal_s * 1e3,
    }


def time_pipelined(
    runner: Any, build: Callable[[int], SchedulerOutput], steps: int, device: torch.device
) -> float:
    """Mean seconds per step when step i+1 is built while step i runs (after one warm step)."""
    runner.launch(build(0)).result()
    sync(device)
    start = time.perf_counter()
    future = runner.launch(build(1))
    for i in range(2, steps + 1):
        next_step = build(i)
        future.result()
        future = runner.launch(next_step)
    future.result()
    sync(device)
    return (time.perf_counter() - start) / steps


# Llama-3-8B's projections (in, out features), q/k/v and gate/up fused as the model holds them
QUANT_SHAPES = (("qkv", 4096, 6144), ("gate_up", 4096, 28672), ("down", 14336, 4096))
QUANT_ROWS = (1, 16, 64)


def section_quant(ctx: Context) -> dict[str, Any]:
    """The quantized checkpoints' CUDA layers against a bf16 linear of the same shape:
    AWQ/GPTQ's int4 (tinygemm, `CudaInt4Linear`) and FP8 (`Fp8Linear`, torch._scaled_mm with
    dynamic per-row activation scales), one call each at 1-64 rows, against the weight bytes
    read at the measured copy bandwidth. --smoke: a tiny shape on the CPU, FP8 only."""
    from superinfer.model.cuda_int4 import CudaInt4Linear, cuda_int4_available
    from superinfer.model.fp8_linear import FP8, Fp8Linear

    plan, device = ctx.plan, ctx.plan.device
    shapes = QUANT_SHAPES if not plan.smoke else (("tiny", 256, 512),)
    gen = torch.Generator(device="cpu").manual_seed(0)
    results: dict[str, Any] = {}
    for name, num_in, num_out in shapes:
        w = (torch.randn(num_out, num_in, generator=gen) * 0.02).to(torch.bfloat16).to(device)
        dense = torch.nn.Linear(num_in, num_out, bias=False, device=device, dtype=torch.bfloat16)
        dense.weight.data = w
        row_scales = w.float().abs().amax(1) / 448
        fp8 = Fp8Linear((w.float() / row_scales[:, None]).to(FP8), row_scales, None, None,
                        torch.bfloat16)  # fmt: skip
        layers: dict[str, tuple[torch.nn.Module, int]] = {
            "bf16": (dense, 2 * w.numel()),
            "fp8": (fp8, w.numel()),
        }
        if device.type == "cuda" and cuda_int4_available():
            nibbles = torch.randint(0, 16, (num_out, num_in), generator=gen, dtype=torch.uint8)
            scales = torch.full((num_out, num_in // 32), 0.01)
            zeros = torch.zeros(num_out, num_in // 32)
            int4 = CudaInt4Linear(nibbles.to(device), scales.to(device), zeros.to(device), None)
            layers["int4"] = (int4, w.numel() // 2 + 2 * 2 * scales.numel())
        for rows in QUANT_ROWS:
            x = torch.randn(rows, num_in, generator=gen).to(torch.bfloat16).to(device)
            with torch.inference_mode():
                for kind, (layer, num_bytes) in layers.items():
                    seconds = time_kernel(lambda: layer(x), device, plan.warmup, plan.iters)  # noqa: B023
                    bound_ms = num_bytes / (ctx.peaks.copy_gb_s * GB) * 1e3
                    results[f"{name} {kind} rows={rows}"] = seconds * 1e3
                    ctx.row("quant", f"{name} {num_in}x{num_out} {kind} rows={rows}",
                            seconds * 1e3, "ms", bound_ms, "bound: weight bytes / copy bandwidth")  # fmt: skip
    return results


CUDA_TESTS = (
    "tests/engine/test_cuda_graphs.py",
    "tests/model/test_triton_attention.py",
    "tests/engine/test_kv_cache.py",
    "tests/engine/test_transfer.py",
    "tests/model/test_cuda_quant.py",
)


def section_cuda_tests(ctx: Context, timeout_s: float = 120) -> dict[str, Any]:
    present = [path for path in CUDA_TESTS if (REPO / path).exists()]
    missing = [path for path in CUDA_TESTS if path not in present]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "not slow",
        *present,
    ]
    timeout_s = max(10.0, min(timeout_s, ctx.budget.left() + GRACE_S))
    try:
        done = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        output, returncode = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        output, returncode = (
            _text(error.stdout) + _text(error.stderr),
            f"timeout after {timeout_s:.0f} s",
        )
    counts = {
        kind: int(n)
        for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", output)
    }
    ctx.row(
        "cuda_tests",
        "pytest",
        f"rc {returncode}",
        note=", ".join(f"{n} {k}" for k, n in counts.items())
        + (f"; missing {missing}" if missing else ""),
    )
    return {
        "command": " ".join(command),
        "returncode": returncode,
        "counts": counts,
        "missing": missing,
        "tail": output[-3000:],
    }


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


# --- where a decode step's GPU time goes ---------------------------------------------------


PROFILE_STEPS = 5


def section_profile(ctx: Context) -> dict[str, Any]:
    """Kernel time per eager decode step by kernel (torch.profiler), for both shapes at the
    smallest and a middle batch: what separates a graphed step from its roofline."""
    plan = ctx.plan
    batches = (plan.decode_batches[0], plan.pipeline_batch)
    results: dict[str, Any] = {}
    for model_name, label in (("big", "8b"), ("small", "135m")):
        model = ctx.model(model_name)
        costs = ModelCosts.of(model)
        tokens_per_seq = plan.decode_context + 3 + PROFILE_STEPS + 1
        bench = open_bench(model, plan, max(batches), tokens_per_seq)
        try:
            tables = block_tables(max(batches), bench.blocks_per_seq)
            prefill_contexts(bench.eager, plan, tables, model.config.vocab_size)
            for batch in batches:
                roofline_ms = decode_roofline_ms(costs, ctx.peaks, batch, plan.decode_context)
                profile = profile_decode(bench.eager, plan, tables[:batch])
                results[f"{label}_b{batch}"] = {"roofline_ms": roofline_ms, **profile}
                top = ", ".join(
                    f"{k['name'][:36]} {k['ms_per_step']:.3g}" for k in profile["top"][:3]
                )
                ctx.row(
                    "profile",
                    f"{label} b={batch} kernel ms/step",
                    profile["busy_ms_per_step"],
                    "ms",
                    roofline_ms,
                    f"{profile['launches_per_step']:.0f} launches; {top}",
                )
        finally:
            bench.close()
    return results


def profile_decode(runner: Any, plan: Plan, tables: list[list[int]]) -> dict[str, Any]:
    """Kernels (CUDA) or ops (CPU) of PROFILE_STEPS eager decode steps, by self time."""
    from torch.profiler import ProfilerActivity, profile

    batch, on_cuda = len(tables), plan.device.type == "cuda"

    def step(i: int) -> None:
        contexts = [plan.decode_context + i] * batch
        runner.execute(decode_step(i, [1] * batch, contexts, tables, plan.block_size))

    for i in range(3):
        step(i)
    sync(plan.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as prof:
        for i in range(3, 3 + PROFILE_STEPS):
            step(i)
        sync(plan.device)
    kernels = []
    for event in prof.key_averages():
        if on_cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            self_us = getattr(event, "self_device_time_total", 0)
        else:
            self_us = event.self_cpu_time_total
        if self_us > 0:
            kernels.append((event.key, self_us / 1e3 / PROFILE_STEPS, event.count / PROFILE_STEPS))
    kernels.sort(key=lambda k: -k[1])
    return {
        "busy_ms_per_step": sum(k[1] for k in kernels),
        "launches_per_step": sum(k[2] for k in kernels),
        "top": [{"name": n, "ms_per_step": ms, "calls_per_step": c} for n, ms, c in kernels[:15]],
    }


# --- running sections -------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    name: str
    run: Callable[[Context], dict[str, Any]]
    models: tuple[str, ...] = ()  # cached models it uses (freed after the last user)


SECTIONS = (
    Section("env", section_env),
    Section("correctness", section_correctness),
    Section("decode_8b", lambda ctx: section_decode(ctx, "decode_8b", "big"), ("big",)),
    Section("prefill_8b", lambda ctx: section_prefill(ctx, "prefill_8b", "big"), ("big",)),
    Section("decode_135m", lambda ctx: section_decode(ctx, "decode_135m", "small"), ("small",)),
    Section("prefill_135m", lambda ctx: section_prefill(ctx, "prefill_135m", "small"), ("small",)),
    Section("pipeline", section_pipeline, ("small",)),
    Section("profile", section_profile, ("big", "small")),
    Section("quant", section_quant),
    Section("cuda_tests", section_cuda_tests),
)


class SectionTimeout(Exception):
    pass


@contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Interrupt a section still running after `seconds` (Python code only: a CUDA call
    that hangs is interrupted when it returns)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise SectionTimeout(f"interrupted after {seconds:.0f} s (budget + {GRACE_S} s grace)")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_section(ctx: Context, section: Section) -> None:
    say(f"[{ctx.budget.elapsed():6.1f} s] {section.name}")
    device = ctx.plan.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    record: dict[str, Any] = {"status": "ok"}
    try:
        with alarm(ctx.budget.left() + GRACE_S):
            record["results"] = section.run(ctx)
    except Exception as error:  # noqa: BLE001 - recorded, and the next section runs
        record.update(
            status="error",
            error=f"{type(error).__name__}: {error}",
            traceback=traceback.format_exc()[-4000:],
        )
        ctx.row(section.name, "ERROR", type(error).__name__, note=str(error)[:160])
    record["elapsed_s"] = time.perf_counter() - start
    if device.type == "cuda":
        record["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / GIB
    ctx.report.section(section.name, record)


def run_all(ctx: Context, sections: Sequence[Section]) -> None:
    for index, section in enumerate(sections):
        if ctx.budget.left() <= 0:
            say(f"[{ctx.budget.elapsed():6.1f} s] {section.name}: skipped (budget)")
            ctx.report.section(section.name, {"status": "skipped", "reason": "budget"})
            ctx.row(section.name, "skipped", "budget")
        else:
            run_section(ctx, section)
        free_unused_models(ctx, sections[index + 1 :])


def free_unused_models(ctx: Context, later: Sequence[Section]) -> None:
    needed = {name for section in later for name in section.models}
    for name in [name for name in ctx.models if name not in needed]:
        del ctx.models[name]
    gc.collect()
    if ctx.plan.device.type == "cuda":
        torch.cuda.empty_cache()


def chosen_sections(only: str | None, skip_tests: bool) -> list[Section]:
    names = [name.strip() for name in only.split(",")] if only else [s.name for s in SECTIONS]
    unknown = set(names) - {s.name for s in SECTIONS}
    if unknown:
        raise SystemExit(f"unknown sections {sorted(unknown)}; known: {[s.name for s in SECTIONS]}")
    return [s for s in SECTIONS if s.name in names and not (skip_tests and s.name == "cuda_tests")]


def default_out() -> Path:
    out_dir = os.environ.get("OUT")
    return Path(out_dir) / "gpu_check.json" if out_dir else Path("gpu_check.json")


def git_revision() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default $OUT/gpu_check.json)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="no section starts after this"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU, reference backend"
    )
    parser.add_argument(
        "--skip-tests", action="store_true", help="leave out the cuda_tests section"
    )
    parser.add_argument("--only", default=None, help="comma-separated sections to run")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="    %(levelname)s %(name)s: %(message)s")
    logging.getLogger("superinfer").setLevel(logging.INFO)
    plan = Plan.for_run(args.smoke)
    if plan.smoke:
        torch.set_num_threads(1)  # steady CPU timings, and room for whoever shares the machine
    if plan.device.type == "cuda" and not torch.cuda.is_available():
        say("no CUDA device: run with --smoke on a CPU")
        return 2
    out = args.out or default_out()
    meta = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": sys.argv[1:],
        "smoke": plan.smoke,
        "budget_s": args.budget_s,
        "git": git_revision(),
        "plan": {k: str(v) if isinstance(v, torch.device) else v for k, v in vars(plan).items()},
    }
    ctx = Context(plan, Report(out, meta), Budget(args.budget_s))
    say(
        f"gpu_check on {plan.device} (smoke={plan.smoke}), budget {args.budget_s:.0f} s, JSON -> {out}"
    )
    run_all(ctx, chosen_sections(args.only, args.skip_tests))
    ctx.report.data["meta"]["elapsed_s"] = ctx.budget.elapsed()
    ctx.report.save()
    print_table(ctx.report.rows)
    say(f"\ndone in {ctx.budget.elapsed():.0f} s; JSON: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
