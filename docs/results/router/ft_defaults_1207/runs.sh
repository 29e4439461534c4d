#!/bin/bash
# First turns (ShareGPT, the 20/30/50 class mix on the default classes) at 4 req/s (2x) for
# 60 s on two one-thread replicas with their default flags (the TBT check on since
# 13df264): slo routing against power-of-two (Ray Serve's rule, one try), the order
# alternating by seed:
#   bash runs.sh 0 1 2 3 4 5     # results in /tmp/mt/fd_{slo,p2}_sSEED.json
# Needs a worktree of the commit measured at /tmp/head with .venv linked.
cd "$(dirname "$0")/../pairs_1207" || exit 1
for s in "$@"; do
  slo=fd_slo_s$s:head:slo p2=fd_p2_s$s:head:power-of-two:1
  if (( s % 2 )); then SEED=$s DATASET=sharegpt bash run.sh 4 "" "$slo" "$p2"
  else SEED=$s DATASET=sharegpt bash run.sh 4 "" "$p2" "$slo"; fi
done
