"""Condense the rounds' result folders into runs.json and print the per-run table and the
means by arm, with `../tbt_guard_1207/summarize.py`'s functions (this folder's arms:
`--reject-infeasible-tbt` as the plain system "rotasched" in odd rounds and as the variant
"chk" in even ones, the base the other way round).

    python summarize.py /tmp/mt tc1 tc2                     # the class mix, into runs.json
    python summarize.py --runs uniform_runs.json /tmp/mt tu1 tu2   # every request on 1 s / 200 ms
    python summarize.py [--runs uniform_runs.json]          # prints the tables
"""

import re
import runpy
from pathlib import Path

HERE = Path(__file__).parent
# ../ftg_bound_1207/summarize.py loads ../tbt_guard_1207/summarize.py as `tbt`
tbt = runpy.run_path(str(HERE.parent / "ftg_bound_1207" / "summarize.py"))["tbt"]


def arm(run: str, system: str) -> str:
    if system == "rotasched":  # the round's number after its prefix (tc1, tu2...)
        return "check" if int(re.sub(r"^\D+", "", run)) % 2 else "base"
    return {"chk": "check"}.get(system, system)


tbt.arm = arm

if __name__ == "__main__":
    tbt.main(HERE / "runs.json")
