"""lm-eval (EleutherAI's lm-evaluation-harness, a client nobody here wrote) against
`superinfer serve`, compared with lm-eval's own `hf` model on the same weights.

Two tasks on a small local dataset written by this script (no downloads; HF_HUB_OFFLINE=1,
HF_DATASETS_OFFLINE=1):

* `si_mc`: 20 multiple-choice questions, a log-likelihood task (`output_type:
  multiple_choice`, metrics acc and acc_norm), run through lm-eval's `local-completions`
  model: /v1/completions with `echo: true, logprobs: 1, max_tokens: 1` on token-id prompts
  (lm-eval tokenizes with the HF tokenizer of the exported folder);
* `si_gen`: 10 short questions, a generation task (`generate_until`, greedy, stop at a
  newline, 24 tokens at most, metric exact_match), run through `local-chat-completions`
  with `--apply_chat_template` (the server applies the model's chat template).

The same two tasks then run through lm-eval's `hf` model on the exported Hugging Face folder
(benchmarks/vs_vllm/export_hf.py writes it from the GGUF; it is made if missing), with the
server's dtype. The report compares the scores and every sample: the log-likelihood of each
choice (max |difference|), whether each choice was greedy, and each generated text.

lm-eval lives in its own venv (default /work/lmeval-venv; --install makes it with a CPU torch
and transformers for the `hf` reference, pinned by constraints/cpu.txt); it talks to the
server over HTTP only. This driver needs only the standard library:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/clients/lm_eval_check.py --install \
        --dtypes bfloat16,float32 --out docs/results/clients

writes lm_eval.json (scores, per-sample differences, commands, versions) and lm_eval.md.
Exit status 0 when every dtype's scores are equal.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from common import free_port, offline_env, superinfer_source

REPO = Path(__file__).resolve().parents[2]
DEFAULT_HF = "/work/models/smollm2-135m-instruct-hf"

# --- the dataset -------------------------------------------------------------------------
# 20 multiple-choice items: question, 4 choices, index of the right one.
MC_ITEMS = [
    ("What is the capital of France?", ["Paris", "London", "Berlin", "Madrid"], 0),
    ("How many legs does a spider have?", ["six", "eight", "ten", "four"], 1),
    ("What color is the sky on a clear day?", ["green", "red", "blue", "yellow"], 2),
    ("Which planet is closest to the Sun?", ["Venus", "Earth", "Mars", "Mercury"], 3),
    ("What is 2 plus 2?", ["four", "five", "three", "six"], 0),
    ("Which animal is known as the king of the jungle?", ["tiger", "lion", "bear", "wolf"], 1),
    ("What do bees make?", ["milk", "silk", "honey", "wax paper"], 2),
    ("Which gas do plants take in from the air?", ["oxygen", "helium", "nitrogen",
                                                   "carbon dioxide"], 3),
    ("What is frozen water called?", ["ice", "steam", "sand", "glass"], 0),
    ("How many days are in a week?", ["five", "seven", "ten", "twelve"], 1),
    ("What is the largest ocean on Earth?", ["Atlantic", "Indian", "Pacific", "Arctic"], 2),
    ("Which language is spoken in Brazil?", ["Spanish", "French", "English",
                                             "Portuguese"], 3),
    ("What is the boiling point of water at sea level in Celsius?", ["100 degrees",
                                                                     "50 degrees",
                                                                     "0 degrees",
                                                                     "200 degrees"], 0),
    ("Who wrote Romeo and Juliet?", ["Charles Dickens", "William Shakespeare", "Mark Twain",
                                     "Jane Austen"], 1),
    ("What is the chemical symbol for gold?", ["Ag", "Fe", "Au", "Pb"], 2),
    ("Which organ pumps blood through the body?", ["lungs", "liver", "brain", "heart"], 3),
    ("What is the opposite of hot?", ["cold", "warm", "bright", "loud"], 0),
    ("How many continents are there?", ["five", "seven", "nine", "three"], 1),
    ("What do cows drink?", ["milk", "juice", "water", "tea"], 2),
    ("Which shape has three sides?", ["square", "circle", "pentagon", "triangle"], 3),
]
# 10 short generation items: question, expected answer (exact match, case-insensitive).
GEN_ITEMS = [
    ("What is the capital of France? Answer with one word.", "Paris"),
    ("What is 3 + 4? Answer with a number only.", "7"),
    ("What color is grass? Answer with one word.", "Green"),
    ("What is the opposite of up? Answer with one word.", "Down"),
    ("How many hours are in a day? Answer with a number only.", "24"),
    ("What is the capital of Japan? Answer with one word.", "Tokyo"),
    ("What is 10 minus 3? Answer with a number only.", "7"),
    ("Name the largest planet in our solar system. Answer with one word.", "Jupiter"),
    ("What animal says moo? Answer with one word.", "Cow"),
    ("What is the capital of Italy? Answer with one word.", "Rome"),
]

MC_YAML = """task: si_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
GEN_YAML = """task: si_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
  temperature: 0.0
filter_list:
  - name: last_word
    filter:
      - function: regex
        regex_pattern: "(\\\\w+)\\\\W*$"
        group_select: 0
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: true
metadata:
  version: 1.0
"""
MAX_GEN_TOKS = 24


