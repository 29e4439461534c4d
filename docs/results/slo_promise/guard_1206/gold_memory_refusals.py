import glob, json, re, sys
root = sys.argv[1]
for d in sorted(p for p in glob.glob(root + '/cm_*_p*') if not p.endswith('.log')):
    r = json.load(open(glob.glob(d + '/rotasched_rate*.json')[0]))
    log = open(glob.glob(d + '/*.server.log')[0]).read()
    gold = [x for x in r['records'] if x['slo_class'] == 'gold']
    met = sum(1 for x in gold if x['outcome'] != 'rejected' and all(x['slo'][k] for k in ('ttft_met','tpot_met','deadline_met')))
    mem = re.findall(r'refused \((\w+)\): (\d+) prompt tokens, class gold; first token: compute (\d+) ms \+ memory (\d+) ms', log)
    adm = [x for x in r['records'] if x['outcome'] != 'rejected']
    prec = sum(1 for x in adm if all(x['slo'][k] for k in ('ttft_met','tpot_met','deadline_met'))) / max(1, len(adm))
    print(d.split('/')[-1], f"gold met {met}/{len(gold)}", f"precision {prec:.3f}", "gold refusals with a memory wait:", [(m[1], m[3]) for m in mem if int(m[3]) > 0], "all gold refusals", len(mem))
