#!/bin/bash
cd /work/main
COMMON="--no-probe --duration 60 --systems rotasched --variant tbt-check=--reject-infeasible-tbt"
for rate in 3 6; do
  HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/run.py $COMMON --rates $rate --out /tmp/ab3/new
  HF_HUB_OFFLINE=1 PYTHONPATH=/work/old .venv/bin/python benchmarks/vs_vllm/run.py $COMMON --rates $rate --out /tmp/ab3/old
done
#!/bin/bash
cd /work/main
COMMON="--no-probe --duration 60 --systems rotasched --rates 4"
for rep in 1 2 3; do
  HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/run.py $COMMON --out /tmp/ab4/new/rep$rep
  HF_HUB_OFFLINE=1 PYTHONPATH=/work/old .venv/bin/python benchmarks/vs_vllm/run.py $COMMON --out /tmp/ab4/old/rep$rep
done
#!/bin/bash
cd /work/main
COMMON="--no-probe --duration 60 --systems rotasched --variant shaped=--tbt-shaped-steps --slo-classes gold=0.2,silver=0.3,bronze=0.5 --rates 4"
HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/run.py $COMMON --out /tmp/ab5/after
HF_HUB_OFFLINE=1 PYTHONPATH=/work/old .venv/bin/python benchmarks/vs_vllm/run.py $COMMON --out /tmp/ab5/before
