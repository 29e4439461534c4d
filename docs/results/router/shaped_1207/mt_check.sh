#!/bin/bash
# multi-turn, rate 12, 0.5 GiB pools, shaped steps + TBT check: HEAD's estimate vs the new one
X="--device-kv-gib 0.5 --tbt-shaped-steps --reject-infeasible-tbt"
for s in "$@"; do
  if (( s % 2 )); then
    SEED=$s bash run.sh 12 "$X" mt_chk_new_s$s:new:slo mt_chk_base_s$s:head:slo
  else
    SEED=$s bash run.sh 12 "$X" mt_chk_base_s$s:head:slo mt_chk_new_s$s:new:slo
  fi
done
