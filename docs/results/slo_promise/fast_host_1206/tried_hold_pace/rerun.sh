#!/usr/bin/env bash
# the admission-on arm again at the working tree (e118deb + hold_pace.diff); refusal cost against the sweep's replays
set -euo pipefail
cd /work/main
OUT=/tmp/k14  # the raw results are not committed; summary.json keeps each run's numbers
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
rerun "$1" 4,6 classes --slo-classes gold=0.2,silver=0.3,bronze=0.5
rerun "$2" 3 uniform
echo RERUN DONE
