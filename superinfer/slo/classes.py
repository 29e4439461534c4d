"""SLO classes: their default targets, reserved capacity and rejection rule.

Loaded from the YAML or JSON file given by `superinfer serve --slo-config FILE`:

    default_class: null        # class of requests that name none (null: default_targets)
    default_targets: {ttft_ms: 1000, tbt_ms: 200, max_latency_ms: null}
    classes:                   # most important first: the order ranks the reservations
      - name: gold
        ttft_ms: 500
        tbt_ms: 100
        reserved_kv_share: 0.2      # of device KV blocks, kept from lower classes
        reserved_token_share: 0.2   # of each step's token budget, kept from lower classes
      - name: bronze
        ttft_ms: 5000
        tbt_ms: 1000
        reject_infeasible: false    # never 425: best effort

Pure Python; the server resolves each request's `SLOTargets` from a class and overrides.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from superinfer.slo.targets import DEFAULT_TBT_MS, DEFAULT_TTFT_MS, SLOTargets


class SLOConfigError(ValueError):
    """The SLO configuration file is unreadable or invalid."""


@dataclass(frozen=True)
class SLOClass:
    """A named class of requests: default targets, reservations and rejection rule."""

    name: str
    ttft_ms: float = DEFAULT_TTFT_MS
    tbt_ms: float = DEFAULT_TBT_MS
    max_latency_ms: float | None = None
    reserved_kv_share: float = 0.0  # share of device KV blocks reserved for this class
    reserved_token_share: float = 0.0  # share of the per-step token budget
    reject_infeasible: bool = True  # 425 when its deadline cannot be met
    priority: int | None = None  # vLLM priority for requests that give none (None: rank)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise SLOConfigError("a class needs a non-empty name")
        SLOTargets(self.ttft_ms, self.tbt_ms, self.max_latency_ms)  # validates the targets
        for share in ("reserved_kv_share", "reserved_token_share"):
            value = getattr(self, share)
            if not (isinstance(value, (int, float)) and 0 <= value <= 1):
                raise SLOConfigError(f"class {self.name!r}: {share} must lie in [0, 1]")

    def targets(self) -> SLOTargets:
        return SLOTargets(self.ttft_ms, self.tbt_ms, self.max_latency_ms, slo_class=self.name)


def default_classes() -> tuple[SLOClass, ...]:
    """The classes served when no `--slo-config` is given (no reservations; every class
    refused when its targets cannot be met, so an admitted request is one the server
    expects to keep)."""
    return (
        SLOClass("gold", ttft_ms=500, tbt_ms=100),
        SLOClass("silver", ttft_ms=DEFAULT_TTFT_MS, tbt_ms=DEFAULT_TBT_MS),
        SLOClass("bronze", ttft_ms=5000, tbt_ms=1000),
    )


@dataclass(frozen=True)
class SLOConfig:
    """All classes (most important first), the default targets and the default class."""

    classes: tuple[SLOClass, ...] = field(default_factory=default_classes)
    default_targets: SLOTargets = field(default_factory=SLOTargets)
    default_class: str | None = None

    def __post_init__(self) -> None:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise SLOConfigError(f"class names repeat: {names}")
        if self.default_class is not None and self.default_class not in names:
            raise SLOConfigError(f"default_class {self.default_class!r} is not a class")
        for share in ("reserved_kv_share", "reserved_token_share"):
            if sum(getattr(c, share) for c in self.classes) > 1 + 1e-9:
                raise SLOConfigError(f"the classes' {share} add up to more than 1")

    def get(self, name: str) -> SLOClass | None:
        return next((c for c in self.classes if c.name == name), None)

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    def rank(self, name: str | None) -> int:
        """0 for the most important class; classless requests rank below all."""
        names = self.class_names
        return names.index(name) if name in names else len(names)

    def priority_of(self, name: str | None) -> int:
        slo_class = self.get(name) if name else None
        if slo_class is not None and slo_class.priority is not None:
            return slo_class.priority
        return self.rank(name) if slo_class is not None else 0

    def reservations(self) -> dict[str, tuple[float, float]]:
        """Class -> (share of device KV blocks, share of the token budget), in rank order;
        classes that reserve nothing are left out (`SchedulerConfig.class_reservations`)."""
        return {
            c.name: (c.reserved_kv_share, c.reserved_token_share)
            for c in self.classes
            if c.reserved_kv_share or c.reserved_token_share
        }


# --- class mixes (the benchmark's and the simulator's workloads) --------------------------
def parse_class_mix(text: str) -> dict[str, float]:
    """`gold=0.2,silver=0.5,bronze=0.3` -> shares that add up to 1 (weights are normalized)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, sep, share = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"class mix entries look like name=share, got {part!r}")
        value = float(share)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"class share must be a finite number >= 0, got {share!r}")
        if name in mix:
            raise ValueError(f"class {name!r} appears twice in the mix")
        mix[name] = value
    total = sum(mix.values())
    if not total > 0:
        raise ValueError("the class shares add up to 0")
    return {name: value / total for name, value in mix.items()}


