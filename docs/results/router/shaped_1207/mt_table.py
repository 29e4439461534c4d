from pathlib import Path
import json, sys
for name in sys.argv[1:]:
    try: d = json.load(open(Path(__file__).parent / "runs" / f"{name}.json"))["routing_runs"][0]
    except Exception as e: print(name, "missing", e); continue
    c = d["all_met_by_class"]
    print("%-18s att %.3f prec %.3f gold %.3f silver %.3f bronze %.3f goodput %.2f refused %d/%d tput %.0f" % (
        name, d["slo_attainment"], d["precision"], c["gold"], c["silver"], c["bronze"], d["goodput"], d["rejected"], d["num_prompts"], d["output_throughput"]))
