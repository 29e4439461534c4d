#!/bin/bash
# first-turn slo vs p2 pairs on the guard's tree (chgc), order alternating by seed
cd /tmp/mt
for s in "$@"; do
  if (( s % 2 )); then
    SEED=$s DATASET=sharegpt bash run.sh 4 "" ftg_slo_s$s:chgc:slo ftg_p2_s$s:chgc:power-of-two:1
  else
    SEED=$s DATASET=sharegpt bash run.sh 4 "" ftg_p2_s$s:chgc:power-of-two:1 ftg_slo_s$s:chgc:slo
  fi
done
