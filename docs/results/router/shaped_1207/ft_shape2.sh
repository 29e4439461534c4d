#!/bin/bash
# the shaped arm of ft_shape.sh again (a leading space keeps argparse from reading the value as an option)
for s in "$@"; do
  SEED=$s DATASET=sharegpt bash run.sh 4 " --tbt-shaped-steps" ft_shaped_s$s:head:slo
done
bash se_shape.sh
