#!/usr/bin/env bash
# Server TTFT of 250-1000-token prompts on an idle server (the bf16 HF export the issue-14
# runs serve), BASE's and CHANGE's checkouts alternating, N rounds.
n=${1:-2}
base=${BASE:?a git worktree of the base commit} change=${CHANGE:-$PWD}
here=$(cd "$(dirname "$0")" && pwd)
for i in $(seq "$n"); do
  for tree in "$base" "$change"; do
    (cd "$tree" && PYTHONPATH=$tree HF_HUB_OFFLINE=1 "$change/.venv/bin/python" -P -m superinfer.cli serve \
       --model /work/models/smollm2-135m-instruct-hf --dtype bfloat16 --device cpu \
       --device-kv-gib 0.125 --host-kv-gib 0.125 --max-model-len 2048 --port 8124 > /tmp/srv_ab.log 2>&1 &)
    for s in $(seq 90); do curl -sf localhost:8124/health >/dev/null && break; sleep 1; done
    echo "== $tree"
    "$change/.venv/bin/python" "$here/probe_ttft.py" http://localhost:8124 smollm2-135m-instruct-hf
    pkill -f "port 8124"; sleep 3
  done
done
