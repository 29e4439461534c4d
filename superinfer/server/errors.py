"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a status.

Every rejection at ingress is an `APIError`; its `code` is the bounded reason the metrics
count, the SLO log records and the server log rate-limits by.

Every error response says why in headers a gateway can route on (docs/slo.md, "Refusals"):
`x-superinfer-refusal-reason` (the refusal's `reason`: its code, or a finer one such as
`ttft_infeasible`) on every refusal, and, on the refusals llm-d's router would count as a
dropped request (425, 429, 503), `x-llm-d-request-dropped-reason` with a value in llm-d's
`rejected-*` style. A refusal that admission estimated also carries the estimated TTFT
(`x-superinfer-estimated-ttft-ms`, and `estimated_ttft_ms` in the error body).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

from superinfer.slo.wire import HEADER_ESTIMATED_TTFT

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    425: "slo_infeasible_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
}

REASON_HEADER = "x-superinfer-refusal-reason"
# llm-d's router (llm-d/llm-d-router, pkg/common/error/error.go: RequestDroppedReasonHeaderKey)
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
ESTIMATED_TTFT_HEADER = HEADER_ESTIMATED_TTFT
# llm-d's values where one means the same (rejected-saturated, -no-endpoints, -shutting-down);
# a request whose SLO cannot be met has no llm-d value: "rejected-slo-infeasible", same style
_DROPPED = {
    "queue_full": "rejected-saturated",
    "not_ready": "rejected-no-endpoints",
    "draining": "rejected-shutting-down",
}
_DROPPED_BY_STATUS = {425: "rejected-slo-infeasible", 429: "rejected-saturated",
                      503: "rejected-no-endpoints"}  # fmt: skip


class APIError(Exception):
    """An error answered with `status` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        reason: str | None = None,
        estimated_ttft_ms: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}  # the refusal's own (Retry-After), without the reasons
        self.reason = reason or code  # why, for gateways: the code or a finer cause
        self.estimated_ttft_ms = estimated_ttft_ms  # from arrival, when admission estimated it

    def body(self) -> dict[str, Any]:
        body = error_body(self.status, self.message, self.code, self.param)
        if self.estimated_ttft_ms is not None:
            body["error"]["estimated_ttft_ms"] = round(self.estimated_ttft_ms, 1)
        return body

    def response_headers(self) -> dict[str, str]:
        """Its own headers, the reason headers and the estimated TTFT (module docstring)."""
        headers = {**self.headers, REASON_HEADER: self.reason}
        dropped = dropped_reason(self.status, self.code)
        if dropped is not None:
            headers[DROPPED_REASON_HEADER] = dropped
        if self.estimated_ttft_ms is not None:
            headers[ESTIMATED_TTFT_HEADER] = f"{self.estimated_ttft_ms:.1f}"
        return headers

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.response_headers())


def dropped_reason(status: int, code: str) -> str | None:
    """The `x-llm-d-request-dropped-reason` value of a refusal; None where llm-d's router
    would not call it dropped (the client's own mistakes: 400, 401, 404, 413)."""
    if status not in _DROPPED_BY_STATUS:
        return None
    return _DROPPED.get(code, _DROPPED_BY_STATUS[status])


def estimate_headers(estimated_ttft_ms: float | None) -> dict[str, str]:
    """The estimated-TTFT header of an admitted request's response (none without one)."""
    if estimated_ttft_ms is None:
        return {}
    return {ESTIMATED_TTFT_HEADER: f"{estimated_ttft_ms:.1f}"}


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    error_type = _TYPES.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def bad_request(message: str, code: str = "invalid_value", param: str | None = None) -> APIError:
    return APIError(400, message, code, param)


def log_level_of(status: int) -> int:
    """Where a refusal is logged: server failures at error, capacity refusals (425, 429,
    503) at warning, the client's own mistakes (400, 401, 404, 413) at info."""
    if status >= 500 and status != 503:
        return logging.ERROR
    if status in (425, 429, 503):
        return logging.WARNING
    return logging.INFO
