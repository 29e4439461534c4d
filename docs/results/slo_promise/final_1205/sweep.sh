#!/usr/bin/env bash
# issue 14's final measurement at one commit (a trimmed benchmarks/slo_promise.sh: no ddps or
# shaped variant; uniform at 0.5x-5x of the 2 req/s knee)
set -euo pipefail
cd /work/main
OUT=docs/results/slo_promise/final_1205
MIX=gold=0.2,silver=0.3,bronze=0.5
export HF_HUB_OFFLINE=1
run() { .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 "$@"; }
refusal_cost() {
    for rate in ${2//,/ }; do
        .venv/bin/superinfer bench refusal-cost "$1/rotasched_rate$rate.json" \
            "$1/rotasched-no-admission_rate$rate.json" > "$1/refusal_cost_rate$rate.json"
    done
}
run --systems rotasched,vllm --refusal-replay --rates 1,2,3,4,6,10 --out "$OUT/uniform"
refusal_cost "$OUT/uniform" 1,2,3,4,6,10
run --systems rotasched,vllm --slo-classes "$MIX" --refusal-replay --rates 4,6 --out "$OUT/classes"
refusal_cost "$OUT/classes" 4,6
echo SWEEP DONE
