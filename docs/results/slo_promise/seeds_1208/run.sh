#!/bin/bash
# Issue 14's borderline goals over four seeds in one hour (seed: ShareGPT sampling and
# Poisson arrivals): the class mix at 2x (superinfer and vLLM's priority scheduler: every
# class against vLLM's) and every request at TTFT 1 s / TPOT 200 ms at 0.5x, 1x and 1.5x
# (superinfer and its admission-off replay: refusal cost; vLLM at 0.5x: goodput before the
# knee). Run from a worktree of the commit measured (/tmp/head) with the project's .venv
# linked; SEEDS picks the traces (default 0 1 2 3). Then `python3 summarize.py $OUT > summary.md`.
set -u
OUT=${OUT:-/tmp/seeds}
cd /tmp/head
export HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/head
RUN=".venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60"
for seed in ${SEEDS:-0 1 2 3}; do
  o=$OUT/seed$seed
  $RUN --seed $seed --systems rotasched,vllm --slo-classes gold=0.2,silver=0.3,bronze=0.5 --rates 4 --out $o/classes
  $RUN --seed $seed --systems rotasched,vllm --refusal-replay --rates 1 --out $o/uniform
  $RUN --seed $seed --systems rotasched --refusal-replay --rates 2,3 --out $o/uniform_over
  for d in uniform:1 uniform_over:2 uniform_over:3; do
    IFS=: read -r sub r <<< "$d"
    .venv/bin/superinfer bench refusal-cost $o/$sub/rotasched_rate$r.json \
      $o/$sub/rotasched-no-admission_rate$r.json > $o/$sub/refusal_cost_rate$r.json
  done
  echo "$(date +%T) seed $seed done"
done
echo ALL DONE
