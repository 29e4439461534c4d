"""Class isolation: device KV blocks and token budget that a class reserves, kept from
lower classes.

Classes are ranked in the order the configuration lists them (the first is the most
important); requests without a known class rank below all of them. The ranks order every
scheduling decision (admission, victims, displacement) whether or not a class reserves
anything. A request may only
use free blocks beyond what higher classes have reserved and do not yet use, and only the
part of a step's token budget that higher classes with work pending have not reserved.
Usage is counted once per step, so within a step the reserve is if anything kept larger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from superinfer.core.request import Request


class ClassReservations:
    def __init__(
        self,
        reservations: Mapping[str, tuple[float, float]],
        num_device_blocks: int,
        token_budget: int,
        class_order: Sequence[str] = (),
    ) -> None:
        names = [*class_order, *(n for n in reservations if n not in class_order)]
        self.ranks = {name: rank for rank, name in enumerate(names)}
        self.reserved_blocks = {n: int(b * num_device_blocks) for n, (b, _) in reservations.items()}
        self.reserved_tokens = {n: int(t * token_budget) for n, (_, t) in reservations.items()}
        self._used_blocks: Counter[str] = Counter()
        self._classes_with_work: set[str] = set()
        self._scheduled_tokens: Counter[str] = Counter()

    @property
    def is_enabled(self) -> bool:
        """Some class reserves blocks or tokens (ranks alone need no bookkeeping)."""
        return any(self.reserved_blocks.values()) or any(self.reserved_tokens.values())

    @property
    def is_ranked(self) -> bool:
        """More than one rank exists: class order matters."""
        return bool(self.ranks)

    def rank(self, request: Request) -> int:
        return self.ranks.get(request.slo.slo_class or "", len(self.ranks))

    def begin_step(
        self, running: Iterable[Request], unfinished: Iterable[Request], blocks_of
    ) -> None:
        """Count each class's device blocks and which classes have work this step."""
        self._used_blocks = Counter()
        for request in running:
            self._used_blocks[request.slo.slo_class or ""] += blocks_of(request)
        self._classes_with_work = {r.slo.slo_class or "" for r in unfinished}
        self._scheduled_tokens = Counter()

    def num_blocks_kept_free(self, request: Request) -> int:
        """Free blocks `request` must leave for the classes above it."""
        rank = self.rank(request)
        return sum(
            max(0, reserved - self._used_blocks[name])
            for name, reserved in self.reserved_blocks.items()
            if self.ranks[name] < rank
        )

    def num_tokens_kept(self, request: Request) -> int:
        """Tokens of this step's budget `request` must leave for the classes above it."""
        rank = self.rank(request)
        return sum(
            max(0, reserved - self._scheduled_tokens[name])
            for name, reserved in self.reserved_tokens.items()
            if self.ranks[name] < rank and name in self._classes_with_work
        )

    def on_scheduled(self, request: Request, num_tokens: int) -> None:
        self._scheduled_tokens[request.slo.slo_class or ""] += num_tokens

    def may_displace(self, request: Request, victim: Request) -> bool:
        """A request may only push out requests of its own class or lower ones."""
        return self.rank(victim) >= self.rank(request)
