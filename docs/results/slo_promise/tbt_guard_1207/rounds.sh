#!/bin/bash
# Rounds of the base (--no-tbt-guard) against --tbt-guard, one engine, 60 s at 4 and 6 req/s:
#   rounds.sh classes 2 3 4   # the 20/30/50 class mix, results in /tmp/mt/r2, r3, r4
#   rounds.sh uniform 2 3     # every request TTFT 1 s / TPOT 200 ms, in /tmp/mt/u2, u3
# Odd rounds run the guard first (as the plain system "rotasched", the base as the variant
# "base"), even rounds the base first (the guard as the variant "tbt"). TREE: a checkout
# with .venv (default: this one). PREFIX: the results' name instead of r or u. GUARD and
# VARIANT: another on/off flag and its variant's name (../ftg_bound_1207/rounds.sh).
set -u
TREE=${TREE:-$(git rev-parse --show-toplevel)}
GUARD=${GUARD:-tbt-guard} VARIANT=${VARIANT:-tbt}
cd "$TREE" || exit 1
mkdir -p /tmp/mt
workload=$1; shift
if [ "$workload" = classes ]; then
  prefix=${PREFIX:-r}; targets=(--slo-classes gold=0.2,silver=0.3,bronze=0.5)
else
  prefix=${PREFIX:-u}; targets=(--ttft-slo-ms 1000 --tbt-slo-ms 200)
fi
for n in "$@"; do
  if (( n % 2 )); then
    arms=(--superinfer-args=--$GUARD --variant base=--no-$GUARD)
  else
    arms=(--variant $VARIANT=--$GUARD)
  fi
  HF_HUB_OFFLINE=1 PYTHONPATH=$TREE .venv/bin/python benchmarks/vs_vllm/run.py --no-probe \
    --duration 60 --systems rotasched "${arms[@]}" "${targets[@]}" --rates 4,6 \
    --out /tmp/mt/$prefix$n > /tmp/mt/$prefix$n.log 2>&1
  echo "$(date +%T) $prefix$n done"
done
