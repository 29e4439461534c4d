#!/bin/bash
# Issue 14's measurement at one commit on one host: (b) the class mix at 2x and 3x, then
# (a) every request at TTFT 1 s / TPOT 200 ms at 0.5x-3x the 2 req/s knee, each point with
# vLLM's CPU build beside and superinfer with admission off as the refusal-cost replay.
# Run from a worktree of the commit measured (/tmp/head) with the project's .venv linked.
set -u
OUT=${OUT:-/tmp/k14b}
cd /tmp/head
export HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/head
MIX=gold=0.2,silver=0.3,bronze=0.5
.venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched,vllm --refusal-replay --slo-classes $MIX --rates 4,6 --out $OUT/classes
for r in 4 6; do .venv/bin/superinfer bench refusal-cost $OUT/classes/rotasched_rate$r.json $OUT/classes/rotasched-no-admission_rate$r.json > $OUT/classes/refusal_cost_rate$r.json; done
.venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched,vllm --refusal-replay --rates 1,2,3,4,6 --out $OUT/uniform
for r in 1 2 3 4 6; do .venv/bin/superinfer bench refusal-cost $OUT/uniform/rotasched_rate$r.json $OUT/uniform/rotasched-no-admission_rate$r.json > $OUT/uniform/refusal_cost_rate$r.json; done
echo ALL DONE
