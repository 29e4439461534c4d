#!/usr/bin/env bash
# admission quantile 0.9 (default) vs 0.8, one checkout, class mix 2x and uniform 1.5x;
# the first pair also runs the admission-off replay. Usage: run.sh [OUT] (default /tmp/q)
out=${1:-/tmp/q}
export HF_HUB_OFFLINE=1
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)" || exit 1
mkdir -p "$out"
for pair in 1 2 3; do
  for point in cm un; do
    extra=(); rate=3
    [[ $point == cm ]] && extra=(--slo-classes gold=0.2,silver=0.3,bronze=0.5) && rate=4
    [[ $pair == 1 ]] && extra+=(--refusal-replay)
    .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched \
      --variant "q80=--admission-quantile 0.8" "${extra[@]}" --rates $rate \
      --out "$out/${point}_p${pair}" > "$out/${point}_p${pair}.log" 2>&1
    echo "done $point $pair $(date +%T)"
  done
done
