"""Measure the roofline predictor's efficiency factors and the host-link model on a GPU.

Plain PyTorch (no superinfer import needed on the GPU machine), bf16, Llama-3-8B shapes:

- linear layers: all 32 layers' q/k/v/o and gated-MLP matmuls for T tokens (T = 1..16384),
  timed with CUDA events: achieved TFLOP/s and weight GB/s, against the roofline's
  max(FLOPs / peak, weight bytes / bandwidth);
- attention: causal prefill (SDPA) for one prompt of L tokens, and decode (one query per
  sequence) over B sequences of C cached tokens: achieved TFLOP/s and KV GB/s;
- host link: pinned host <-> device copies of one 200 MiB run, of 2 MiB blocks one by one
  (block-first layout), and of 32 KiB pieces one by one (per-layer layout), each direction
  alone and both at once on two streams: GB/s, per-copy overhead, duplex overlap.

    python3 benchmarks/sim_gpu_roofline.py --output roofline_h200.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 4096, 14336, 32, 8, 128, 32
MIB = 1 << 20


def timed(fn, repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of `fn` over `repeats` runs, with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return sorted(times)[len(times) // 2]


def linear_layers(device: torch.device, token_counts: list[int]) -> list[dict]:
    qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    layers = [
        (torch.randn(HIDDEN, qkv_out, device=device, dtype=torch.bfloat16) * 0.02,
         torch.randn(HEADS * HEAD_DIM, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02,
         torch.randn(HIDDEN, 2 * INTER, device=device, dtype=torch.bfloat16) * 0.02,
         torch.randn(INTER, HIDDEN, device=device, dtype=torch.bfloat16) * 0.02)
        for _ in range(LAYERS)
    ]  # fmt: skip
    weight_bytes = sum(w.numel() * 2 for layer in layers for w in layer)
    flops_per_token = 2 * weight_bytes / 2
    rows = []
    for num_tokens in token_counts:
        x = torch.randn(num_tokens, HIDDEN, device=device, dtype=torch.bfloat16)

        def run(x=x):
            for w_qkv, w_o, w_gate_up, w_down in layers:
                h = (x @ w_qkv)[:, : HEADS * HEAD_DIM] @ w_o
                g = h @ w_gate_up
                (F.silu(g[:, :INTER]) * g[:, INTER:]) @ w_down

        seconds = timed(run)
        rows.append({"tokens": num_tokens, "seconds": seconds,
                     "tflops": num_tokens * flops_per_token / seconds / 1e12,
                     "weight_gbps": weight_bytes / seconds / 1e9})  # fmt: skip
        print("linear", rows[-1], flush=True)
    return rows


def attention(device: torch.device) -> dict:
    prefill, decode = [], []
    for length in (512, 2048, 8192):
        q = torch.randn(1, HEADS, length, HEAD_DIM, device=device, dtype=torch.bfloat16)
        k = torch.randn(1, KV_HEADS, length, HEAD_DIM, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seconds = timed(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True
            )
        )
        flops = 4 * HEADS * HEAD_DIM * length * (length + 1) / 2
        prefill.append(
            {"length": length, "seconds_per_layer": seconds, "tflops": flops / seconds / 1e12}
        )
        print("prefill attention", prefill[-1], flush=True)
    for batch, context in ((64, 1024), (256, 512), (32, 4096)):
        q = torch.randn(batch, HEADS, 1, HEAD_DIM, device=device, dtype=torch.bfloat16)
        k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        seconds = timed(
            lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        )
        kv_bytes = 2 * k.numel() * 2
        decode.append({"batch": batch, "context": context, "seconds_per_layer": seconds,
                       "kv_gbps": kv_bytes / seconds / 1e9})  # fmt: skip
        print("decode attention", decode[-1], flush=True)
    return {"prefill": prefill, "decode": decode}


def hbm_copy(device: torch.device) -> float:
    a = torch.empty(2 * 1024 * MIB, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    seconds = timed(lambda: b.copy_(a))
    return 2 * a.numel() / seconds / 1e9  # read + write


def host_link(device: torch.device, total_mib: int = 200) -> dict:
    num_bytes = total_mib * MIB
    host_out = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    host_in = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
    dev_out = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    dev_in = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    streams = (torch.cuda.Stream(), torch.cuda.Stream())

    def copies(dst, src, chunk, stream):
        with torch.cuda.stream(stream):
            for start in range(0, num_bytes, chunk):
                dst[start : start + chunk].copy_(src[start : start + chunk], non_blocking=True)

    def wall(fn) -> float:
        fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        return best

    rows = {}
    for name, chunk in (
        ("one_run", num_bytes),
        ("block_2MiB", 2 * MIB),
        ("piece_32KiB", 32 * 1024),
    ):
        d2h = wall(lambda c=chunk: copies(host_out, dev_out, c, streams[0]))
        h2d = wall(lambda c=chunk: copies(dev_in, host_in, c, streams[1]))
        both = wall(lambda c=chunk: (copies(host_out, dev_out, c, streams[0]),
                                     copies(dev_in, host_in, c, streams[1])))  # fmt: skip
        rows[name] = {"chunk_bytes": chunk, "num_copies": num_bytes // chunk,
                      "d2h_gbps": num_bytes / d2h / 1e9, "h2d_gbps": num_bytes / h2d / 1e9,
                      "both_gbps_total": 2 * num_bytes / both / 1e9}  # fmt: skip
        print("link", name, rows[name], flush=True)
    one = rows["one_run"]
    for name in ("block_2MiB", "piece_32KiB"):
        row = rows[name]
        extra = num_bytes / (row["d2h_gbps"] * 1e9) - num_bytes / (one["d2h_gbps"] * 1e9)
        row["d2h_overhead_s_per_copy"] = max(0.0, extra / row["num_copies"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", default="roofline_gpu.json")
    parser.add_argument("--quick", action="store_true", help="fewer token counts")
    args = parser.parse_args()
    device = torch.device("cuda")
    counts = (
        [1, 64, 512, 4096]
        if args.quick
        else [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    )
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "hbm_copy_gbps": hbm_copy(device)}  # fmt: skip
    print("hbm", result["hbm_copy_gbps"], flush=True)
    result["host_link"] = host_link(device)
    result["attention"] = attention(device)
    result["linear"] = linear_layers(device, counts)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
