#!/usr/bin/env bash
# Alternate three arms on the multi-turn ShareGPT trace, REPS times, each its own
# `benchmarks/router.py` run (2 replicas, class mix, 60 s):
#   index:   slo routing with the prefix index and prefix-aware admission (TREE)
#   blind:   slo routing without either (NOPREFIX: TREE with both switched off)
#   p2:      power-of-two without retry, Ray Serve's rule (TREE)
# usage: REPS=3 RATE=4 OUT=dir [ARMS="index p2"] bash ab.sh TREE NOPREFIX [extra replica args]
set -euo pipefail
TREE=$1; NOPREFIX=$2; EXTRA=${3:-}
REPS=${REPS:-3}; RATE=${RATE:-4}; OUT=${OUT:-/tmp/r19/ab}; ARMS=${ARMS:-index blind p2}
mkdir -p "$OUT"
run() {  # name repo routing repeat
  HF_HUB_OFFLINE=1 "$TREE/.venv/bin/python" "$2/benchmarks/router.py" --skip-overhead \
    --repeats 1 --seed "$4" --routings "$3" --rate "$RATE" --duration 60 \
    --dataset sharegpt-multiturn --repo "$2" --replica-args "$EXTRA" \
    --keep "$OUT/$1_$4" --out "$OUT/$1_$4.json" > "$OUT/$1_$4.out" 2>&1
}
for rep in $(seq 0 $((REPS - 1))); do
  order=$ARMS
  if (( rep % 2 == 1 )); then order=$(echo $ARMS | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for arm in $order; do
    case $arm in
      index) run index "$TREE" slo "$rep" ;;
      blind) run blind "$NOPREFIX" slo "$rep" ;;
      p2) run p2 "$TREE" power-of-two:1 "$rep" ;;
    esac
    echo "$(date +%T) $arm $rep done"
  done
done
