"""The SLO record log across processes: the ingress and every replica append to the same
path, each line tagged with the replica that served the request (null: the ingress wrote
it: a rejection by every replica, a request whose replica failed, a bad request).

Each line is one `write` of a whole line to a file opened for appending, so on one node
lines from several processes never interleave. On a multi-node cluster each node has its
own file at that path: concatenate them (docs/scale-out.md).
"""

from __future__ import annotations

import os
from typing import Any

from superinfer.server.slo_log import SLOLog


class TaggedSLOLog(SLOLog):
    """An `SLOLog` that adds `"replica": <id>` to each line."""

    def __init__(self, path: str | os.PathLike[str] | None, replica: str | None) -> None:
        super().__init__(path)
        self.replica = replica

    def write(self, line: dict[str, Any]) -> None:
        super().write({**line, "replica": self.replica})
