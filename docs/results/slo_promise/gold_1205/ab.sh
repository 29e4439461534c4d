#!/usr/bin/env bash
# paired A/B: OUT BASE_TREE CHANGE_TREE PAIRS KIND(cm|un|gold) RATE; alternating order
# (cm: the 20/30/50 class mix; un: every request TTFT 1 s / TPOT 200 ms; gold: every request gold)
out=$1 base=$2 change=$3 pairs=${4:-3} kind=${5:-cm} rate=${6:-6}
export HF_HUB_OFFLINE=1
run() { # ARM PAIR
  local arm=$1 pair=$2 pp=$change extra=()
  [[ $arm == base ]] && pp=$base
  [[ $kind == cm ]] && extra=(--slo-classes gold=0.2,silver=0.3,bronze=0.5)
  [[ $kind == gold ]] && extra=(--slo-classes gold=1)
  (cd $pp && PYTHONPATH=$pp /work/main/.venv/bin/python /work/main/benchmarks/vs_vllm/run.py --no-probe \
     --duration 60 --systems rotasched "${extra[@]}" --rates $rate \
     --out $out/${kind}_${arm}_p${pair} > $out/${kind}_${arm}_p${pair}.log 2>&1)
  echo "done $kind $arm $pair $(date +%T)"
}
mkdir -p $out
for pair in $(seq 1 $pairs); do
  if (( pair % 2 )); then run change $pair; run base $pair
  else run base $pair; run change $pair; fi
done
