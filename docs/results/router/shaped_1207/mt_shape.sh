#!/bin/bash
# multi-turn, rate 12, 0.5 GiB pools: default replicas vs --tbt-shaped-steps, order alternating
for s in "$@"; do
  if (( s % 2 )); then
    SEED=$s bash run.sh 12 "--device-kv-gib 0.5 --tbt-shaped-steps" mt_shaped_s$s:head:slo
    SEED=$s bash run.sh 12 "--device-kv-gib 0.5" mt_default_s$s:head:slo
  else
    SEED=$s bash run.sh 12 "--device-kv-gib 0.5" mt_default_s$s:head:slo
    SEED=$s bash run.sh 12 "--device-kv-gib 0.5 --tbt-shaped-steps" mt_shaped_s$s:head:slo
  fi
done
