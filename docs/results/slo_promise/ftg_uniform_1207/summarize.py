"""Condense `../ftg_bound_1207/rounds.sh uniform` result folders into runs.json and print the
per-run table and the means by arm (`../ftg_bound_1207/summarize.py`'s arms and functions).

    python summarize.py /tmp/mt fu1 fu2 ...   # every SYSTEM_rateR.json in /tmp/mt/fu1, ...
    python summarize.py                       # prints the tables from runs.json
"""

import importlib.util
import re
from pathlib import Path

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location(
    "ftg_summary", HERE.parent / "ftg_bound_1207" / "summarize.py"
)
ftg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ftg)
tbt = ftg.tbt


def arm(run: str, system: str) -> str:
    """As `../ftg_bound_1207/summarize.py`'s, for rounds named by any prefix (fu1, fu2...)."""
    return ftg.arm("r" + re.sub(r"^\D+", "", run), system)


tbt.arm = arm

if __name__ == "__main__":
    tbt.main(HERE / "runs.json")
