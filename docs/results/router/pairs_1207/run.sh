#!/bin/bash
# One `benchmarks/router.py` run per argument, one after the other (2 replicas, the
# 20/30/50 class mix on the default classes, 60 s of arrivals, seed $SEED):
#   SEED=0 [DATASET=sharegpt] bash run.sh RATE "REPLICA ARGS" NAME:TREE:ROUTING ...
# TREE is a checkout under /tmp with .venv linked (git worktree add /tmp/TREE REV);
# ROUTING slo or power-of-two:1 (Ray Serve's rule, no retry). Results in /tmp/mt/NAME.
set -u
RATE=$1; EXTRA=$2; shift 2
for spec in "$@"; do
  IFS=: read -r name tree routing <<< "$spec"
  cd "/tmp/$tree" || exit 1
  HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/router.py --skip-overhead --repeats 1 \
    --seed "${SEED:-0}" --routings "$routing" --rate "$RATE" --duration 60 \
    --dataset "${DATASET:-sharegpt-multiturn}" --repo "/tmp/$tree" --replica-args="$EXTRA" \
    --keep "/tmp/mt/$name" --out "/tmp/mt/$name.json" > "/tmp/mt/$name.out" 2>&1
  echo "$(date +%T) $name done"
done
