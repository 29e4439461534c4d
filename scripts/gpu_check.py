"""One-shot CUDA check (run on a GPU machine): decode speed of the model with random
SmolLM2-135M weights in bf16 on the paged cache, through the real ModelRunner and CUDA transfer engine."""
import time

import torch

from superinfer.model.config import ModelConfig
from superinfer.model.llama import LlamaForCausalLM
from superinfer.engine.kv_cache import KVCacheTiers
from superinfer.engine.transfer import create_transfer_engine
from superinfer.engine.model_runner import ModelRunner
from superinfer.core.outputs import ScheduledSequence, SchedulerOutput
from superinfer.sampling_params import SamplingParams
dev = torch.device("cuda")
cfg = ModelConfig(hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
                  head_dim=64, vocab_size=49152, rope_theta=100000.0, max_position_embeddings=8192,
                  tie_word_embeddings=True)
model = LlamaForCausalLM(cfg).to(dev, torch.bfloat16).eval()
kv = KVCacheTiers.allocate(4096, 4096, 30, 16, 3, 64, torch.bfloat16, dev)
transfer = create_transfer_engine(kv)
runner = ModelRunner(model, kv, 16, dev, transfer=transfer)
greedy = SamplingParams(temperature=0, max_tokens=1000)
for batch in (1, 8, 32):
    ctx = 256
    tables = [list(range(i * 24, i * 24 + 24)) for i in range(batch)]
    def out(n, start, toks):
        return SchedulerOutput(0, [ScheduledSequence(f"r{i}", toks, start, tables[i], True, greedy, 0) for i in range(batch)])
    runner.execute(SchedulerOutput(0, [ScheduledSequence(f"r{i}", [5] * ctx, 0, tables[i], True, greedy, 0) for i in range(batch)]))
    for _ in range(5):
        runner.execute(out(1, ctx, [7]))
    torch.cuda.synchronize(); t = time.perf_counter(); n = 50
    for k in range(n):
        runner.execute(out(1, ctx + k, [7]))
    torch.cuda.synchronize(); el = time.perf_counter() - t
    print(f"decode batch {batch}: {1000*el/n:.2f} ms/step, {batch*n/el:.0f} tok/s")
transfer.close()
