"""Condense `rounds.sh`'s result folders into runs.json and print the per-run table and the
means by arm, with `../tbt_guard_1207/summarize.py`'s functions (this folder's arms:
`--first-token-guard` as the plain system "rotasched" in odd rounds and as the variant
"ftg" in even ones, the base the other way round).

    python summarize.py /tmp/mt f1 f2 ...   # every SYSTEM_rateR.json in /tmp/mt/f1, ...
    python summarize.py                     # prints the tables from runs.json
    python summarize.py --runs ../ftg_uniform_1207/runs.json [/tmp/mt fu1 ...]   # another
"""

import importlib.util
import re
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "tbt_summary", HERE.parent / "tbt_guard_1207" / "summarize.py"
)
tbt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tbt)


def arm(run: str, system: str) -> str:
    if system == "rotasched":  # the round's number after its prefix (f1, g2, fu3...)
        return "guard" if int(re.sub(r"^\D+", "", run)) % 2 else "base"
    return {"ftg": "guard"}.get(system, system)


tbt.arm = arm

if __name__ == "__main__":
    tbt.main(HERE / "runs.json")
