#!/bin/bash
# first turns, rate 4, default pools: default replicas vs --tbt-shaped-steps, on HEAD
for s in "$@"; do
  if (( s % 2 )); then
    SEED=$s DATASET=sharegpt bash run.sh 4 "--tbt-shaped-steps" ft_shaped_s$s:head:slo
    SEED=$s DATASET=sharegpt bash run.sh 4 "" ft_default_s$s:head:slo
  else
    SEED=$s DATASET=sharegpt bash run.sh 4 "" ft_default_s$s:head:slo
    SEED=$s DATASET=sharegpt bash run.sh 4 "--tbt-shaped-steps" ft_shaped_s$s:head:slo
  fi
done
