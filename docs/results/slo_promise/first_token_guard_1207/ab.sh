#!/bin/bash
# Single engine, the 20/30/50 class mix, 60 s of arrivals at each of $RATES (default 4,6):
# one `benchmarks/vs_vllm/run.py` run per arm NAME:TREE, in the order given (TREE: a
# checkout with .venv linked, e.g. `git worktree add --detach /tmp/head REV`).
# Results in /tmp/mt/NAME.
set -u
mkdir -p /tmp/mt
for spec in "$@"; do
  IFS=: read -r name tree <<< "$spec"
  cd "$tree" || exit 1
  HF_HUB_OFFLINE=1 PYTHONPATH=$tree .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched --slo-classes gold=0.2,silver=0.3,bronze=0.5 --rates ${RATES:-4,6} --out /tmp/mt/$name > /tmp/mt/$name.log 2>&1
  echo "$(date +%T) $name done"
done
