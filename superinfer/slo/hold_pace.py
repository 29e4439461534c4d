"""How fast a class's requests really produce their tokens, for admission's KV check.

The KV check (`kv_peak.py`) projects each admitted request's KV: growing a token every so
many seconds, freed at its last token. Without data it takes the widest band a kept
promise allows: a token every step (the fastest) and the last token at the promise's end
(a TBT target a token: the slowest). No scheduler runs a request both ways, so that band
counts every request at its final size at once: on a host whose steps take 10-40 ms
against bronze's 1 s target it refused requests the tiers had room for
(docs/results/slo_promise/fast_host_1206).

`HoldPace` learns, per class, the ratio of each finished request's mean gap to its TBT
target (the steps it sat out, parked in the host tier or not, included) and narrows the
band to what the class's requests did: a request grows at the `fast_quantile` of those
ratios and is freed at the `slow_quantile`, each times its target, within [a step, the
target]. Until a class has `min_samples` finished requests its band is the widest one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Pace:
    """Seconds a token for a request's KV projection: it grows at `grow_s_per_token` and
    its last token comes by `release_s_per_token` a token (>= the growth's; 0: no bound)."""

    grow_s_per_token: float
    release_s_per_token: float


class HoldPace:
    """Per class, a band of learned ratios of mean gap to TBT target (see the module)."""

    def __init__(
        self,
        fast_quantile: float = 0.1,
        slow_quantile: float = 0.9,
        window: int = 64,
        min_samples: int = 16,
    ) -> None:
        if not 0 <= fast_quantile <= slow_quantile <= 1:
            raise ValueError(
                f"need 0 <= fast_quantile <= slow_quantile <= 1, got {fast_quantile}, "
                f"{slow_quantile}"
            )
        self.fast_quantile, self.slow_quantile = fast_quantile, slow_quantile
        self.window, self.min_samples = window, min_samples
        self._ratios: dict[str | None, deque[float]] = {}
        self._bands: dict[str | None, tuple[float, float]] = {}

    def observe(self, slo_class: str | None, tbt_s: float, mean_gap_s: float) -> None:
        """A finished request of `slo_class` with TBT target `tbt_s` took `mean_gap_s` a
        token between its first and last."""
        if tbt_s <= 0 or not math.isfinite(mean_gap_s) or mean_gap_s < 0:
            return
        ratios = self._ratios.setdefault(slo_class, deque(maxlen=self.window))
        ratios.append(mean_gap_s / tbt_s)
        if len(ratios) >= self.min_samples:
            ordered = sorted(ratios)
            self._bands[slo_class] = (_quantile(ordered, self.fast_quantile),
                                      _quantile(ordered, self.slow_quantile))  # fmt: skip

    def pace(self, slo_class: str | None, tbt_s: float, step_s: float) -> Pace:
        """The pace to project a request of `slo_class` with TBT target `tbt_s` at, on an
        engine whose decode-only step takes `step_s` (no target: a step a token, never
        freed by a promise)."""
        if tbt_s <= 0:
            return Pace(step_s, 0.0)
        fast, slow = self._bands.get(slo_class, (0.0, 1.0))
        grow_s = min(tbt_s, max(step_s, fast * tbt_s))
        return Pace(grow_s, min(tbt_s, max(grow_s, slow * tbt_s)))

    def bands(self) -> dict[str | None, tuple[float, float]]:
        """Class -> the learned (fast, slow) ratios of its TBT target (absent: not yet)."""
        return dict(self._bands)


def _quantile(ordered: list[float], quantile: float) -> float:
    return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]
