#!/usr/bin/env bash
# The admission-on arm again (superinfer rotasched), its refusal cost against the sweep's
# admission-off replay of the same trace (admission off: the rerun's change cannot touch it).
#   rerun.sh UNIFORM_FOLDER UNIFORM_RATES [CLASSES_FOLDER CLASS_RATES]
# As run at ecfa0f4:  rerun.sh uniform_fix 1,2,3   then
#                     rerun.sh uniform_fix2 4,6,10 classes_fix 4,6
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=docs/results/slo_promise/final_1205
export HF_HUB_OFFLINE=1
rerun() {  # FOLDER RATES REPLAY_FOLDER [run.py arguments]
    local folder=$1 rates=$2 replay=$3
    shift 3
    .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched \
        --rates "$rates" --out "$OUT/$folder" "$@"
    for rate in ${rates//,/ }; do
        .venv/bin/superinfer bench refusal-cost "$OUT/$folder/rotasched_rate$rate.json" \
            "$OUT/$replay/rotasched-no-admission_rate$rate.json" \
            > "$OUT/$folder/refusal_cost_rate$rate.json"
    done
}
rerun "$1" "$2" uniform
if [[ $# -ge 4 ]]; then
    rerun "$3" "$4" classes --slo-classes gold=0.2,silver=0.3,bronze=0.5
fi
