"""The SLO record log: one JSON line per request (finished, aborted or rejected).

Every request, never sampled. Each line is written whole with one `write` of a complete
line under a lock and flushed at once, so a crash loses no finished record and a reader
never sees half a line.

Across processes (scale-out), the ingress and every replica append to the same path with a
`TaggedSLOLog`, each line tagged with the replica that served the request (null: the
ingress wrote it: a rejection by every replica, a request whose replica failed, a bad
request). Each line is one `write` of a whole line to a file opened for appending, so on
one node lines from several processes never interleave. On a multi-node cluster each node
has its own file at that path: concatenate them (docs/scale-out.md).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from superinfer.slo.metrics import RequestRecord, SLOReport, targets_dict


class SLOLog:
    """Appends records to `path`; without a path every method is a no-op."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self.num_records = 0

    def write(self, line: dict[str, Any]) -> None:
        if self._file is None:
            return
        text = json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n"
        with self._lock:
            if self._file.closed:
                return
            self._file.write(text)
            self._file.flush()
            self.num_records += 1

    def close(self) -> None:
        with self._lock:
            if self._file is not None and not self._file.closed:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()


class TaggedSLOLog(SLOLog):
    """An `SLOLog` that adds `"replica": <id>` to each line."""

    def __init__(self, path: str | os.PathLike[str] | None, replica: str | None) -> None:
        super().__init__(path)
        self.replica = replica

    def write(self, line: dict[str, Any]) -> None:
        super().write({**line, "replica": self.replica})


def log_line(
    record: RequestRecord,
    report: SLOReport,
    arrival_wall: float,
    status: int,
    reason: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The log line of one request: ids, class, targets, timings, outcomes, counts."""
    slo = report.to_dict()
    return {
        "id": record.request_id,
        "class": report.slo_class,
        "outcome": record.outcome,
        "status": status,
        "reason": reason,
        "arrival": round(arrival_wall, 6),
        "targets": targets_dict(record.targets),
        **{key: slo[key] for key in ("ttft_ms", "tpot_ms", "max_tbt_ms", "e2e_ms", "queue_ms")},
        **{key: slo[key] for key in ("ttft_met", "tpot_met", "deadline_met", "tbt_attainment")},
        "all_met": report.is_all_met,
        "num_tbt_gaps": report.num_tbt_gaps,
        "num_tbt_gaps_met": report.num_tbt_gaps_met,
        "preemptions": report.preemptions,
        "rotations": report.rotations,
        "prompt_tokens": record.num_prompt_tokens,
        "output_tokens": record.num_tokens_out,
        "finish_reason": record.finish_reason,
        "priority": priority,
    }
