#!/usr/bin/env bash
# see ../README.md: the admission-on arm of the class mix at 4 req/s again; raw results under /tmp/k14 are not committed
set -euo pipefail
cd /work/main
export HF_HUB_OFFLINE=1
.venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched --rates 4 --out /tmp/k14/$1 --slo-classes gold=0.2,silver=0.3,bronze=0.5
.venv/bin/superinfer bench refusal-cost /tmp/k14/$1/rotasched_rate4.json /tmp/k14/classes/rotasched-no-admission_rate4.json > /tmp/k14/$1/refusal_cost_rate4.json
echo RERUN DONE
