#!/bin/bash
# Issue 14's class runs at GH200 scale, in the simulator (deterministic; docs/simulator.md):
# Llama-3-8B on a GH200-144, ShareGPT first turns, 60 s of Poisson arrivals, seed 0.
#   1. the knee: vLLM v1's rule (fcfs-recompute, no admission, no guards), every request at
#      TTFT 1 s / TPOT 200 ms, at rising rates: the rate where attainment falls below 90%;
#   2. the 20/30/50 gold/silver/bronze mix on the default classes at 2x and 3x that rate:
#      superinfer's defaults (rotasched, admission, guards) against vLLM's priority
#      scheduler (priority = class rank, no admission, no guards).
#   KNEE_RATES="20 30 40 50 60 65 70 80 90 100 120" CLASS_RATES="120 180" bash run.sh [OUT]
#   (with the virtualenv active);
#   results in OUT (default /tmp/gh200_classes); then
#   python summarize.py OUT
set -u
OUT=${1:-/tmp/gh200_classes}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1
SIM=(superinfer simulate --hardware gh200 --model llama-3-8b --dataset sharegpt --duration 60
     --seed 0 --records none)
VLLM=(--no-admission --no-first-token-guard --no-tbt-guard)
for rate in ${KNEE_RATES:-20 30 40 50 60 80}; do
  "${SIM[@]}" "${VLLM[@]}" --policy fcfs-recompute --ttft-slo-ms 1000 --tbt-slo-ms 200 \
    --request-rate "$rate" --output "$OUT/knee_rate$rate.json"
done
for rate in ${CLASS_RATES:?set CLASS_RATES to 2x and 3x the knee}; do
  "${SIM[@]}" --slo-classes gold=0.2,silver=0.3,bronze=0.5 --admission \
    --request-rate "$rate" --output "$OUT/superinfer_rate$rate.json"
  "${SIM[@]}" "${VLLM[@]}" --slo-classes gold=0.2,silver=0.3,bronze=0.5 --policy priority \
    --request-rate "$rate" --output "$OUT/vllm-priority_rate$rate.json"
done