def class_sequence(num_requests: int, mix: dict[str, float], seed: int = 0) -> list[str]:
    """Class names for `num_requests` requests: each class its share (largest remainder),
    shuffled with `seed`."""
    exact = {name: share * num_requests for name, share in mix.items()}
    counts = {name: math.floor(value) for name, value in exact.items()}
    by_remainder = sorted(mix, key=lambda name: exact[name] - counts[name], reverse=True)
    for name in by_remainder[: num_requests - sum(counts.values())]:
        counts[name] += 1
    names = [name for name in mix for _ in range(counts[name])]
    random.Random(seed).shuffle(names)
    return names


# --- loading ------------------------------------------------------------------------------
def load_slo_config(path: str | os.PathLike[str] | None) -> SLOConfig:
    """Read a YAML (.yaml/.yml) or JSON file; None gives the built-in classes."""
    if path is None:
        return SLOConfig()
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as error:
        raise SLOConfigError(f"cannot read SLO config {path}: {error.strerror}") from None
    return parse_slo_config(_parse_text(text, str(path)))


def _parse_text(text: str, path: str) -> Any:
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise SLOConfigError(f"{path}: not valid YAML: {error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SLOConfigError(f"{path}: not valid JSON: {error}") from None


def parse_slo_config(data: Any) -> SLOConfig:
    """Build an `SLOConfig` from parsed YAML/JSON (unknown keys are errors)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SLOConfigError("the SLO config must be a mapping")
    _check_keys(data, {"classes", "default_targets", "default_class"}, "the SLO config")
    classes = _parse_classes(data.get("classes", None))
    targets = _parse_targets(data.get("default_targets") or {})
    try:
        return SLOConfig(classes, targets, data.get("default_class"))
    except (TypeError, ValueError) as error:
        raise SLOConfigError(str(error)) from None


def _parse_classes(raw: Any) -> tuple[SLOClass, ...]:
    if raw is None:
        return default_classes()
    if isinstance(raw, Mapping):  # {gold: {...}, silver: {...}} keeps its order
        raw = [{"name": name, **(spec or {})} for name, spec in raw.items()]
    if not isinstance(raw, list):
        raise SLOConfigError("classes must be a list (or a mapping of name to settings)")
    return tuple(_parse_class(item) for item in raw)


def _parse_class(raw: Any) -> SLOClass:
    if not isinstance(raw, Mapping):
        raise SLOConfigError(f"a class must be a mapping, got {raw!r}")
    allowed = {f.name for f in fields(SLOClass)}
    _check_keys(raw, allowed, f"class {raw.get('name')!r}")
    for key in ("ttft_ms", "tbt_ms", "max_latency_ms", "reserved_kv_share", "reserved_token_share"):
        _check_number(raw.get(key), f"class {raw.get('name')!r}: {key}")
    if "reject_infeasible" in raw and not isinstance(raw["reject_infeasible"], bool):
        raise SLOConfigError(f"class {raw.get('name')!r}: reject_infeasible must be true/false")
    if raw.get("priority") is not None and type(raw["priority"]) is not int:
        raise SLOConfigError(f"class {raw.get('name')!r}: priority must be an integer")
    try:
        return SLOClass(**raw)
    except (TypeError, ValueError) as error:
        raise SLOConfigError(str(error)) from None


def _parse_targets(raw: Any) -> SLOTargets:
    if not isinstance(raw, Mapping):
        raise SLOConfigError("default_targets must be a mapping")
    _check_keys(raw, {"ttft_ms", "tbt_ms", "max_latency_ms"}, "default_targets")
    for key, value in raw.items():
        _check_number(value, f"default_targets.{key}")
    try:
        return SLOTargets(**raw)
    except ValueError as error:
        raise SLOConfigError(f"default_targets: {error}") from None


def _check_keys(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(raw) - allowed
    if unknown:
        raise SLOConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}")


def _check_number(value: Any, where: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SLOConfigError(f"{where} must be a finite number, got {value!r}")
