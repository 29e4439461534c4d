"""Perplexity and greedy identity with activations fake-quantized per 32-block to int8 (Q8_1)."""
import sys, math, torch, json
from superinfer import LLM, SamplingParams
from superinfer.model import cpu_q4, quant
from superinfer.workload.datasets import sample_sharegpt
MODE = sys.argv[1]  # base | q8
orig = cpu_q4.Q4Kernel.__call__
def fq(x):
    xf = x.float().view(x.shape[0], -1, 32)
    d = xf.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(xf / torch.where(d > 0, d, 1)), 0).clamp(-127, 127)
    return (q * d).view(x.shape).to(torch.bfloat16)   # note: real kernel uses exact q*d in f32
def call(self, x, w):
    if MODE == "q8":
        x = fq(x.contiguous())
    return orig(self, x, w)
cpu_q4.Q4Kernel.__call__ = call
llm = LLM(num_device_blocks=2048, enable_prefix_caching=False)
for m in llm.llm_engine.runner.model.modules() if hasattr(llm, "llm_engine") else []:
    pass
tok = llm.get_tokenizer()
# all steps through the GEMM path
n = 0
ALL = len(sys.argv) > 2 and sys.argv[2] == "all"
for obj in llm.engine.runner.model.modules():
    if ALL and isinstance(obj, quant.Int4Linear) and obj.q4 is not None:
        obj.max_int4_rows = 0; n += 1
print("linears on GEMM path:", n)
sampled, _ = sample_sharegpt(tok, 400, seed=7, max_prompt_tokens=1024)
texts, cur = [], []
for r in sampled:
    cur += tok(r.prompt)["input_ids"]
    if len(cur) >= 512:
        texts.append(cur[:512]); cur = []
    if len(texts) == 24: break
outs = llm.generate([{"prompt_token_ids": t} for t in texts], SamplingParams(max_tokens=1, prompt_logprobs=0))
nll, cnt = 0.0, 0
for o in outs:
    for lp in o.prompt_logprobs[1:]:
        nll -= lp.logprob; cnt += 1
print(f"{MODE}: perplexity {math.exp(nll/cnt):.4f} over {cnt} tokens")
chats, _ = sample_sharegpt(tok, 16, seed=3, max_prompt_tokens=400)
prompts = [tok.apply_chat_template([{"role": "user", "content": c.prompt}], tokenize=False, add_generation_prompt=True) for c in chats]
g = llm.generate(prompts, SamplingParams(max_tokens=48, temperature=0))
json.dump([x.outputs[0].token_ids for x in g], open(f"/tmp/prof/greedy_{MODE}{sys.argv[2] if len(sys.argv)>2 else ''}.json", "w"))
