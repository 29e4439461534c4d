"""TTFT of prompts of 250-1000 tokens on an idle server, streamed, 4 each (random words, so
no prefix-cache hits): python probe_ttft.py URL MODEL_NAME"""

import json
import random
import sys
import time

import httpx

url, model = sys.argv[1], sys.argv[2]
vocab = [
    "apple",
    "river",
    "stone",
    "cloud",
    "window",
    "music",
    "garden",
    "silver",
    "number",
    "orange",
    "paper",
    "light",
    "table",
]
rng = random.Random(0)
with httpx.Client(timeout=60) as client:
    for num_words in (250, 500, 750, 1000):
        ttfts, num_prompt = [], None
        for _ in range(4):
            prompt = " ".join(rng.choice(vocab) for _ in range(num_words))
            body = {"model": model, "prompt": prompt, "max_tokens": 2, "stream": True,
                    "temperature": 0, "stream_options": {"include_usage": True}}  # fmt: skip
            start = time.perf_counter()
            first = None
            with client.stream("POST", url + "/v1/completions", json=body) as response:
                for line in response.iter_lines():
                    if first is None and line.startswith("data:") and '"text"' in line:
                        first = (time.perf_counter() - start) * 1e3
                    if line.startswith("data:") and '"prompt_tokens"' in line:
                        num_prompt = (json.loads(line[5:]).get("usage") or {}).get("prompt_tokens")
            if first is not None:
                ttfts.append(first)
            time.sleep(0.3)
        print(num_words, num_prompt, [round(t) for t in ttfts], flush=True)
