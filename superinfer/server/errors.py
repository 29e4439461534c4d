"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with a status.

Every rejection at ingress is an `APIError`; its `code` is the bounded reason the metrics
count, the SLO log records and the server log rate-limits by.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

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


class APIError(Exception):
    """An error answered with `status` and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.code, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


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
