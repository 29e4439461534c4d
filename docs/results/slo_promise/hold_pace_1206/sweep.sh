#!/usr/bin/env bash
# issue 14, the learned hold pace: base (1291942) and change (this commit) admission arms,
# alternated point by point, with the change's admission-off replay of each point.
# Needs the base checked out: git worktree add /tmp/base 1291942
set -euo pipefail
MAIN=/work/main BASE=${BASE:-/tmp/base} OUT=${OUT:-/tmp/k14b}
MIX=gold=0.2,silver=0.3,bronze=0.5
export HF_HUB_OFFLINE=1
[ -e "$BASE/.venv" ] || ln -s "$MAIN/.venv" "$BASE/.venv"
change() { (cd "$MAIN" && .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"); }
base() { (cd "$BASE" && PYTHONPATH="$BASE" .venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched "$@"); }
cost() {  # run folder, replay folder, rate
    "$MAIN/.venv/bin/superinfer" bench refusal-cost "$1/rotasched_rate$3.json" \
        "$2/rotasched-no-admission_rate$3.json" > "$1/refusal_cost_rate$3.json"
}
base --slo-classes "$MIX" --rates 4 --out "$OUT/base/classes4"
change --slo-classes "$MIX" --refusal-replay --rates 4 --out "$OUT/change/classes4"
change --slo-classes "$MIX" --refusal-replay --rates 6 --out "$OUT/change/classes6"
base --slo-classes "$MIX" --rates 6 --out "$OUT/base/classes6"
base --rates 3 --out "$OUT/base/uniform3"
change --refusal-replay --rates 3 --out "$OUT/change/uniform3"
change --slo-classes "$MIX" --rates 4 --out "$OUT/change/classes4b"
base --slo-classes "$MIX" --rates 4 --out "$OUT/base/classes4b"
for arm in base change; do
    cost "$OUT/$arm/classes4" "$OUT/change/classes4" 4
    cost "$OUT/$arm/classes4b" "$OUT/change/classes4" 4
    cost "$OUT/$arm/classes6" "$OUT/change/classes6" 6
    cost "$OUT/$arm/uniform3" "$OUT/change/uniform3" 3
done
echo SWEEP DONE
