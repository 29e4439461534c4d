"""Which kernel is fastest, by rows in a step: the default model's linear layers, int4
(`aten._weight_int4pack_mm_for_cpu` on the GGUF blocks), the few-row GEMV (`cpu_gemv`, up
to 8 rows, the same blocks; lm_head's Q8_0 too), the 4-bit GEMM (`cpu_q4`, the same
blocks; where it runs on AMX, also `q4-avx512`: its rows on AVX-512 as elsewhere) and a
dense bfloat16 copy (oneDNN, prepacked): what `--quantization auto` chooses between (the
4-bit GEMM takes the 4-bit layers, not lm_head's Q8_0); and, where it runs,
`w4a8`: `--quantization gguf-w4a8`'s GEMM on 8-bit activations (`cpu_w4a8`, the 4-bit
layers and lm_head's Q8_0 alike).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/int4_rows.py \\
        --out docs/results/models/int4_rows.json

A decode step streams every layer's weights from memory once, so one layer called again
and again (its weights in cache) would flatter both kernels: each measurement is a sweep
over all the layers, one projection kind at a time (q/k/v, o, gate/up, down), and lm_head
on its own (one matrix of 49152 x 576, larger than the caches). Rounds rotate the order of
the kernels; medians over the rounds. Prints, per row count, the time of each kind summed
over the layers and which kernel is fastest, and where `auto` switches.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path

import torch

from superinfer.model.cpu_gemv import MAX_ROWS as GEMV_MAX_ROWS
from superinfer.model.cpu_gemv import gemv_kernel
from superinfer.model.cpu_linear import pack_linears
from superinfer.model.cpu_q4 import Q4Kernel, Q4Weights, q4_kernel
from superinfer.model.cpu_w4a8 import w4a8_kernel
from superinfer.model.loader import AUTO_MAX_INT4_ROWS, default_model_path, load_gguf_model
from superinfer.model.quant import AMX_GEMV_MAX_ROWS, LM_HEAD_MAX_INT4_ROWS, Int4Linear

KINDS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def sweep_ms(layers: list, num_in: int, num_rows: int) -> float:
    """One call on every layer of `layers`, in order; the wall time in ms."""
    x = torch.randn(num_rows, num_in, dtype=torch.bfloat16)
    start = time.perf_counter()
    for layer in layers:
        layer(x)
    return (time.perf_counter() - start) * 1e3


def on_avx512(kernel: Q4Kernel, weights: Q4Weights, x: torch.Tensor) -> torch.Tensor:
    """`weights(x)` with the 4-bit GEMM's rows on AVX-512, not AMX."""
    kernel.use_amx(False)
    try:
        return weights(x)
    finally:
        kernel.use_amx(True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1,2,4,6,8,10,12,16,32,64")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(2)
    cpu, path = torch.device("cpu"), default_model_path()
    models = {"int4": load_gguf_model(path, torch.bfloat16, cpu, "gguf")[0],
              "dense": load_gguf_model(path, torch.bfloat16, cpu, "none")[0],
              "q4": load_gguf_model(path, torch.bfloat16, cpu, "auto")[0]}  # fmt: skip
    if w4a8_kernel() is not None:  # 8-bit activations: lm_head (Q8_0) runs on it too
        models["w4a8"] = load_gguf_model(path, torch.bfloat16, cpu, "gguf-w4a8")[0]
    pack_linears(models["dense"])
    groups = {kernel: {kind: [layer.get_submodule(kind) for layer in model.model.layers]
                       for kind in KINDS} | {"lm_head": [model.lm_head]}
              for kernel, model in models.items()}  # fmt: skip
    assert all(isinstance(m, Int4Linear) and m.dense is None for m in groups["int4"]["lm_head"])
    if gemv_kernel() is not None:  # auto's steps of up to GEMV_MAX_ROWS rows
        groups["gemv"] = {kind: [functools.partial(m.gemv, weights=m.gemv_weights)
                                 for m in layers]
                          for kind, layers in groups["q4"].items()}  # fmt: skip
    for kernel in ("q4", "w4a8") if "w4a8" in groups else ("q4",):
        groups[kernel] = {kind: [m.q4 for m in layers] for kind, layers in groups[kernel].items()
                          if all(isinstance(m, Int4Linear) and m.q4 for m in layers)}  # fmt: skip
    q4 = q4_kernel()
    if q4 is not None and q4.use_amx():  # the same GEMM with its rows on AVX-512
        groups["q4-avx512"] = {kind: [functools.partial(on_avx512, q4, w) for w in layers]
                               for kind, layers in groups["q4"].items()}  # fmt: skip
    kernels = tuple(groups)
    results = []
    with torch.inference_mode():
        for num_rows in (int(r) for r in args.rows.split(",")):
            row: dict = {"rows": num_rows}
            for kind in (*KINDS, "lm_head"):
                present = [k for k in kernels if kind in groups[k]
                           and (k != "gemv" or num_rows <= GEMV_MAX_ROWS)]  # fmt: skip
                num_in = groups["int4"][kind][0].in_features
                times: dict[str, list[float]] = {k: [] for k in present}
                for i in range(args.rounds + 1):
                    shift = i % len(present)
                    for kernel in present[shift:] + present[:shift]:
                        ms = sweep_ms(groups[kernel][kind], num_in, num_rows)
                        if i:  # the first round warms oneDNN's primitives up
                            times[kernel].append(ms)
                row[kind] = {k: round(statistics.median(v), 3) for k, v in times.items()}
            sums = {k: round(sum(row[kind][k] for kind in KINDS), 3) for k in kernels
                    if all(k in row[kind] for kind in KINDS)}  # fmt: skip
            row["layers"] = sums
            results.append(row)
            fastest = min(sums, key=sums.get)
            layers = ", ".join(f"{k} {v:7.2f} ms" for k, v in sums.items())
            head = ", ".join(f"{k} {v:6.2f} ms" for k, v in row["lm_head"].items())
            print(
                f"{num_rows:4d} rows   layers: {layers} ({fastest})   lm_head: {head}", flush=True
            )
    gemv_rows = AMX_GEMV_MAX_ROWS if q4 is not None and q4.use_amx() else AUTO_MAX_INT4_ROWS
    print(
        f"auto: the GEMV (int4 where it cannot run; lm_head then up to {LM_HEAD_MAX_INT4_ROWS})"
        f" up to {gemv_rows} rows, then the 4-bit GEMM (a dense copy where it cannot run)"
    )
    if args.out:
        out = {"command": "benchmarks/int4_rows.py " + " ".join(
                   f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
               "threads": torch.get_num_threads(), "torch": torch.__version__,
               "auto_max_int4_rows": gemv_rows, "amx": gemv_rows == AMX_GEMV_MAX_ROWS,
               "lm_head_max_int4_rows": LM_HEAD_MAX_INT4_ROWS, "results": results}  # fmt: skip
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