def write_tasks(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "mc.jsonl", "w") as f:
        for q, choices, answer in MC_ITEMS:
            f.write(json.dumps({"question": q, "choices": choices, "answer": answer}) + "\n")
    with open(folder / "gen.jsonl", "w") as f:
        for q, answer in GEN_ITEMS:
            f.write(json.dumps({"question": q, "answer": answer}) + "\n")
    (folder / "si_mc.yaml").write_text(MC_YAML.format(data=folder / "mc.jsonl"))
    (folder / "si_gen.yaml").write_text(
        GEN_YAML.format(data=folder / "gen.jsonl", max_gen_toks=MAX_GEN_TOKS)
    )


# --- environment -------------------------------------------------------------------------


def install_lmeval(venv: Path, log: Path) -> dict:
    """A venv with lm-eval (and torch+transformers for the hf reference), CPU torch pinned."""
    constraints = REPO / "constraints" / "cpu.txt"
    si_python = sys.executable
    transformers_version = subprocess.run(
        [si_python, "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True, text=True, check=True).stdout.strip()
    info: dict = {"venv": str(venv)}
    if (venv / "bin" / "lm_eval").exists():
        info["already_installed"] = True
    else:
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "--disable-pip-version-check", "install",
               "-c", str(constraints)]
        t0 = time.perf_counter()
        with open(log, "w") as f:
            subprocess.run([*pip, "lm-eval[api]"], stdout=f, stderr=f, check=True)
        info["lm_eval_install_s"] = round(time.perf_counter() - t0, 1)
        info["lm_eval_only_size_mib"] = du_mib(venv)
        t0 = time.perf_counter()
        with open(log, "a") as f:
            subprocess.run([*pip, "torch==2.13.0+cpu", f"transformers=={transformers_version}",
                            "accelerate"], stdout=f, stderr=f, check=True)
        info["hf_extras_install_s"] = round(time.perf_counter() - t0, 1)
    info["size_mib"] = du_mib(venv)
    return info


def du_mib(path: Path) -> int:
    out = subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0])


def versions(venv: Path) -> dict:
    code = ("import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
            "['lm_eval', 'torch', 'transformers', 'datasets']}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                         text=True, check=True).stdout
    v = json.loads(out)
    si = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; "
                         "print(m.version('superinfer'))"], capture_output=True, text=True)
    v["superinfer"] = si.stdout.strip()
    v["superinfer_commit"] = os.environ.get("SUPERINFER_COMMIT") or subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                            capture_output=True, text=True).stdout.strip()
    v["superinfer_source"] = superinfer_source()
    v["python"] = platform.python_version()
    return v






