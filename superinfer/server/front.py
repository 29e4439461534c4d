"""The front of a server: what every request meets before an engine, the same in the
single-process server and in the Ray Serve ingress.

- the API key (401), readiness (503 outside the `ready` phase), the model name (404);
- request preparation (`preparer`: tokenize, validate, bind the SLO), once the served
  model's tokenizer is known;
- the one SLO record, metric and rate-limited log line of each request refused before it
  reached an engine.

Phases: loading -> warming_up -> ready -> draining (-> stopped); `dead` when loading,
warm-up or the engine failed. Only `ready` admits requests. The composition that owns the
front moves it through the phases; the front answers with them.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from superinfer.server.arrival import Arrival
from superinfer.server.config import ServerConfig
from superinfer.server.errors import APIError, log_level_of
from superinfer.server.log_limit import RateLimitedLog
from superinfer.server.prepare import RequestPreparer
from superinfer.server.prometheus import ServerMetrics
from superinfer.slo import SLOTargets
from superinfer.slo.metrics import REJECTED, RequestRecord, SLOReport, slo_report
from superinfer.slo.record_log import SLOLog, log_line

logger = logging.getLogger(__name__)

LOADING, WARMING_UP, READY, DRAINING, STOPPED, DEAD = (
    "loading", "warming_up", "ready", "draining", "stopped", "dead"
)  # fmt: skip


@dataclass
class Rejection:
    """What is known about a request rejected at ingress."""

    arrival: Arrival
    request_id: str | None = None
    targets: SLOTargets = field(default_factory=SLOTargets)
    num_prompt_tokens: int = 0
    priority: int | None = None


def _always_available() -> str | None:
    return None


def _ignore(report: SLOReport) -> None:
    pass


class Front:
    """Auth, readiness, the model name, preparation and refusals of one server.

    `slo_log` and `metrics` receive the refusals (shared with the back end, which records
    the requests it admitted); `error_log` rate-limits the refusal lines (default: its own).
    `unavailable()` tells why the back end cannot serve although the phase is `ready`
    ("dead": the engine thread died, for good; "without_replicas": none is up now), or None.
    `on_report` receives the SLO report of each refused request (the periodic stats line).
    """

    def __init__(
        self,
        config: ServerConfig,
        model_name: str,
        slo_log: SLOLog,
        metrics: ServerMetrics,
        error_log: RateLimitedLog | None = None,
        unavailable: Callable[[], str | None] = _always_available,
        on_report: Callable[[SLOReport], None] = _ignore,
    ) -> None:
        self.config = config
        self.model_name = model_name
        self.slo_log = slo_log
        self.metrics = metrics
        self.phase = LOADING
        self.preparer: RequestPreparer | None = None  # set once the model is known
        # refusals and failures, a few lines per reason (shared with the engine host)
        self.error_log = error_log or RateLimitedLog(logger)
        self._unavailable = unavailable
        self._on_report = on_report

    # --- readiness ------------------------------------------------------------------------
    @property
    def health(self) -> tuple[bool, str]:
        """(ready, status): the phase, or why a `ready` server cannot serve now."""
        if self.phase == READY and (status := self._unavailable()) is not None:
            if status == DEAD:  # a dead engine does not come back
                self.phase = DEAD
            return False, status
        return self.phase == READY, self.phase

    def check_ready(self) -> None:
        is_ready, phase = self.health
        if not is_ready:
            code = "draining" if phase in (DRAINING, STOPPED) else "not_ready"
            raise APIError(503, f"the server is {phase.replace('_', ' ')}", code,
                           headers={"Retry-After": "1"})  # fmt: skip

    # --- request checks -------------------------------------------------------------------
    def check_auth(self, headers: Mapping[str, str]) -> None:
        key = self.config.api_key
        if key is None:
            return
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), key.encode()
        ):
            raise APIError(
                401, "missing or wrong API key (Authorization: Bearer KEY)", "invalid_api_key"
            )

    @property
    def model_names(self) -> list[str]:
        """The names requests may use (--served-model-name), the one responses carry first."""
        return self.config.served_model_name or [self.model_name]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise APIError(404, f"the model {model[:128]!r} does not exist; this server serves "
                           f"{', '.join(map(repr, self.model_names))}", "model_not_found",
                           "model")  # fmt: skip

    # --- refused requests -----------------------------------------------------------------
    def reject(self, error: APIError, rejection: Rejection) -> None:
        """Count, record and log a request that never entered a queue."""
        now = time.monotonic()
        request_id = rejection.request_id or f"rejected-{uuid.uuid4().hex}"
        self.log_refusal(error, request_id)
        record = RequestRecord(
            request_id=request_id,
            targets=rejection.targets,
            arrival_time=rejection.arrival.monotonic,
            finished_time=now,
            outcome=REJECTED,
            num_prompt_tokens=rejection.num_prompt_tokens,
            num_output_tokens=0,
            rejection_reason=error.code,
        )
        report = slo_report(record)
        self.slo_log.write(log_line(record, report, rejection.arrival.wall, error.status,
                                    error.code, rejection.priority))  # fmt: skip
        self.metrics.on_rejected(rejection.targets.slo_class, error.code, report.is_slo_request)
        self._on_report(report)

    def log_refusal(self, error: APIError, request_id: str | None) -> None:
        """Log a refusal once, rate-limited per error code."""
        self.error_log.log(log_level_of(error.status), error.code, "Rejected request %s: %d %s: %s",
                           request_id or "-", error.status, error.code, error.message)  # fmt: skip
