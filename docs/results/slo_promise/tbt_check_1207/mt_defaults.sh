#!/bin/bash
# Overloaded conversations (12 req/s, 0.5 GiB pools) on replicas with their default flags,
# slo routing against power-of-two (Ray Serve's rule, one try), order alternating by seed:
#   bash mt_defaults.sh 0 1 2     # results in /tmp/mt/md_{slo,p2}_sSEED.json
# Needs a worktree of the commit measured at /tmp/head with .venv linked.
cd "$(dirname "$0")/../../router/pairs_1207" || exit 1
for s in "$@"; do
  slo=md_slo_s$s:head:slo p2=md_p2_s$s:head:power-of-two:1
  if (( s % 2 )); then SEED=$s bash run.sh 12 "--device-kv-gib 0.5" "$slo" "$p2"
  else SEED=$s bash run.sh 12 "--device-kv-gib 0.5" "$p2" "$slo"; fi
done