class Server:
    def __init__(self, dtype: str, log: Path, extra: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "superinfer.cli", "serve", "--port", str(self.port),
                    "--device", "cpu", "--dtype", dtype, "--seed", "0", *extra]
        self.log = log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        self.fh = open(self.log, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=self.log.parent, env=offline_env(), stdout=self.fh,
                                     stderr=self.fh)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited during boot, see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"server not healthy in 600 s, see {self.log}")
        with urllib.request.urlopen(self.url + "/v1/models", timeout=10) as r:
            self.model = json.load(r)["data"][0]["id"]
        return self

    def __exit__(self, *exc) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.fh.close()


# --- running lm-eval ---------------------------------------------------------------------
def lm_eval(venv: Path, model: str, model_args: str, task: str, tasks_dir: Path, out: Path,
            extra: list[str], commands: list[str]) -> dict:
    cmd = [str(venv / "bin" / "lm_eval"), "run", "--model", model, "--model_args", model_args,
           "--tasks", task, "--include_path", str(tasks_dir), "--output_path", str(out),
           "--log_samples", "--seed", "0", *extra]
    commands.append(" ".join(cmd))
    t0 = time.perf_counter()
    if not done(out):
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "lm_eval.log", "w") as f:
            rc = subprocess.run(cmd, env=offline_env(), stdout=f, stderr=f, cwd=out).returncode
        if rc != 0:
            raise SystemExit(f"lm_eval failed ({rc}), see {out / 'lm_eval.log'}")
    (results_file,) = glob.glob(str(out / "**" / "results_*.json"), recursive=True)
    (samples_file,) = glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True)
    with open(results_file) as f:
        results = json.load(f)["results"][task]
    with open(samples_file) as f:
        samples = sorted((json.loads(line) for line in f), key=lambda s: s["doc_id"])
    return {"results": results, "samples": samples,
            "wall_s": round(time.perf_counter() - t0, 1)}


def done(out: Path) -> bool:
    """lm-eval already wrote its results there (--keep-work reuses them)."""
    return bool(glob.glob(str(out / "**" / "results_*.json"), recursive=True))


def scores(run: dict) -> dict:
    return {k.split(",")[0]: v for k, v in run["results"].items()
            if "," in k and "stderr" not in k}


def compare_mc(a: dict, b: dict) -> dict:
    max_diff, greedy_mismatch, pred_mismatch = 0.0, 0, 0
    for sa, sb in zip(a["samples"], b["samples"], strict=True):
        lls_a = [float(r[0][0]) for r in sa["resps"]]  # the samples file holds strings
        lls_b = [float(r[0][0]) for r in sb["resps"]]
        greedy_mismatch += sum(r[0][1] != s[0][1] for r, s in zip(sa["resps"], sb["resps"]))
        max_diff = max(max_diff, *(abs(x - y) for x, y in zip(lls_a, lls_b)))
        pred_mismatch += int(max(range(len(lls_a)), key=lls_a.__getitem__)
                             != max(range(len(lls_b)), key=lls_b.__getitem__))
    return {"max_abs_loglikelihood_diff": max_diff, "greedy_flag_mismatches": greedy_mismatch,
            "argmax_choice_mismatches": pred_mismatch,
            "choices": sum(len(s["resps"]) for s in a["samples"])}


def compare_gen(a: dict, b: dict) -> dict:
    diffs = []
    for sa, sb in zip(a["samples"], b["samples"], strict=True):
        ra, rb = sa["resps"][0][0], sb["resps"][0][0]
        if ra != rb:
            diffs.append({"doc_id": sa["doc_id"], "superinfer": ra, "hf": rb})
    return {"text_mismatches": len(diffs), "items": len(a["samples"]), "mismatches": diffs,
            "superinfer_texts": [s["resps"][0][0] for s in a["samples"]]}


