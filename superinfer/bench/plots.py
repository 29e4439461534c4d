"""Plots of a sweep (PNG, matplotlib's Agg backend), from the point JSONs alone:

- `attainment_vs_rate.png`: TTFT attainment, TPOT attainment and goodput against the
  request rate, one line per system;
- `latency_cdfs.png`: CDFs of TTFT and TPOT of the finished requests at the heaviest rate,
  one line per system;
- `kv_timeline.png`: device and host KV usage and cumulative rotations / preemptions over
  the heaviest point of each system, from the `/metrics` scrapes (a system that does not
  expose a series has no line for it).
"""

from __future__ import annotations

import math
import os
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rate(point: dict[str, Any]) -> float:
    rate = point["request_rate"]
    return math.inf if rate == "inf" else float(rate)


def _by_system(points: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    systems: dict[str, list[dict[str, Any]]] = {}
    for point in points:
        systems.setdefault(point.get("system") or point.get("label") or "?", []).append(point)
    return {name: sorted(ps, key=_rate) for name, ps in systems.items()}


def plot_sweep(points: list[dict[str, Any]], output_dir: str) -> list[str]:
    """Write the three plots; returns their paths."""
    return [
        plot_attainment(points, os.path.join(output_dir, "attainment_vs_rate.png")),
        plot_cdfs(points, os.path.join(output_dir, "latency_cdfs.png")),
        plot_kv_timeline(points, os.path.join(output_dir, "kv_timeline.png")),
    ]


def plot_attainment(points: list[dict[str, Any]], path: str) -> str:
    plt = _pyplot()
    panels = (("ttft_attainment", "TTFT attainment"), ("tpot_attainment", "TPOT attainment"),
              ("goodput", "goodput (req/s meeting all targets)"))  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
    for ax, (key, title) in zip(axes, panels):
        for name, series in _by_system(points).items():
            finite = [p for p in series if math.isfinite(_rate(p)) and p.get(key) is not None]
            ax.plot([_rate(p) for p in finite], [p[key] for p in finite], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        if key.endswith("attainment"):
            ax.set_ylim(-0.02, 1.02)
    axes[0].legend()
    fig.suptitle(_targets_caption(points))
    return _save(fig, path)


def _targets_caption(points: list[dict[str, Any]]) -> str:
    targets = {(t["class"], t["ttft_ms"], t["tbt_ms"]) for p in points for t in p["slo_targets"]}
    parts = [f"{c or 'all'} {ttft:g}/{tbt:g} ms" for c, ttft, tbt in sorted(targets, key=str)]
    return "targets TTFT/TBT: " + ", ".join(parts)


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    return ordered, [(i + 1) / len(ordered) for i in range(len(ordered))]


def plot_cdfs(points: list[dict[str, Any]], path: str) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    heaviest = {name: series[-1] for name, series in _by_system(points).items()}
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for name, point in heaviest.items():
            values = [r["slo"][key] for r in point["records"]
                      if r["outcome"] == "finished" and r["slo"][key] is not None
                      and (key == "ttft_ms" or r["output_tokens"] > 1)]  # fmt: skip
            if values:
                xs, ys = _cdf(values)
                ax.step(xs, ys, where="post", label=f"{name} @ {_rate(point):g} req/s")
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} (ms, log scale)")
        ax.set_ylabel("share of finished requests")
        ax.set_title(f"{title} CDF at the heaviest rate")
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


KV_PANELS = (
    (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "device KV usage (share)"),
    (("vllm:cpu_cache_usage_perc",), "host KV usage (share)"),
    (
        ("superinfer:rotations_total", "vllm:num_preemptions_total"),
        "rotations / preemptions since the start of the run",
    ),
)


def plot_kv_timeline(points: list[dict[str, Any]], path: str) -> str:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(KV_PANELS), figsize=(15, 4.2))
    for name, series in _by_system(points).items():
        point = series[-1]
        timeline = point.get("metrics_timeline") or []
        for ax, (keys, _) in zip(axes, KV_PANELS):
            for key in keys:
                samples = [(s["t"], s[key]) for s in timeline if key in s]
                if samples and not (key == "vllm:gpu_cache_usage_perc" and _has(timeline)):
                    ts, vs = zip(*samples)
                    if key.endswith("_total"):  # counters: since the start of the run
                        vs = [v - vs[0] for v in vs]
                    short = key.split(":")[1].removesuffix("_total")
                    ax.plot(ts, vs, label=f"{name} {short} @ {_rate(point):g}")
    for ax, (_, title) in zip(axes, KV_PANELS):
        ax.set_title(title)
        ax.set_xlabel("seconds into the run")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return _save(fig, path)


def _has(timeline: list[dict[str, Any]]) -> bool:
    return any("vllm:kv_cache_usage_perc" in s for s in timeline)


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path
