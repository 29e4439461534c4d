#!/bin/bash
# usage: BASE=tree CHANGE=tree kernel_ab.sh ROWS ROUNDS   (each tree a checkout; alternating processes)
HERE=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 $2); do
  for t in $BASE $CHANGE; do
    r=$(cd $t && PYTHONPATH=$t ${PY:-python} -P "$HERE/gemm_rows.py" $1 2>/dev/null | tail -1)
    echo "$i $t $r"
  done
done
