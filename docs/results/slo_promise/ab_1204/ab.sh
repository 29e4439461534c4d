#!/usr/bin/env bash
# paired A/B of facf5bc against its parent: class mix and uniform at 6 req/s
cd /work/main
export HF_HUB_OFFLINE=1
run() { # ARM KIND PAIR
  local arm=$1 kind=$2 pair=$3 extra=()
  [[ $kind == cm ]] && extra=(--slo-classes gold=0.2,silver=0.3,bronze=0.5)
  local pp=/work/main; [[ $arm == base ]] && pp=/tmp/base30
  PYTHONPATH=$pp .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched \
     "${extra[@]}" --rates 6 --out /tmp/s29/ab/${kind}_${arm}_p${pair} > /tmp/s29/ab/${kind}_${arm}_p${pair}.log 2>&1
  echo "done $kind $arm $pair $(date +%T)"
}
mkdir -p /tmp/s29/ab
for pair in 1 2; do
  for kind in cm un; do
    if (( (pair + ${#kind}) % 2 )); then run base $kind $pair; run change $kind $pair
    else run change $kind $pair; run base $kind $pair; fi
  done
done
