#!/bin/bash
set -u
cd /tmp/head
export HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/head
MIX=gold=0.2,silver=0.3,bronze=0.5
.venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched,vllm --refusal-replay --slo-classes $MIX --rates 4,6 --out /tmp/k14/classes
.venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched,vllm --refusal-replay --rates 3,4 --out /tmp/k14/uniform
for r in 4 6; do .venv/bin/superinfer bench refusal-cost /tmp/k14/classes/rotasched_rate$r.json /tmp/k14/classes/rotasched-no-admission_rate$r.json > /tmp/k14/classes/refusal_cost_rate$r.json; done
for r in 3 4; do .venv/bin/superinfer bench refusal-cost /tmp/k14/uniform/rotasched_rate$r.json /tmp/k14/uniform/rotasched-no-admission_rate$r.json > /tmp/k14/uniform/refusal_cost_rate$r.json; done
echo ALL DONE
