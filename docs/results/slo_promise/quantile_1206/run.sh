#!/usr/bin/env bash
# admission quantile 0.9 (default) vs 0.8, same checkout, class mix 2x and uniform 1.5x
export HF_HUB_OFFLINE=1
cd /work/main
for pair in 1 2 3; do
  for point in cm un; do
    extra=(); rate=3
    [[ $point == cm ]] && extra=(--slo-classes gold=0.2,silver=0.3,bronze=0.5) && rate=4
    [[ $pair == 1 ]] && extra+=(--refusal-replay)
    .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched \
      --variant "q80=--admission-quantile 0.8" "${extra[@]}" --rates $rate \
      --out /tmp/q/${point}_p${pair} > /tmp/q/${point}_p${pair}.log 2>&1
    echo "done $point $pair $(date +%T)"
  done
done
