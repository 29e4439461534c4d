#!/bin/bash
# first-turn pairs on HEAD, order alternating by seed
for s in "$@"; do
  if (( s % 2 )); then
    SEED=$s DATASET=sharegpt bash run.sh 4 "" ft_slo_s$s:head:slo ft_p2_s$s:head:power-of-two:1
  else
    SEED=$s DATASET=sharegpt bash run.sh 4 "" ft_p2_s$s:head:power-of-two:1 ft_slo_s$s:head:slo
  fi
done
