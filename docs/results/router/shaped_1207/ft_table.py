from pathlib import Path
import json, sys, statistics as st
rows = []
for s in map(int, sys.argv[1:]):
    r = {}
    for arm, name in (("slo", f"ft_slo_s{s}"), ("p2", f"ft_p2_s{s}")):
        if s == 1: name = {"slo": "s1_slo", "p2": "s1_p2"}[arm]
        try: d = json.load(open(Path(__file__).parent / "runs" / f"{name}.json"))["routing_runs"][0]
        except (FileNotFoundError, KeyError, IndexError): continue
        r[arm] = d
    if len(r) < 2: continue
    a, b = r["slo"], r["p2"]
    diff = a["slo_attainment"] - b["slo_attainment"]
    rows.append(diff)
    print(s, "slo %.3f p2 %.3f diff %+.3f | refused %d/%d | prec %.3f/%.3f | gold %.3f/%.3f silver %.3f/%.3f bronze %.3f/%.3f" % (
        a["slo_attainment"], b["slo_attainment"], diff, a["rejected"], b["rejected"], a["precision"], b["precision"],
        a["all_met_by_class"]["gold"], b["all_met_by_class"]["gold"], a["all_met_by_class"]["silver"], b["all_met_by_class"]["silver"],
        a["all_met_by_class"]["bronze"], b["all_met_by_class"]["bronze"]))
if len(rows) > 1:
    print("n=%d mean %+.3f se %.3f" % (len(rows), st.mean(rows), st.stdev(rows) / len(rows) ** 0.5))
