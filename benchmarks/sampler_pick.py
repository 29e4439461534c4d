"""What one `Sampler` call costs on the CPU, by rows and sampling parameters: the default
model's vocabulary (49,152), seeded random logits (randn x 3), medians of --repeats.

    .venv/bin/python benchmarks/sampler_pick.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from superinfer.core.outputs import ScheduledSequence
from superinfer.engine.sampler import Sampler
from superinfer.sampling_params import SamplingParams

VARIANTS = {
    "greedy": {"temperature": 0.0},
    "temperature 1": {"temperature": 1.0},
    "temperature 0.8, top_p 0.95": {"temperature": 0.8, "top_p": 0.95},
}


def sequence(request_id: str, params: SamplingParams) -> ScheduledSequence:
    return ScheduledSequence(
        request_id=request_id, token_ids=[1], num_context_tokens=3, block_table=[0],
        is_sampling=True, sampling_params=params, num_output_tokens=5,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8,32")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(2)
    sampler = Sampler(torch.device("cpu"))
    for num_rows in (int(r) for r in args.rows.split(",")):
        logits = torch.randn(num_rows, args.vocab, generator=torch.Generator().manual_seed(0)) * 3
        for name, params in VARIANTS.items():
            seqs = [sequence(str(i), SamplingParams(**params)) for i in range(num_rows)]
            sampler(logits.clone(), seqs)  # warm-up
            times = []
            for _ in range(args.repeats):
                batch = logits.clone()
                start = time.perf_counter()
                sampler(batch, seqs)
                times.append(time.perf_counter() - start)
            print(f"{num_rows:3d} rows  {name:28s} {statistics.median(times) * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
