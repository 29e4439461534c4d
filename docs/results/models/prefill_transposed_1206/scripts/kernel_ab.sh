#!/usr/bin/env bash
# Prefill attention, one layer: BASE's and CHANGE's checkouts alternating, N rounds, each
# its own process (the kernel library is built per source). Run from the change's root:
#   BASE=/path/to/base-worktree bash docs/results/models/prefill_transposed_1206/scripts/kernel_ab.sh 4 \
#       --shapes 256+0,512+0,512+512,1024+0,64+1000,16+500
n=${1:-2}; shift
base=${BASE:?a git worktree of the base commit} change=${CHANGE:-$PWD}
for i in $(seq "$n"); do
  for tree in "$base" "$change"; do
    echo "== $tree"
    (cd "$tree" && PYTHONPATH=$tree HF_HUB_OFFLINE=1 "$change/.venv/bin/python" -P \
       benchmarks/prefill_attention.py --reps "${REPS:-20}" "$@" 2>&1 | grep tokens)
  done
done
