"""The head-to-head: superinfer (rotasched, fcfs-recompute) against vLLM's CPU build, same
machine, same weights, same device KV capacity, same requests.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/run.py            # the full run
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/run.py --smoke    # 1 rate, 6 prompts
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/vs_vllm/run.py --dry-run  # print the commands

Steps (each skipped when already done):
1. install vLLM's CPU build in its own venv (`install_vllm.sh`; only when vLLM runs);
2. export superinfer's default model (the SmolLM2-135M-Instruct GGUF) to a Hugging Face
   directory (`export_hf.py`, which checks greedy outputs against superinfer's);
3. size both KV pools to the same number of tokens: superinfer's device pool from
   `--device-kv-gib` (default 0.125 GiB, its default) in bf16 at its block size, and vLLM's
   `--kv-cache-memory-bytes` to exactly that many tokens;
4. probe: start superinfer (rotasched) and vLLM side by side, measure the memory of each
   process tree and single-request TTFT/TPOT, alternating (`probe.py`), stop both;
5. sweep: `superinfer bench sweep` over the request rates, the systems alternating at each
   rate, each server started fresh for each point and stopped after it, the same ShareGPT
   requests (same seed) and SLO targets for all;
6. check from the server logs that each system ran with the KV capacity asked for.

Everything lands in --out (default docs/results/vs_vllm): the point JSONs, plots and
sweep.json of the sweep, probe.json, capacity.json, the server logs, and commands.txt with
every command line exactly as run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_SYSTEMS = "rotasched,fcfs-recompute,vllm"
DEFAULT_RATES = "1,1.5,2,2.5,3,4"
SUPERINFER_BLOCK_SIZE = 16  # superinfer's default (--block-size)
VLLM_BLOCK_SIZE = 32  # the smallest its CPU attention takes (multiples of 32); default 128
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--out", default=None, help="result folder (default docs/results/vs_vllm; "
                   "--smoke: /tmp/vs_vllm_smoke)")  # fmt: skip
    p.add_argument("--systems", default=DEFAULT_SYSTEMS,
                   help="comma-separated: superinfer policies and/or 'vllm' (default: %(default)s)")  # fmt: skip
    p.add_argument("--rates", default=DEFAULT_RATES, help="request rates, req/s (%(default)s)")
    p.add_argument("--duration", type=float, default=120.0,
                   help="seconds of Poisson arrivals per point (default: %(default)s)")  # fmt: skip
    p.add_argument("--num-prompts", type=int, default=None,
                   help="a fixed number of requests per point instead of --duration")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="ShareGPT sampling and arrivals seed")
    p.add_argument("--ttft-slo-ms", type=float, default=1000.0)
    p.add_argument("--tbt-slo-ms", type=float, default=200.0, help="TPOT is judged against it")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the requests' sampling temperature (the OpenAI default is 1)")  # fmt: skip
    p.add_argument("--slo-classes", default=None,
                   help="a class mix (e.g. gold=0.2,silver=0.3,bronze=0.5) on superinfer's default "
                   "classes instead of one TTFT/TBT target for all; vLLM then runs its priority "
                   "scheduler and each request carries its class's rank as priority")  # fmt: skip
    p.add_argument("--refusal-replay", action="store_true",
                   help="also run the first superinfer policy with admission off "
                   "(--no-reject-infeasible-ttft --no-reject-infeasible-tbt), as system "
                   "POLICY-no-admission: the replay `superinfer bench refusal-cost` compares with")  # fmt: skip
    p.add_argument("--variant", action="append", default=[], metavar="NAME=ARGS",
                   help="also run the first superinfer policy with these extra `superinfer serve` "
                   "arguments, as system NAME (repeatable), e.g. shaped=--tbt-shaped-steps")  # fmt: skip
    p.add_argument("--endpoint", default="/v1/chat/completions",
                   help="chat: the ShareGPT turn goes through each server's chat template")  # fmt: skip
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="both engines' weights and KV (%(default)s); float32 on a CPU without "
                   "native bf16 (no AVX-512 BF16 or AMX), where bf16 GEMMs are emulated and "
                   "several times slower")  # fmt: skip
    p.add_argument("--device-kv-gib", type=float, default=0.125,
                   help="superinfer's device pool (its default); vLLM gets as many tokens")  # fmt: skip
    p.add_argument("--host-kv-gib", type=float, default=0.125, help="superinfer's host pool")
    p.add_argument("--vllm-block-size", type=int, default=VLLM_BLOCK_SIZE)
    p.add_argument("--match-batching", action="store_true",
                   help="give vLLM superinfer's step limits (--max-num-batched-tokens 512 "
                   "--max-num-seqs 64) instead of its CPU defaults (2048, 128)")  # fmt: skip
    p.add_argument("--enforce-eager", action="store_true",
                   help="vLLM without torch.compile (starts in ~30 s instead of 1-3 min)")  # fmt: skip
    p.add_argument("--vllm-aot-compile", action="store_true",
                   help="keep vLLM's AOT compile cache on (it recompiles at every start here)")  # fmt: skip
    p.add_argument("--vllm-args", default="", help="more `vllm serve` arguments")
    p.add_argument("--superinfer-args", default="", help="more `superinfer serve` arguments")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the whole sweep this many times (rep1, rep2, ... subfolders)")  # fmt: skip
    p.add_argument("--vllm-venv", default=os.environ.get("VLLM_VENV", "/work/vllm-venv"))
    p.add_argument("--model-dir", default="/work/models/smollm2-135m-instruct-hf",
                   help="where the exported Hugging Face model goes")  # fmt: skip
    p.add_argument("--no-probe", dest="probe", action="store_false",
                   help="skip the single-request probe")  # fmt: skip
    p.add_argument("--probe-only", action="store_true", help="run the probe, no sweep")
    p.add_argument("--smoke", action="store_true",
                   help="a quick check of the pipeline: rate 1, 6 prompts, no probe")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = p.parse_args()
    if args.smoke:
        args.rates, args.num_prompts, args.probe = "1", args.num_prompts or 6, False
        args.out = args.out or "/tmp/vs_vllm_smoke"
    args.out = Path(args.out or REPO / "docs" / "results" / "vs_vllm").resolve()
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    return args


# --- setup ----------------------------------------------------------------------------------
def install_command(args: argparse.Namespace) -> list[str]:
    return ["env", f"VLLM_VENV={args.vllm_venv}", "bash", str(HERE / "install_vllm.sh")]


def export_command(args: argparse.Namespace) -> list[str]:
    return [sys.executable, str(HERE / "export_hf.py"), "--out", args.model_dir]


def kv_capacity(args: argparse.Namespace) -> dict:
    """superinfer's device pool in tokens (--dtype, its block size) and vLLM's bytes for it."""
    with open(Path(args.model_dir) / "config.json") as f:
        config = json.load(f)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * head_dim
    per_token *= DTYPE_BYTES[args.dtype]
    blocks = int(args.device_kv_gib * 2**30 // (SUPERINFER_BLOCK_SIZE * per_token))
    tokens = blocks * SUPERINFER_BLOCK_SIZE
    if tokens % args.vllm_block_size:
        raise SystemExit(
            f"superinfer's pool of {tokens} tokens is no whole number of vLLM blocks of "
            f"{args.vllm_block_size}: pick another --device-kv-gib or --vllm-block-size"
        )
    return {
        "kv_bytes_per_token": per_token,
        "superinfer_device_blocks": blocks,
        "superinfer_block_size": SUPERINFER_BLOCK_SIZE,
        "tokens": tokens,
        "vllm_block_size": args.vllm_block_size,
        "vllm_blocks": tokens // args.vllm_block_size,
        "vllm_kv_cache_memory_bytes": tokens * per_token,
    }


def superinfer_args(args: argparse.Namespace) -> list[str]:
    return [
        "--model", args.model_dir, "--dtype", args.dtype, "--device", "cpu",
        "--device-kv-gib", f"{args.device_kv_gib:g}", "--host-kv-gib", f"{args.host_kv_gib:g}",
        "--max-model-len", str(args.max_model_len), "-v", *shlex.split(args.superinfer_args),
    ]  # fmt: skip


def vllm_command(args: argparse.Namespace, capacity: dict, port: str) -> list[str]:
    argv = [
        "env", "VLLM_TARGET_DEVICE=cpu", "VLLM_CPU_OMP_THREADS_BIND=0-1", "HF_HUB_OFFLINE=1",
        # vLLM's AOT compile cache fails to load with this torch ("'function' object has no
        # attribute 'finalize_loading'") and recompiles at every start; torch.compile's own
        # cache works: ~60 s starts instead of ~130 s, same compiled model
        f"VLLM_USE_AOT_COMPILE={int(args.vllm_aot_compile)}",
        f"{args.vllm_venv}/bin/vllm", "serve", args.model_dir, "--host", "127.0.0.1",
        "--port", port, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
        "--block-size", str(args.vllm_block_size),
        "--kv-cache-memory-bytes", str(capacity["vllm_kv_cache_memory_bytes"]),
    ]  # fmt: skip
    if args.match_batching:
        argv += ["--max-num-batched-tokens", "512", "--max-num-seqs", "64"]
    if args.enforce_eager:
        argv.append("--enforce-eager")
    if args.slo_classes:
        argv += ["--scheduling-policy", "priority"]
    return argv + shlex.split(args.vllm_args)


def variant_command(args: argparse.Namespace, policy: str, extra: list[str]) -> list[str]:
    """`superinfer serve` of `policy` with `extra` arguments (the port left as PORT)."""
    return [
        str(REPO / ".venv" / "bin" / "superinfer"), "serve", *superinfer_args(args),
        "--policy", policy, *extra, "--host", "127.0.0.1", "--port", "PORT",
    ]  # fmt: skip


def sweep_command(args: argparse.Namespace, capacity: dict, out: Path) -> list[str]:
    argv = [str(REPO / ".venv" / "bin" / "superinfer"), "bench", "sweep", "--output-dir", str(out)]
    for system in args.systems:
        if system == "vllm":
            template = shlex.join(vllm_command(args, capacity, "PORT")).replace("PORT", "{port}")
            argv += ["--command", f"vllm={template}"]
        else:
            argv += ["--system", system]
    policies = [s for s in args.systems if s != "vllm"]
    variants = [tuple(v.split("=", 1)) for v in args.variant]
    if args.refusal_replay:  # the estimate's refusals off: the replay refusal cost compares with
        variants.append((f"{policies[0]}-no-admission",
                         "--no-reject-infeasible-ttft --no-reject-infeasible-tbt"))
    for name, extra in variants if policies else []:
        command = variant_command(args, policies[0], shlex.split(extra))
        argv += ["--command", f"{name}={shlex.join(command).replace('PORT', '{port}')}"]
    argv += [
        "--server-args", shlex.join(superinfer_args(args)),
        "--request-rates", args.rates,
        "--dataset-name", "sharegpt", "--tokenizer", args.model_dir, "--seed", str(args.seed),
        # room for the chat template (~35 tokens) inside max_model_len
        "--max-total-tokens", str(args.max_model_len - 64),
        "--endpoint", args.endpoint,
        "--num-warmups", "2", "--disable-tqdm", "--temperature", f"{args.temperature:g}",
    ]  # fmt: skip
    if args.slo_classes:  # the default classes' own targets; vLLM gets the ranks as priority
        argv += ["--slo-classes", args.slo_classes, "--send-priority"]
    else:
        argv += ["--ttft-slo-ms", f"{args.ttft_slo_ms:g}", "--tbt-slo-ms", f"{args.tbt_slo_ms:g}"]
    if args.num_prompts:
        argv += ["--num-prompts", str(args.num_prompts)]
    else:
        argv += ["--duration", f"{args.duration:g}"]
    return argv


# --- servers for the probe ------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """A server in its own process group: started, waited for, stopped with its children."""

    def __init__(self, name: str, argv: list[str], port: int, log: Path) -> None:
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self.process: subprocess.Popen | None = None
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._start_time = time.monotonic()

    def wait_healthy(self, timeout_s: float = 900.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}, see "
                                   f"{self.log}")  # fmt: skip
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    self.startup_s = time.monotonic() - self._start_time
                    return
            except httpx.TransportError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s:.0f} s")

    def stop(self) -> None:
        """SIGTERM the server, then whatever of its process group outlives it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(90)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            os.killpg(self.process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(5)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
            print(f"{self.name}: killed processes left behind by the server", file=sys.stderr)
        except ProcessLookupError:
            pass


def run_probe(args: argparse.Namespace, capacity: dict, out: Path) -> list[list[str]]:
    """Start superinfer and vLLM side by side, probe them alternately, stop both."""
    servers = []
    if any(s != "vllm" for s in args.systems):
        port = free_port()
        policy = next(s for s in args.systems if s != "vllm")
        argv = [str(REPO / ".venv" / "bin" / "superinfer"), "serve", "--port", str(port),
                "--policy", policy, *superinfer_args(args)]  # fmt: skip
        servers.append(Server(f"superinfer-{policy}", argv, port, out / "probe_superinfer.log"))
    if "vllm" in args.systems:
        port = free_port()
        argv = vllm_command(args, capacity, str(port))
        servers.append(Server("vllm", argv, port, out / "probe_vllm.log"))
    probe = [sys.executable, str(HERE / "probe.py"), "--tokenizer", args.model_dir,
             "--requests", "5", "--prompt-tokens", "256", "--output-tokens", "64",
             "--json", str(out / "probe.json")]  # fmt: skip
    try:
        for server in servers:  # one after the other: start-up is CPU-bound
            server.start()
            server.wait_healthy()
            print(f"{server.name} healthy after {server.startup_s:.0f} s", file=sys.stderr)
        for server in servers:
            probe += ["--target", f"{server.name}={server.url}@{server.process.pid}"]
        subprocess.run(probe, check=True)
    finally:
        for server in servers:
            server.stop()
    with open(out / "probe.json") as f:
        result = json.load(f)
    for server in servers:
        result["servers"][server.name]["startup_s"] = server.startup_s
    result["meta"]["loadavg_after"] = os.getloadavg()
    with open(out / "probe.json", "w") as f:
        json.dump(result, f, indent=1)
    return [server.argv for server in servers] + [probe]


# --- after the sweep ------------------------------------------------------------------------
def logged_capacities(out: Path) -> dict[str, list[int]]:
    """KV capacity in tokens as each server logged it, per server log of the sweep."""
    found: dict[str, list[int]] = {}
    for log in sorted(out.glob("*.server.log")) + sorted(out.glob("probe_*.log")):
        text = log.read_text(errors="replace")
        m = re.search(r"CPU KV cache size: ([\d,]+) tokens", text)
        if m:
            found[log.name] = [int(m.group(1).replace(",", ""))]
        m = re.search(r"engine ready: .*?, (\d+) device blocks", text)
        if m:
            found[log.name] = [int(m.group(1)) * SUPERINFER_BLOCK_SIZE]
    return found


def versions(args: argparse.Namespace) -> dict[str, str]:
    def run(argv: list[str]) -> str:
        try:
            env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
            done = subprocess.run(
                argv, check=False, capture_output=True, text=True, timeout=120, env=env
            )
            return done.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"

    code = "import importlib.metadata as m; print(m.version('{}'), m.version('torch'))"
    return {
        "superinfer_commit": run(["git", "-C", str(REPO), "rev-parse", "HEAD"]),
        "superinfer_changes": run(["git", "-C", str(REPO), "status", "--porcelain", "superinfer"])
        or "none",
        "superinfer+torch": run([sys.executable, "-c", code.format("superinfer")]),
        "vllm+torch": run([f"{args.vllm_venv}/bin/python", "-c", code.format("vllm")]),
        "python": platform.python_version(),
        "cpu": run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"]),
        "cores": str(os.cpu_count()),
    }


def write_commands(path: Path, sections: list[tuple[str, list[list[str]]]], meta: dict) -> None:
    with open(path, "w") as f:
        f.write("# benchmarks/vs_vllm/run.py: every command as run (shell-quoted)\n")
        f.writelines(f"# {key}: {value}\n" for key, value in meta.items())
        for title, commands in sections:
            f.write(f"\n## {title}\n")
            f.writelines(shlex.join(argv) + "\n" for argv in commands)


def main() -> int:
    args = parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    sections: list[tuple[str, list[list[str]]]] = []
    install = [install_command(args)] if "vllm" in args.systems else []  # superinfer alone: none
    export = export_command(args)
    setup = [*install, export]
    if args.dry_run:
        for argv in setup:
            print(shlex.join(argv))
    else:
        for argv in install:
            subprocess.run(argv, check=True)
        if not (Path(args.model_dir) / "superinfer_export.json").is_file():
            subprocess.run(export, check=True)
    sections.append(("setup (each skips itself when done)", setup))

    capacity = kv_capacity(args)
    print(f"KV capacity: superinfer {capacity['superinfer_device_blocks']} blocks x "
          f"{SUPERINFER_BLOCK_SIZE} = {capacity['tokens']} tokens ({args.device_kv_gib:g} GiB, "
          f"{args.dtype}, {capacity['kv_bytes_per_token']} B/token); vLLM {capacity['vllm_blocks']} "
          f"blocks x {args.vllm_block_size} = {capacity['tokens']} tokens "
          f"(--kv-cache-memory-bytes {capacity['vllm_kv_cache_memory_bytes']})")  # fmt: skip
    outs = (
        [args.out] if args.repeats == 1 else [args.out / f"rep{i + 1}" for i in range(args.repeats)]
    )
    sweeps = [sweep_command(args, capacity, out) for out in outs]
    if args.dry_run:
        for argv in sweeps:
            print(shlex.join(argv))
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg": os.getloadavg(),
            **versions(args)}  # fmt: skip
    if args.probe or args.probe_only:
        sections.append(("probe: unloaded single requests (both servers up, alternating)",
                         run_probe(args, capacity, args.out)))  # fmt: skip
    if not args.probe_only:
        sections.append(("sweep", sweeps))
        write_commands(args.out / "commands.txt", sections, meta)
        for out, argv in zip(outs, sweeps):
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "sweep_stdout.txt", "w") as log:
                subprocess.run(argv, check=True, stdout=log)
            print((out / "sweep_stdout.txt").read_text())
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    meta["loadavg_at_end"] = os.getloadavg()
    write_commands(args.out / "commands.txt", sections, meta)

    logged = {}
    for out in {args.out, *outs}:
        logged.update(logged_capacities(out))
    mismatched = {log: t for log, t in logged.items() if t != [capacity["tokens"]]}
    with open(args.out / "capacity.json", "w") as f:
        json.dump({**capacity, "logged_tokens": logged, "mismatched": mismatched}, f, indent=1)
    if mismatched:
        print(f"KV capacity differs from {capacity['tokens']} tokens in: {mismatched}",
              file=sys.stderr)  # fmt: skip
        return 1
    print(f"every server ran with {capacity['tokens']} KV tokens ({len(logged)} logs); "
          f"results in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
