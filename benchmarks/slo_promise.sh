#!/usr/bin/env bash
# Issue 14's measurement: does an admitted request keep its targets, and does gold keep its
# promise under overload? superinfer against vLLM's CPU build on the same machine, same
# weights, same device KV tokens, same requests (benchmarks/vs_vllm/run.py does the setup),
# one system after the other.
#
#   (b) the 20/30/50 gold/silver/bronze mix at 2x and 3x of vLLM's knee, vLLM with its
#       priority scheduler; superinfer rotasched (the default), with steps shaped by TBT
#       promises (--tbt-shaped-steps), and with admission off (the refusal-cost replay);
#       ddps beside it for the choice of the default policy (POLICY_RATES: edf too);
#   (a) every request TTFT 1 s / TPOT 200 ms at 1x and 2x the knee, with the replay.
#
# The knee: the rate past which vLLM's attainment falls below 90%; 2 req/s in the committed
# head-to-head (docs/results/vs_vllm/: ~98% at 2, 13% TTFT attainment at 3).
#
#   benchmarks/slo_promise.sh [OUT]     (default docs/results/slo_promise; about an hour:
#                                       overloaded points take 3-5 min each to drain)
#   CLASS_RATES=4 UNIFORM_RATES= benchmarks/slo_promise.sh    (~20 min)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/results/slo_promise}
DURATION=${DURATION:-60}
CLASS_RATES=${CLASS_RATES-4,6}  # 2x and 3x the knee
POLICY_RATES=${POLICY_RATES-}  # also edf on the class mix at these rates; empty: skip
UNIFORM_RATES=${UNIFORM_RATES-2,4}  # 1x and 2x; empty: skip (a)
MIX=gold=0.2,silver=0.3,bronze=0.5
export HF_HUB_OFFLINE=1
run() { .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration "$DURATION" "$@"; }
refusal_cost() {  # FOLDER RATES
    for rate in ${2//,/ }; do
        .venv/bin/superinfer bench refusal-cost "$1/rotasched_rate$rate.json" \
            "$1/rotasched-no-admission_rate$rate.json" > "$1/refusal_cost_rate$rate.json"
    done
}
run --systems rotasched,ddps,vllm --slo-classes "$MIX" --refusal-replay \
    --variant rotasched-shaped=--tbt-shaped-steps --rates "$CLASS_RATES" --out "$OUT/classes"
refusal_cost "$OUT/classes" "$CLASS_RATES"
if [[ -n $POLICY_RATES ]]; then
    run --systems edf --slo-classes "$MIX" --rates "$POLICY_RATES" --out "$OUT/policies"
fi
if [[ -n $UNIFORM_RATES ]]; then
    run --systems rotasched,vllm --refusal-replay --rates "$UNIFORM_RATES" --out "$OUT/uniform"
    refusal_cost "$OUT/uniform" "$UNIFORM_RATES"
fi
results=$(ls "$OUT"/*/*_rate*.json | grep -v refusal_cost)
.venv/bin/python benchmarks/slo_promise_breakdown.py $results > "$OUT/breakdown.json"
