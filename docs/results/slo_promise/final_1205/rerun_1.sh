#!/usr/bin/env bash
# the admission-on arm again at the fixed commit; the vLLM and replay runs stay the sweep's
set -euo pipefail
cd /work/main
OUT=docs/results/slo_promise/final_1205
export HF_HUB_OFFLINE=1
run() { .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"; }
run --rates 1,2,3 --out "$OUT/uniform_fix"
for rate in 1 2 3; do
  .venv/bin/superinfer bench refusal-cost "$OUT/uniform_fix/rotasched_rate$rate.json" \
      "$OUT/uniform/rotasched-no-admission_rate$rate.json" > "$OUT/uniform_fix/refusal_cost_rate$rate.json"
done
echo RERUN DONE
