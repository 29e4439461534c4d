#!/usr/bin/env bash
set -euo pipefail
cd /work/main
OUT=docs/results/slo_promise/final_1205
export HF_HUB_OFFLINE=1
run() { .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"; }
run --rates 4,6,10 --out "$OUT/uniform_fix2"
for rate in 4 6 10; do
  .venv/bin/superinfer bench refusal-cost "$OUT/uniform_fix2/rotasched_rate$rate.json" \
      "$OUT/uniform/rotasched-no-admission_rate$rate.json" > "$OUT/uniform_fix2/refusal_cost_rate$rate.json"
done
run --slo-classes gold=0.2,silver=0.3,bronze=0.5 --rates 4,6 --out "$OUT/classes_fix"
for rate in 4 6; do
  .venv/bin/superinfer bench refusal-cost "$OUT/classes_fix/rotasched_rate$rate.json" \
      "$OUT/classes/rotasched-no-admission_rate$rate.json" > "$OUT/classes_fix/refusal_cost_rate$rate.json"
done
echo RERUN DONE
