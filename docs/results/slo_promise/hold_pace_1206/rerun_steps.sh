#!/usr/bin/env bash
# the paces in steps, freed at the slowest (see README.md): uniform 3, classes 4, then
# uniform 4 change and base
set -euo pipefail
MAIN=/work/main BASE=${BASE:-/tmp/base} OUT=${OUT:-/tmp/k14b}
export HF_HUB_OFFLINE=1
MIX=gold=0.2,silver=0.3,bronze=0.5
change() { (cd "$MAIN" && .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"); }
base() { (cd "$BASE" && PYTHONPATH="$BASE" .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"); }
cost() { "$MAIN/.venv/bin/superinfer" bench refusal-cost "$1/rotasched_rate$3.json" "$2/rotasched-no-admission_rate$3.json" > "$1/refusal_cost_rate$3.json"; }
change --rates 3 --out "$OUT/steps/uniform3"
cost "$OUT/steps/uniform3" "$OUT/change/uniform3" 3
change --slo-classes "$MIX" --rates 4 --out "$OUT/steps/classes4"
cost "$OUT/steps/classes4" "$OUT/change/classes4" 4
change --rates 4 --refusal-replay --out "$OUT/steps/uniform4"
cost "$OUT/steps/uniform4" "$OUT/steps/uniform4" 4
base --rates 4 --out "$OUT/base/uniform4"
cost "$OUT/base/uniform4" "$OUT/steps/uniform4" 4
echo RERUN DONE
