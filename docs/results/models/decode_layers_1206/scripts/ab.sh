#!/bin/bash
# Alternates the trees given (git worktrees with .venv linked) through the three scripts,
# REPS times; prints one JSON line per run, tagged with its tree:
#   REPS=2 bash ab.sh /tmp/base /tmp/cloop /work/main
HERE=$(cd "$(dirname "$0")" && pwd)
export HF_HUB_OFFLINE=1
for rep in $(seq "${REPS:-2}"); do
  for tree in "$@"; do
    cd "$tree" || exit 1
    echo "$tree gemv_layers $(PYTHONPATH=$tree .venv/bin/python -P "$HERE/gemv_layers.py" 1 2>&1 | tail -1)"
    echo "$tree tpot_parts $(PYTHONPATH=$tree .venv/bin/python -P "$HERE/tpot_parts.py" 1 2>&1 | tail -1)"
    PYTHONPATH=$tree .venv/bin/python -P "$HERE/steps32.py" 3 2>&1 | grep '"round"' | sed "s|^|$tree steps32 |"
  done
done
