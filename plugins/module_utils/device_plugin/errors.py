# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: exception types that the module turns into fail_json results.

from __future__ import annotations

import json


class DevicePluginError(Exception):
    """A failure the module reports with fail_json; ``details`` are merged into the result."""

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.msg = msg
        self.details = details


class OptionError(DevicePluginError):
    """Bad or conflicting module options, found before any API call."""


class ConfigValidationError(DevicePluginError):
    """The device plugin configuration file has problems; ``problems`` lists each one with its path."""

    def __init__(self, problems: list[str]):
        super().__init__(
            "invalid device plugin config: " + "; ".join(problems),
            config_errors=list(problems),
        )
        self.problems = list(problems)


class ConnectionSetupError(DevicePluginError):
    """Credentials or connection settings could not be loaded (kubeconfig, in-cluster, TLS files)."""


class KubeTransportError(DevicePluginError):
    """The API server could not be reached or the TLS handshake failed."""


class WatchGone(Exception):
    """The watch's resourceVersion is too old (410 Gone): the caller lists again."""


class WatchInterrupted(Exception):
    """The watch stream broke, or the server answered 429/5xx: the caller backs off (``retry_after``: the server's
    Retry-After in seconds, if it sent one) and watches again."""

    def __init__(self, message: str = "", retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


_STATUS_HINTS = {
    401: "the API server did not accept the credentials (token expired or wrong, or client certificate unknown)",
    403: "the credentials are valid but lack RBAC permission for this request",
    404: "the object or its namespace does not exist, or the API group is not served",
    409: "conflict: another field manager owns these fields; set force_conflicts=true to take them over",
    422: "the API server rejected the object as invalid",
    429: "the API server is throttling requests",
}


class KubeApiError(DevicePluginError):
    """An HTTP error answer of the Kubernetes API server, with its status and reason."""

    def __init__(self, status: int, reason: str, method: str, path: str, body: bytes | str | None = None):
        self.status = status
        self.reason = reason or ""
        self.method = method
        self.path = path
        self.api_message = ""
        self.api_reason = ""
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {}
        if isinstance(parsed, dict):
            self.api_message = str(parsed.get("message") or "")
            self.api_reason = str(parsed.get("reason") or "")
        if not self.api_message and text and not isinstance(parsed, dict):
            self.api_message = text[:500]
        hint = _STATUS_HINTS.get(status)
        if hint is None and status >= 500:
            hint = "the API server failed to answer (server error)"
        parts = [f"{method} {path} failed: HTTP {status} {self.reason}".rstrip()]
        if self.api_reason and self.api_reason != self.reason:
            parts.append(f"({self.api_reason})")
        if self.api_message:
            parts.append(f"- {self.api_message}")
        if hint:
            parts.append(f"- {hint}")
        super().__init__(
            " ".join(parts),
            status=status,
            reason=self.api_reason or self.reason,
            api_message=self.api_message,
        )
