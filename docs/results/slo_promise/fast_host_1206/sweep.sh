#!/usr/bin/env bash
# issue 14 at one commit on a fast afternoon: class mix at 2x/3x and uniform at 1x/1.5x, vLLM beside
set -euo pipefail
cd /work/main
OUT=${OUT:-/tmp/k14}  # the raw results (22 MB) are not committed; summary.json keeps each run's numbers
MIX=gold=0.2,silver=0.3,bronze=0.5
export HF_HUB_OFFLINE=1
run() { .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 "$@"; }
refusal_cost() {
    for rate in ${2//,/ }; do
        .venv/bin/superinfer bench refusal-cost "$1/rotasched_rate$rate.json" \
            "$1/rotasched-no-admission_rate$rate.json" > "$1/refusal_cost_rate$rate.json"
    done
}
run --systems rotasched,vllm --slo-classes "$MIX" --refusal-replay --rates 4,6 --out "$OUT/classes"
refusal_cost "$OUT/classes" 4,6
run --systems rotasched,vllm --refusal-replay --rates 2,3 --out "$OUT/uniform"
refusal_cost "$OUT/uniform" 2,3
echo SWEEP DONE
