#!/bin/bash
# single engine, class mix 2x/3x: default vs --tbt-shaped-steps (HEAD)
cd /tmp/head
export HF_HUB_OFFLINE=1 PYTHONPATH=/tmp/head
.venv/bin/python benchmarks/vs_vllm/run.py --no-probe --duration 60 --systems rotasched --variant shaped=--tbt-shaped-steps --slo-classes gold=0.2,silver=0.3,bronze=0.5 --rates 4,6 --out /tmp/mt/se_cm
echo "$(date +%T) se done"
