"""The simulator's view of the KV check's paces (see README.md): each point run with
admission off (the replay) and on, per variant: HoldPace's (fast, slow) quantiles, and the
environment's HCS (HOST_COMMIT_SHARE) and HEAD (KV_HEADROOM_PER_CLASS). Refusal cost from
the records, refusal reasons from admission's debug log.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/results/slo_promise/hold_pace_1206/sim_sweep.py 0.1-0.9 3
"""
import contextlib, io, json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
from superinfer.cli import main
FIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu_fit_1206.json")
OUT = os.environ.get("OUT", "/tmp/sim_sweep")
os.makedirs(OUT, exist_ok=True)
from superinfer.slo import hold_pace
import logging, collections
REASONS = collections.Counter()
class H(logging.Handler):
    def emit(self, rec):
        if rec.msg.startswith("refused ("):
            REASONS[rec.args[0]] += 1
lg = logging.getLogger("superinfer.server.admission"); lg.setLevel(logging.DEBUG); lg.addHandler(H()); lg.propagate = False

def run(rate, seed, admission, uniform, out):
    argv = ["simulate", "--hardware", "cpu", "--model", "smollm2-135m", "--predictor", FIT,
            "--request-rate", str(rate), "--duration", "60", "--seed", str(seed),
            "--num-device-blocks", "364", "--num-host-blocks", "364", "--policy", "rotasched",
            "--admission" if admission else "--no-admission", "--output", out]
    argv += ["--ttft-slo-ms", "1000", "--tbt-slo-ms", "200"] if uniform else ["--slo-classes", "gold=0.2,silver=0.3,bronze=0.5"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(argv)
    return json.load(open(out))

def met(r):
    return r["outcome"] == "finished" and r["ttft_met"] and r["tpot_met"]

variants = {} if os.environ.get("NOWIDE") else {"widest": (0.0, 1.0)}
for spec in sys.argv[1].split(","):
    lo, hi = spec.split("-")
    variants[spec] = (float(lo), float(hi))
points = [(4, False), (6, False), (8, False), (3, True), (4, True)]
seeds = range(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
replays = {}
for rate, uniform in points:
    for seed in seeds:
        replays[rate, uniform, seed] = {r["request_id"]: r for r in run(rate, seed, False, uniform, f"{OUT}/off.json")["records"]}
print("variant point: refused, cost, precision, all_met (replay all_met) [gold silver bronze]")
for name, (lo, hi) in variants.items():
    hold_pace.HoldPace.__init__.__defaults__ = (lo, hi, 64, 16)
    from superinfer.slo import estimate
    estimate.HOST_COMMIT_SHARE = float(os.environ.get("HCS", "0.5"))
    estimate.KV_HEADROOM_PER_CLASS = float(os.environ.get("HEAD", "0.1"))
    for rate, uniform in points:
        tot = dict(ref=0, cost=0, adm=0, adm_met=0, n=0, met=0, rmet=0)
        cls = {}
        REASONS.clear()
        for seed in seeds:
            d = run(rate, seed, True, uniform, f"{OUT}/on.json")
            rep = replays[rate, uniform, seed]
            for r in d["records"]:
                tot["n"] += 1
                tot["rmet"] += met(rep[r["request_id"]])
                c = cls.setdefault(r.get("slo_class"), [0, 0])
                c[0] += 1; c[1] += met(r)
                if r["outcome"] == "rejected":
                    tot["ref"] += 1; tot["cost"] += met(rep[r["request_id"]])
                else:
                    tot["adm"] += 1; tot["adm_met"] += met(r); tot["met"] += met(r)
        print(f"{name:10s} {'uni' if uniform else 'cls'}{rate}: refused {tot['ref']:4d} cost {tot['cost']/max(1,tot['ref']):6.1%} "
              f"precision {tot['adm_met']/tot['adm']:6.2%} all_met {tot['met']/tot['n']:6.1%} ({tot['rmet']/tot['n']:6.1%}) "
              + " ".join(f"{k}:{v[1]/v[0]:.1%}" for k, v in cls.items() if k) + " " + str(dict(REASONS)), flush=True)
