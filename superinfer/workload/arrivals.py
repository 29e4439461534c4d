"""Request arrival times: generated (Poisson or gamma) or replayed from a trace.

Generated arrivals follow `vllm bench serve`: inter-arrival gaps are gamma distributed with
shape `burstiness` and mean 1 / rate, so burstiness 1 is a Poisson process, smaller values
are burstier and larger ones more regular. With burstiness 1 the gaps are drawn with
`random.expovariate`, as `benchmarks/policies_overload.py` draws them, and the simulator
(`poisson_arrivals`) uses this generator, so the same seed gives the same arrival sequence
in the simulator, the overload benchmark and a benchmark run.

Times are seconds from the start of the run (the first request may arrive after 0).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def _gap_sampler(rate: float, burstiness: float, seed: int):
    if not rate > 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    rng = random.Random(seed)
    if burstiness == 1.0:
        return lambda: rng.expovariate(rate)
    scale = 1.0 / (rate * burstiness)  # mean = shape * scale = 1 / rate
    return lambda: rng.gammavariate(burstiness, scale)


def generated_arrivals(
    num_requests: int, rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Arrival times of `num_requests` requests at `rate` per second on average.

    `rate` = inf sends every request at time 0 (all at once, as vLLM does).
    """
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    if math.isinf(rate):
        return [0.0] * num_requests
    gap = _gap_sampler(rate, burstiness, seed)
    t, times = 0.0, []
    for _ in range(num_requests):
        t += gap()
        times.append(t)
    return times


def poisson_arrivals(num_requests: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s) of a Poisson process: the benchmark client's generator, so the same
    seed sends the same sequence in a simulation and in a real benchmark run."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    return generated_arrivals(num_requests, rate, burstiness=1.0, seed=seed)


def arrivals_within(
    duration_s: float, rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Every arrival of the same process (same seed: the same times as `generated_arrivals`)
    that falls within the first `duration_s` seconds."""
    if not duration_s > 0:
        raise ValueError(f"duration must be > 0, got {duration_s}")
    if math.isinf(rate):
        raise ValueError("a duration needs a finite request rate")
    gap = _gap_sampler(rate, burstiness, seed)
    times: list[float] = []
    t = gap()
    while t <= duration_s:
        times.append(t)
        t += gap()
    return times


def replayed_arrivals(timestamps_s: Sequence[float], time_scale: float = 1.0) -> list[float]:
    """Trace arrival times relative to the first one, multiplied by `time_scale` (0.5
    replays the trace twice as fast, 2 at half speed)."""
    if not time_scale > 0:
        raise ValueError(f"time scale must be > 0, got {time_scale}")
    if not timestamps_s:
        return []
    start = timestamps_s[0]
    return [(t - start) * time_scale for t in timestamps_s]
