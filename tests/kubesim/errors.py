"""Kubernetes ``Status`` errors, shaped the way the real API server answers them."""

from __future__ import annotations

from typing import Any

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered to the client as a ``Status`` object with an HTTP code."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return status_object(self.code, self.message, self.reason, self.details)


def status_object(
    code: int,
    message: str,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, "Unknown"),
        "code": code,
    }
    if details:
        body["details"] = details
    if code < 400:
        del body["message"]
        del body["reason"]
    return body


def not_found(qualified: str, name: str, group: str, plural: str) -> ApiError:
    return ApiError(404, f'{qualified} "{name}" not found', details={"name": name, "group": group, "kind": plural})


def already_exists(qualified: str, name: str, group: str, plural: str) -> ApiError:
    return ApiError(
        409,
        f'{qualified} "{name}" already exists',
        reason="AlreadyExists",
        details={"name": name, "group": group, "kind": plural},
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """A 422 with one cause per (field, message), worded like the API server's field errors."""
    qualified_kind = f"{kind}.{group}" if group else kind
    text = "; ".join(f"{field}: {msg}" for field, msg in causes)
    if len(causes) > 1:
        text = f"[{', '.join(f'{field}: {msg}' for field, msg in causes)}]"
    return ApiError(
        422,
        f'{qualified_kind} "{name}" is invalid: {text}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field} for field, msg in causes],
        },
    )