def run_dtype(dtype: str, args, tasks_dir: Path, work: Path, commands: list[str]) -> dict:
    venv = Path(args.lmeval_venv)
    work = work / dtype
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"dtype": dtype}
    server = Server(dtype, work / "server.log", args.server_args)
    commands.append("HF_HUB_OFFLINE=1 " + " ".join(server.cmd))
    # with --keep-work, the outputs of an earlier run in --work are read, not run again
    reuse = done(work / "si_mc_superinfer") and done(work / "si_gen_superinfer")
    with contextlib.nullcontext() if reuse else server:
        if reuse:
            server.model = "SmolLM2-135M-Instruct"
        res["server_model"] = server.model
        comp_args = (f"model={server.model},base_url={server.url}/v1/completions,"
                     f"tokenizer_backend=huggingface,tokenizer={args.hf_dir},"
                     "tokenized_requests=True,num_concurrent=1,max_retries=1,timeout=600")
        res["si_mc"] = lm_eval(venv, "local-completions", comp_args, "si_mc", tasks_dir,
                               work / "si_mc_superinfer", [], commands)
        chat_args = (f"model={server.model},base_url={server.url}/v1/chat/completions,"
                     "num_concurrent=1,max_retries=1,timeout=600")
        res["si_gen"] = lm_eval(venv, "local-chat-completions", chat_args, "si_gen", tasks_dir,
                                work / "si_gen_superinfer", ["--apply_chat_template"], commands)
    hf_args = f"pretrained={args.hf_dir},dtype={dtype}"
    res["hf_mc"] = lm_eval(venv, "hf", hf_args, "si_mc", tasks_dir, work / "si_mc_hf",
                           ["--batch_size", "1", "--device", "cpu"], commands)
    res["hf_gen"] = lm_eval(venv, "hf", hf_args, "si_gen", tasks_dir, work / "si_gen_hf",
                            ["--batch_size", "1", "--device", "cpu", "--apply_chat_template"],
                            commands)
    summary = {
        "dtype": dtype,
        "scores": {
            "si_mc": {"superinfer (local-completions)": scores(res["si_mc"]),
                      "hf": scores(res["hf_mc"])},
            "si_gen": {"superinfer (local-chat-completions)": scores(res["si_gen"]),
                       "hf": scores(res["hf_gen"])},
        },
        "mc_samples": compare_mc(res["si_mc"], res["hf_mc"]),
        "gen_samples": compare_gen(res["si_gen"], res["hf_gen"]),
        "wall_s": {k: res[k]["wall_s"] for k in ("si_mc", "si_gen", "hf_mc", "hf_gen")},
    }
    summary["scores_equal"] = (scores(res["si_mc"]) == scores(res["hf_mc"])
                               and scores(res["si_gen"]) == scores(res["hf_gen"]))
    return summary


