#!/bin/bash
# First-turn pairs, slo routing against power-of-two (Ray Serve's rule, one try), the two
# rules of a seed one after the other, their order alternating by seed (odd: slo first):
#   bash pairs.sh 1 2 3 4 5 6     # results in /tmp/mt/gd_{slo,p2}_sSEED.json
# Needs a worktree of the commit measured at /tmp/head with .venv linked.
cd "$(dirname "$0")/../pairs_1207" || exit 1
for s in "$@"; do
  slo=gd_slo_s$s:head:slo p2=gd_p2_s$s:head:power-of-two:1
  if (( s % 2 )); then
    SEED=$s DATASET=sharegpt bash run.sh 4 "" "$slo" "$p2"
  else
    SEED=$s DATASET=sharegpt bash run.sh 4 "" "$p2" "$slo"
  fi
done
