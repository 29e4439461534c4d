"""Overloaded run on the real engine: every policy on the same requests, same run.

ShareGPT prompts (raw first human turn; output length = the first reply's token length,
capped, generated with ignore_eos) arrive by a Poisson process into an engine whose device
KV pool is capped so that not all of them fit at once. Each policy replays the same arrival
sequence in real time; SLO attainment, goodput and throughput come from the project's one
metrics module. `rotasched` also runs with the step pipeline off, for the step-time
comparison.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/policies_overload.py --help
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from superinfer import LLM, SamplingParams  # noqa: E402
from superinfer.sim.calibrate import StepTimer  # noqa: E402
from superinfer.sim.fitted import SAMPLE_COLUMNS, StepSample, sample_row  # noqa: E402
from superinfer.slo import SLOTargets  # noqa: E402
from superinfer.slo.metrics import (  # noqa: E402
    RequestRecord,
    attainment,
    percentile,
    run_duration_s,
    slo_report,
)
from superinfer.workload.datasets import sample_sharegpt  # noqa: E402

SYSTEMS = ["fcfs-recompute", "fcfs-swap", "priority", "edf", "ddps", "rotasched",
           "rotasched/no-pipeline"]  # fmt: skip


@dataclass
class Arrival:
    at_s: float
    prompt_token_ids: list[int]
    num_output_tokens: int


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="policies (name/pipeline, name/no-pipeline: force the step pipeline on or off; plain name: the engine's default, off on a CPU)",
    )
    p.add_argument("--num-prompts", type=int, default=60)
    p.add_argument("--request-rate", type=float, default=3.0, help="Poisson arrivals per second")
    p.add_argument("--max-prompt-tokens", type=int, default=384)
    p.add_argument("--max-output-tokens", type=int, default=96)
    p.add_argument("--num-device-blocks", type=int, default=64, help="capped device KV pool")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    p.add_argument("--tbt-slo-ms", type=float, default=250.0)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", help="write results (with per-request records) as JSON")
    return p.parse_args()


def make_arrivals(args: argparse.Namespace, tokenizer) -> tuple[list[Arrival], int]:
    requests, num_dropped = sample_sharegpt(
        tokenizer, args.num_prompts, seed=args.seed, max_prompt_tokens=args.max_prompt_tokens
    )
    rng = random.Random(args.seed)
    t, arrivals = 0.0, []
    for r in requests:
        t += rng.expovariate(args.request_rate)
        ids = tokenizer(r.prompt)["input_ids"]
        arrivals.append(Arrival(t, ids, min(r.num_output_tokens, args.max_output_tokens)))
    return arrivals, num_dropped


def replay(
    llm: LLM, arrivals: list[Arrival], slo: SLOTargets
) -> tuple[list[RequestRecord], list[float], list[StepSample]]:
    """Feed `arrivals` in real time; returns per-request records, step times and each
    step's batch shape with its forward and host seconds (the simulator's predictor
    inputs, to check it on the steps served)."""
    engine = llm.engine
    timer = StepTimer(engine)
    start = engine.clock()
    pending, records, step_times = list(arrivals), [], []
    while pending or engine.has_unfinished_requests():
        now = engine.clock() - start
        while pending and pending[0].at_s <= now:
            a = pending.pop(0)
            params = SamplingParams(max_tokens=a.num_output_tokens, temperature=0, ignore_eos=True)
            engine.add_request({"prompt_token_ids": a.prompt_token_ids}, params,
                               arrival_time=start + a.at_s, slo=slo)  # fmt: skip
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, pending[0].at_s - (engine.clock() - start)))
            continue
        t0 = time.perf_counter()
        outputs = timer.step()
        step_times.append(time.perf_counter() - t0)
        records += [to_record(o) for o in outputs if o.finished]
    return records, step_times, timer.samples


def to_record(output) -> RequestRecord:
    m = output.metrics
    return RequestRecord(
        request_id=output.request_id, targets=m.slo, arrival_time=m.arrival_time,
        token_times=m.token_times, finished_time=m.finished_time,
        first_scheduled_time=m.first_scheduled_time, num_prompt_tokens=len(output.prompt_token_ids),
        finish_reason=output.outputs[0].finish_reason, num_preemptions=m.num_preemptions,
        num_rotations=m.num_swap_outs,
    )  # fmt: skip


def run_system(name: str, args: argparse.Namespace, arrivals: list[Arrival]) -> dict:
    policy, _, variant = name.partition("/")
    llm = LLM(dtype=args.dtype, device="cpu", policy=policy,
              pipeline={"": None, "pipeline": True, "no-pipeline": False}[variant],
              num_device_blocks=args.num_device_blocks, block_size=args.block_size,
              max_num_seqs=64, max_num_batched_tokens=512, max_model_len=1024)  # fmt: skip
    try:
        llm.generate(["warm up"] * 2, SamplingParams(max_tokens=4))
        slo = SLOTargets(ttft_ms=args.ttft_slo_ms, tbt_ms=args.tbt_slo_ms)
        records, step_times, step_samples = replay(llm, arrivals, slo)
        stats = llm.engine.scheduler.stats
        transfers = llm.engine.transfer.stats
    finally:
        llm.engine.close()
    reports = [slo_report(r) for r in records]
    duration = run_duration_s(records)
    att = attainment(reports, duration)
    ttfts = sorted(r.ttft_ms for r in reports if r.ttft_ms is not None)
    tpots = sorted(r.tpot_ms for r in reports if r.tpot_ms is not None)
    return {
        "system": name, "ttft_attainment": att.ttft, "tpot_attainment": att.tpot,
        "tbt_token_attainment": att.tbt_token, "goodput_rps": att.goodput_rps,
        "output_throughput": sum(r.num_tokens_out for r in records) / duration,
        "duration_s": duration, "p50_ttft_ms": statistics.median(ttfts),
        "p90_ttft_ms": percentile(ttfts, 90), "mean_tpot_ms": statistics.fmean(tpots),
        "mean_step_ms": 1000 * statistics.fmean(step_times), "num_steps": len(step_times),
        "preemptions": stats.num_preemptions, "swap_outs": stats.num_swap_outs,
        "proactive_rotations": stats.num_proactive_rotations,
        "kv_gb_d2h": transfers.d2h.num_bytes / 1e9, "kv_gb_h2d": transfers.h2d.num_bytes / 1e9,
        "records": [r.__dict__ | {"targets": r.targets.__dict__} for r in records],
        "step_columns": [*SAMPLE_COLUMNS, "forward_s", "host_s"],
        "steps": [sample_row(s) for s in step_samples],
    }  # fmt: skip


def main() -> None:
    args = parse_args()
    probe = LLM(dtype=args.dtype, device="cpu", num_device_blocks=64, max_model_len=1024)
    arrivals, num_dropped = make_arrivals(args, probe.get_tokenizer())
    probe.engine.close()
    del probe
    results = [run_system(name, args, arrivals) for name in args.systems.split(",")]
    print(
        f"\n{len(arrivals)} ShareGPT requests ({num_dropped} pairs dropped), Poisson "
        f"{args.request_rate}/s, {sum(len(a.prompt_token_ids) for a in arrivals)} prompt + "
        f"{sum(a.num_output_tokens for a in arrivals)} output tokens; device pool "
        f"{args.num_device_blocks} blocks x {args.block_size} tokens; targets TTFT "
        f"{args.ttft_slo_ms:.0f} ms, TPOT {args.tbt_slo_ms:.0f} ms; {args.dtype}"
    )
    head = ("system", "TTFT att", "TPOT att", "goodput", "out tok/s", "p50 TTFT", "mean TPOT",
            "step ms", "preempt", "swaps", "GB d2h/h2d")  # fmt: skip
    print("".join(f"{h:>13}" for h in head))
    for r in results:
        print(f"{r['system']:>13}{r['ttft_attainment']:>13.2f}{r['tpot_attainment']:>13.2f}"
              f"{r['goodput_rps']:>13.2f}{r['output_throughput']:>13.1f}{r['p50_ttft_ms']:>13.0f}"
              f"{r['mean_tpot_ms']:>13.1f}{r['mean_step_ms']:>13.1f}{r['preemptions']:>13}"
              f"{r['swap_outs']:>13}{r['kv_gb_d2h']:>7.2f}/{r['kv_gb_h2d']:.2f}")  # fmt: skip
    if args.output:
        with open(args.output, "w") as f:
            json.dump(
                {"args": vars(args), "num_dropped": num_dropped, "results": results}, f, indent=1
            )


if __name__ == "__main__":
    main()
