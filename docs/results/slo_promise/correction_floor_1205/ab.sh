#!/usr/bin/env bash
# gold alone at 1.2 req/s (every request gold): OUT BASE_TREE CHANGE_TREE PAIRS; alternating order
# (as ../gold_1205/ab.sh: each arm from its own checkout)
out=$1 base=$2 change=$3 pairs=${4:-2}
export HF_HUB_OFFLINE=1
run() {
  local arm=$1 pair=$2 pp=$change
  [[ $arm == base ]] && pp=$base
  (cd $pp && PYTHONPATH=$pp /work/main/.venv/bin/python /work/main/benchmarks/vs_vllm/run.py --no-probe \
     --duration 60 --systems rotasched --slo-classes gold=1 --rates 1.2 \
     --out $out/gold_${arm}_p${pair} > $out/gold_${arm}_p${pair}.log 2>&1)
  echo "done $arm $pair $(date +%T)"
}
mkdir -p $out
for pair in $(seq 1 $pairs); do
  if (( pair % 2 )); then run change $pair; run base $pair
  else run base $pair; run change $pair; fi
done
