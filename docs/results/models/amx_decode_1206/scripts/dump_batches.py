# see ../README.md; BATCHES (default /tmp/batches.json): the batches dump_batches.py writes
import json, os
os.environ["HF_HUB_OFFLINE"] = "1"
from transformers import AutoTokenizer
from superinfer.workload.datasets import sample_sharegpt
tok = AutoTokenizer.from_pretrained("/work/models/smollm2-135m-instruct-hf")
reqs, _ = sample_sharegpt(tok, 32 * 3, seed=0, max_prompt_tokens=512)
json.dump([{"p": tok(r.prompt)["input_ids"], "n": min(r.num_output_tokens, 128)} for r in reqs], open(os.environ.get("BATCHES", "/tmp/batches.json"), "w"))
