#!/bin/bash
# The A/B runs of this folder, one after the other on one host: each arm NAME:TREE:KIND:RATE[:r]
# runs `benchmarks/vs_vllm/run.py` from TREE (a worktree of the commit, the project's .venv
# linked) for 60 s of ShareGPT chat at RATE req/s, KIND uniform (TTFT 1 s / TPOT 200 ms) or
# classes (20/30/50 gold/silver/bronze); ":r" adds the admission-off replay. Results in
# $OUT/NAME; then `python3 summarize.py $OUT`.
#   rounds as run (12-07): base=6d85363, chg=bbe7d86, chg2=0252b0c
#   runs.sh u3_base:/tmp/base:uniform:3 u3_chg:/tmp/chg:uniform:3:r c4_base:/tmp/base:classes:4 \
#           c4_chg:/tmp/chg:classes:4:r u2_base:/tmp/base:uniform:2 u2_chg:/tmp/chg:uniform:2:r
#   runs.sh u3_chg2:/tmp/chg2:uniform:3 c6_base:/tmp/base:classes:6 c6_chg2:/tmp/chg2:classes:6:r \
#           c4_chg2:/tmp/chg2:classes:4 u2_chg2:/tmp/chg2:uniform:2 u3_base2:/tmp/base:uniform:3
set -u
OUT=${OUT:-/tmp/ab}
for spec in "$@"; do
  IFS=: read -r name tree kind rate replay <<< "$spec"
  cd "$tree" || exit 1
  if [ "$kind" = classes ]; then extra="--slo-classes gold=0.2,silver=0.3,bronze=0.5"
  else extra="--ttft-slo-ms 1000 --tbt-slo-ms 200"; fi
  [ -n "${replay:-}" ] && extra="$extra --refusal-replay"
  HF_HUB_OFFLINE=1 PYTHONPATH=$tree .venv/bin/python benchmarks/vs_vllm/run.py --no-probe \
    --duration 60 --systems rotasched $extra --rates "$rate" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$(date +%T) $name done rc=$?"
done
