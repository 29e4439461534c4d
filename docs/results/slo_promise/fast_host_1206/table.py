"""Markdown tables of a final sweep folder: python table.py FOLDER [FOLDER_FIX]"""
import json, sys, glob, os, re
rows = []
for folder in sys.argv[1:]:
    tag = os.path.basename(folder.rstrip('/'))
    for f in sorted(glob.glob(os.path.join(folder, '*_rate*.json'))):
        name = os.path.basename(f)[:-5]
        if name.startswith('refusal_cost'): continue
        system, rate = name.rsplit('_rate', 1)
        d = json.load(open(f))
        rc = os.path.join(folder, f'refusal_cost_rate{rate}.json')
        cost = json.load(open(rc))['refusal_cost'] if system == 'rotasched' and os.path.exists(rc) else None
        classes = {c: v['all_met'] for c, v in d['attainment_by_class'].items()}
        rows.append((float(rate), tag, system, d['goodput'], d['precision'], d['slo_attainment'], d['output_throughput'], d['rejected'], d['completed'] + d['rejected'], cost, classes))
rows.sort(key=lambda r: (r[0], r[2] != 'vllm', r[1], r[2]))
vllm = {r[0]: r for r in rows if r[2] == 'vllm'}
print('| rate | run | system | goodput | vs vLLM | precision | all met | output tok/s | vs vLLM | refused | refusal cost | per class all met |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|')
for r in rows:
    v = vllm.get(r[0])
    ratio = f"{r[3] / v[3]:.2f}x" if v and r[2] != 'vllm' and v[3] else ''
    out_ratio = f"{r[6] / v[6]:.2f}x" if v and r[2] != 'vllm' else ''
    cls = ' / '.join(f"{r[10][c]*100:.1f}" for c in ('gold', 'silver', 'bronze') if c in r[10])
    cost = '' if r[9] is None else f"{r[9]*100:.1f}%"
    print(f"| {r[0]:g} | {r[1]} | {r[2]} | {r[3]:.3f} | {ratio} | {r[4]*100:.1f}% | {r[5]*100:.1f}% | {r[6]:.0f} | {out_ratio} | {r[7]}/{r[8]} | {cost} | {cls} |")
