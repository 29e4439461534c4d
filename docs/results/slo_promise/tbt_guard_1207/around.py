"""Every gap of one request in a `bench serve` result, with the requests whose first token
came at the end of the same step (their last prompt chunk was in it) and how many were
decoding then.

    python around.py /tmp/mt/r2/rotasched_rate6.json 86 8   # prompt tokens, max tokens
"""

import json
import sys
from pathlib import Path

path, num_prompt, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
records = json.loads(Path(path).read_text())["records"]
served = [r for r in records if r["status"] == 200 and r["token_times_s"]]
target = next(
    r for r in served if (r["prompt_tokens"], r["max_tokens"]) == (num_prompt, max_tokens)
)
times = target["token_times_s"]
print(f"arrival {target['arrival_s']:.3f} s, TTFT {(times[0] - target['arrival_s']) * 1000:.0f} ms")
for i, t in enumerate(times):
    gap = f"{(t - times[i - 1]) * 1000:4.0f} ms" if i else "   first"
    firsts = [(r["slo_class"], r["prompt_tokens"], round((r["token_times_s"][0] - r["arrival_s"]) * 1000))
              for r in served if r is not target and abs(r["token_times_s"][0] - t) < 0.004]  # fmt: skip
    num_decoding = sum(r["token_times_s"][0] < t - 0.004 <= r["token_times_s"][-1] for r in served)
    print(f"{i} {t:.3f} gap {gap}, {num_decoding} decoding, first tokens with it: {firsts}")