def write_md(report: dict, path: Path) -> None:
    lines = [
        "# lm-eval against `superinfer serve` vs lm-eval's `hf` model",
        "",
        "Written by `benchmarks/clients/lm_eval_check.py` (issue 17, \"Verify with clients "
        "nobody here wrote\"). Every number below comes from `lm_eval.json` of the same run.",
        "",
        f"- date: {report['date']}; machine: {report['machine']}",
        f"- versions: {json.dumps(report['versions'])}",
        f"- lm-eval venv: {json.dumps(report['install'])}",
        "- tasks: `si_mc` (20 multiple-choice items, log-likelihood, `local-completions` = "
        "/v1/completions with echo+logprobs on token ids, tokenizer = the exported HF folder) "
        "and `si_gen` (10 short questions, greedy `generate_until`, stop at newline, "
        f"{MAX_GEN_TOKS} tokens at most, `local-chat-completions` with "
        "`--apply_chat_template`); the reference is `--model hf` on the exported folder "
        "(`benchmarks/vs_vllm/export_hf.py`: the GGUF dequantized to float32) with the "
        "server's dtype.",
        "",
        "| server dtype | task | metric | superinfer | hf | equal |",
        "|---|---|---|---|---|---|",
    ]
    for d in report["dtypes"]:
        for task, pair in d["scores"].items():
            (si_name, si), (_, hf) = pair.items()
            for metric in si:
                lines.append(f"| {d['dtype']} | {task} | {metric} | {si[metric]:.4f} | "
                             f"{hf[metric]:.4f} | {'yes' if si[metric] == hf[metric] else 'NO'} |")
    lines += ["", "Per sample:", "",
              "| server dtype | max abs log-likelihood diff (80 choices) | argmax choice "
              "mismatches | is_greedy mismatches | generated texts differing (of 10) |",
              "|---|---|---|---|---|"]
    for d in report["dtypes"]:
        mc, gen = d["mc_samples"], d["gen_samples"]
        lines.append(f"| {d['dtype']} | {mc['max_abs_loglikelihood_diff']:.2e} | "
                     f"{mc['argmax_choice_mismatches']} | {mc['greedy_flag_mismatches']} | "
                     f"{gen['text_mismatches']} |")
    for d in report["dtypes"]:
        for m in d["gen_samples"]["mismatches"]:
            lines.append(f"\n{d['dtype']} doc {m['doc_id']}: superinfer {m['superinfer']!r}, "
                         f"hf {m['hf']!r}")
    lines += ["", "superinfer's generations (first dtype): "
              + ", ".join(repr(t) for t in report["dtypes"][0]["gen_samples"]["superinfer_texts"]),
              "", "## Commands, exactly as run", "", "```"]
    lines += report["commands"] + ["```", ""]
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lmeval-venv", default="/work/lmeval-venv")
    parser.add_argument("--install", action="store_true",
                        help="create the lm-eval venv if missing (pip, constraints/cpu.txt)")
    parser.add_argument("--hf-dir", default=DEFAULT_HF,
                        help="exported HF folder (made with export_hf.py if missing)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--out", default=str(REPO / "docs" / "results" / "clients"))
    parser.add_argument("--work", default="/tmp/lm_eval_check", help="raw lm-eval outputs")
    parser.add_argument("--keep-work", action="store_true",
                        help="reuse the lm-eval outputs already in --work (resume a run)")
    parser.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                        help="more `superinfer serve` arguments (last on the line)")
    args = parser.parse_args()

    work = Path(args.work)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    venv = Path(args.lmeval_venv)
    if args.install:
        install = install_lmeval(venv, work / "install.log")
    elif not (venv / "bin" / "lm_eval").exists():
        raise SystemExit(f"no lm_eval in {venv}: pass --install")
    else:
        install = {"venv": str(venv), "size_mib": du_mib(venv)}
    commands: list[str] = []
    if not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        cmd = [sys.executable, str(REPO / "benchmarks" / "vs_vllm" / "export_hf.py"),
               "--out", args.hf_dir]
        commands.append("HF_HUB_OFFLINE=1 " + " ".join(cmd))
        subprocess.run(cmd, env=offline_env(), check=True)
    tasks_dir = work / "tasks"
    write_tasks(tasks_dir)
    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "versions": versions(venv),
        "install": install,
        "dtypes": [],
        "commands": commands,
    }
    for dtype in args.dtypes.split(","):
        report["dtypes"].append(run_dtype(dtype, args, tasks_dir, work, commands))
        print(json.dumps({k: v for k, v in report["dtypes"][-1].items() if k != "gen_samples"},
                         indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("mc.jsonl", "gen.jsonl", "si_mc.yaml", "si_gen.yaml"):
        shutil.copy(tasks_dir / name, out / f"lm_eval_{name}")
    with open(out / "lm_eval.json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    write_md(report, out / "lm_eval.md")
    print(f"wrote {out / 'lm_eval.md'}")
    return 0 if all(d["scores_equal"] for d in report["dtypes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
