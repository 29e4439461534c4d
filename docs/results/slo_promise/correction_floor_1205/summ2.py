"""Gold-alone A/B runs of ab.sh: all met, precision, refusals, and every prompt of 800+ tokens
(tokens, HTTP status, estimated TTFT ms, served TTFT ms). Usage: python3 summ2.py OUT"""
import glob
import json
import sys

for path in sorted(glob.glob(sys.argv[1] + "/gold_*_p*/rotasched_rate1.2.json")):
    arm = path.split("/")[-2]; d = json.load(open(path)); recs = d["records"]
    admitted = [r for r in recs if r["status"] == 200]
    misses = [r for r in admitted if not (r["slo"]["ttft_met"] and r["slo"]["tpot_met"])]
    longs = [(r["prompt_tokens"], r["status"], r.get("estimated_ttft_ms"), (r.get("server_slo") or {}).get("ttft_ms")) for r in recs if r["prompt_tokens"] >= 800]
    print(f"{arm}: all met {d['slo_attainment']:.3f} ({sum(1 for r in recs if r['status']==200 and r['slo']['ttft_met'] and r['slo']['tpot_met'])}/{len(recs)}) precision {len(admitted)-len(misses)}/{len(admitted)} refused {len(recs)-len(admitted)}")
    print("    prompts >= 800 (tokens, status, est ms, ttft ms):", longs)
