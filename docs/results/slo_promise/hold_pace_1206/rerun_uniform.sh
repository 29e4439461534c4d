#!/usr/bin/env bash
# uniform 3 req/s again, change then base (see sweep.sh), suffix $1
set -euo pipefail
MAIN=/work/main BASE=${BASE:-/tmp/base} OUT=${OUT:-/tmp/k14b}
export HF_HUB_OFFLINE=1
change() { (cd "$MAIN" && .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"); }
base() { (cd "$BASE" && PYTHONPATH="$BASE" .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"); }
change --rates 3 --out "$OUT/change/uniform3$1"
base --rates 3 --out "$OUT/base/uniform3$1"
for arm in base change; do
    "$MAIN/.venv/bin/superinfer" bench refusal-cost "$OUT/$arm/uniform3$1/rotasched_rate3.json" \
        "$OUT/change/uniform3/rotasched-no-admission_rate3.json" > "$OUT/$arm/uniform3$1/refusal_cost_rate3.json"
done
echo RERUN DONE
