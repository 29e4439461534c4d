"""The record of a request whose replica died while serving it: its own record died with
the replica, so whoever routed it (the Ray ingress or superinfer's router) writes one."""

from __future__ import annotations

import logging
import time
from typing import Any

from superinfer.server.arrival import Arrival
from superinfer.server.errors import error_body
from superinfer.server.prepare import PreparedRequest
from superinfer.server.prometheus import ServerMetrics
from superinfer.slo.metrics import ABORTED, RequestRecord, slo_report
from superinfer.slo.record_log import SLOLog, log_line

logger = logging.getLogger(__name__)

REPLICA_FAILED = "replica_failed"


def record_replica_failure(
    slo_log: SLOLog,
    metrics: ServerMetrics,
    prepared: PreparedRequest,
    arrival: Arrival,
    replica_id: str,
    error: BaseException,
) -> dict[str, Any]:
    """Record `prepared` as aborted by its replica's failure; returns the 502 error body."""
    logger.warning("replica %s failed during %s: %r", replica_id, prepared.request_id, error)
    record = RequestRecord(
        prepared.request_id, prepared.slo.targets, arrival.monotonic,
        finished_time=time.monotonic(), outcome=ABORTED,
        num_prompt_tokens=prepared.num_prompt_tokens, finish_reason="abort",
    )  # fmt: skip
    report = slo_report(record)
    slo_log.write(log_line(record, report, arrival.wall, 502, REPLICA_FAILED, prepared.priority))
    metrics.on_ended(report, record.num_prompt_tokens, 0, "abort", [])
    message = f"the replica serving this request failed ({type(error).__name__}); retry it"
    return error_body(502, message, REPLICA_FAILED)
