"""Plots of the simulator's results in docs/results/sim (reads the JSON the other
benchmarks/sim_*.py scripts wrote, writes PNGs next to it).

    .venv/bin/python benchmarks/sim_plots.py [--dir docs/results/sim]
"""

from __future__ import annotations

import argparse
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SUITE_TITLES = {
    "llama": "Llama-3-8B, GH200-144, ShareGPT",
    "qwen": "Qwen2.5-32B, GH200-144, ShareGPT",
    "llama-1024": "Llama-3-8B, GH200-144, max_num_seqs 1024",
    "qwen-96": "Qwen2.5-32B, GH200-96 (short KV pool)",
}
PANELS = (("ttft_attainment", "TTFT attainment"), ("tpot_attainment", "TPOT attainment"),
          ("output_throughput", "output tokens/s"))  # fmt: skip


def load(directory: str, name: str) -> dict | None:
    path = os.path.join(directory, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def plot_suite(data: dict, path: str) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    systems = list(dict.fromkeys(r["system"] for r in data["results"]))
    for system in systems:
        rows = sorted(
            (r for r in data["results"] if r["system"] == system), key=lambda r: r["rate"]
        )
        for ax, (field, _) in zip(axes, PANELS):
            ax.plot([r["rate"] for r in rows], [r[field] for r in rows], marker="o", label=system)
    targets = data["results"][0]["targets"]
    for ax, (field, label) in zip(axes, PANELS):
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if "attainment" in field:
            ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    title = SUITE_TITLES.get(data["suite"], data["suite"])
    fig.suptitle(f"{title}: targets TTFT {targets['ttft_ms']:.0f} ms, TPOT {targets['tbt_ms']:.0f} ms "
                 f"({data['duration_s']:.0f} s Poisson, simulated)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sensitivity(data: dict, path: str) -> None:
    knobs = list(dict.fromkeys(r["knob"] for r in data["results"]))
    fig, axes = plt.subplots(1, len(knobs), figsize=(5 * len(knobs), 4.2))
    for ax, knob in zip(axes, knobs):
        for mode in ("duplex", "naive"):
            rows = sorted((r for r in data["results"] if r["knob"] == knob and r["transfer_mode"] == mode),
                          key=lambda r: r["value"])  # fmt: skip
            if not rows:
                continue
            values = [r["value"] for r in rows]
            ax.plot(
                values, [r["ttft_attainment"] for r in rows], marker="o", label=f"TTFT ({mode})"
            )
            ax.plot(
                values,
                [r["tpot_attainment"] for r in rows],
                marker="s",
                ls="--",
                label=f"TPOT ({mode})",
            )
        ax.set_xscale("symlog" if knob == "rotation_budget" else "log")
        ax.set_xlabel(knob.replace("_", " "))
        ax.set_ylabel("attainment")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    base = data["base"]
    fig.suptitle(
        f"rotasched sensitivity: {base['model']} on {base['hardware']}, {base['rate']} req/s (simulated)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fidelity(data: dict, path: str) -> None:
    metrics = (
        ("p50_ttft_ms", "p50 TTFT (ms)"),
        ("p90_ttft_ms", "p90 TTFT (ms)"),
        ("mean_tpot_ms", "mean TPOT (ms)"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (field, label) in zip(axes, metrics):
        for policy in dict.fromkeys(r["policy"] for r in data["results"]):
            rows = [r for r in data["results"] if r["policy"] == policy]
            ax.scatter(
                [r["real"][field] for r in rows], [r["sim"][field] for r in rows], label=policy
            )
            for r in rows:
                ax.annotate(f"{r['rate']:g}/s", (r["real"][field], r["sim"][field]), fontsize=7)
        low = min(min(r["real"][field], r["sim"][field]) for r in data["results"])
        high = max(max(r["real"][field], r["sim"][field]) for r in data["results"])
        ax.plot([low, high], [low, high], color="grey", lw=1)
        ax.fill_between(
            [low, high],
            [low * 0.85, high * 0.85],
            [low * 1.15, high * 1.15],
            color="grey",
            alpha=0.15,
        )
        ax.set_xlabel(f"real {label}")
        ax.set_ylabel(f"simulated {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("simulator vs real engine on this CPU (band: +-15%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_timeline(data: dict, path: str) -> None:
    timeline = data["timeline"]
    t = [s["time"] for s in timeline]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    top.plot(t, [s["device_usage"] for s in timeline], label="device KV usage")
    top.plot(t, [s["host_usage"] for s in timeline], label="host KV usage")
    top.set_ylabel("share of pool")
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    for key in ("num_running", "num_waiting", "num_swapped"):
        bottom.plot(t, [s[key] for s in timeline], label=key.removeprefix("num_"))
    rotations = [s["num_swap_outs"] for s in timeline]
    twin = bottom.twinx()
    twin.plot(t, rotations, color="black", ls=":", label="rotations (cumulative)")
    twin.set_ylabel("rotations")
    bottom.set_xlabel("virtual time (s)")
    bottom.set_ylabel("requests")
    bottom.legend(fontsize=8, loc="upper left")
    twin.legend(fontsize=8, loc="upper right")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"timeline: {data['label']} (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", default="docs/results/sim")
    args = parser.parse_args()
    for name in SUITE_TITLES:
        if (data := load(args.dir, name)) is not None:
            plot_suite(data, os.path.join(args.dir, f"{name}.png"))
    for name, plot in (("fidelity", plot_fidelity), ("timeline", plot_timeline)):
        if (data := load(args.dir, name)) is not None:
            plot(data, os.path.join(args.dir, f"{name}.png"))
    for path in sorted(glob.glob(os.path.join(args.dir, "sensitivity_*.json"))):
        name = os.path.basename(path).removesuffix(".json")
        plot_sensitivity(load(args.dir, name), os.path.join(args.dir, f"{name}.png"))


if __name__ == "__main__":
    main()
