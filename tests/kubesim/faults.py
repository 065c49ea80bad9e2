"""API-server misbehaviour that big clusters and proxies produce, for the clients' robustness tests.

- ``throttle``: API Priority and Fairness rejects a share of requests with 429 and ``Retry-After`` (what a real
  kube-apiserver does when a priority level's queues are full), for a while or until stopped.
- ``set_watch_mode``: a watch that answers 200 and ends at once without an event (``ends_at_once``); one held open
  that sends only BOOKMARK events (``bookmarks_only``), or only blank lines (``trickle``), ignoring ``timeoutSeconds``,
  as a misbehaving server or an intermediary can.
- ``set_error_body_delay``: error answers send their headers at once and their ``Status`` body later, so a client
  that raises on the status line and returns the connection to its pool with the body unread reads that body as the
  next answer's status line.
- ``hold``: matching requests wait before they are served until ``release`` (or a bound), so that a test can stop a
  client at a known point (a playbook cancelled while its drain lists the node's pods) and know that it got there.
- A log of (monotonic time, verb, resource, HTTP status) for every resource request, to measure request rates.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from .errors import ApiError
from .store import dumps

WATCH_MODES = ("ends_at_once", "bookmarks_only", "trickle")
_THROTTLE_MESSAGE = "Too many requests, please try again later."


class FaultPlan:
    """The injected faults of one simulated cluster; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._throttle: dict[str, Any] | None = None
        self._credit = 0.0
        self._watch_mode: tuple[str, float, float] | None = None
        self.error_body_delay = 0.0
        self._log: list[tuple[float, str, str, int]] = []
        self._hold: dict[str, Any] | None = None
        self._held = 0

    # ----- configuration ----------------------------------------------------------------------------------------

    def throttle(
        self,
        share: float = 1.0,
        retry_after: int | None = 1,
        seconds: float | None = None,
        verbs: list[str] | tuple[str, ...] | None = None,
        path_regex: str | None = None,
        status: int = 429,
    ) -> None:
        """Reject ``share`` (0..1, spread evenly) of matching requests with ``status`` and ``Retry-After``.

        ``seconds``: for that long (None: until ``stop_throttle``); ``verbs``: only these (list, watch, get, patch...).
        """
        with self._lock:
            self._throttle = {
                "share": max(0.0, min(1.0, float(share))),
                "retry_after": retry_after,
                "until": None if seconds is None else time.monotonic() + float(seconds),
                "verbs": frozenset(verbs) if verbs else None,
                "pattern": re.compile(path_regex) if path_regex else None,
                "status": status,
            }
            self._credit = 0.0

    def stop_throttle(self) -> None:
        with self._lock:
            self._throttle = None

    def set_watch_mode(self, mode: str | None, interval: float = 0.1, hold: float = 8.0) -> None:
        """Make every watch misbehave as ``mode`` (one of WATCH_MODES; None: behave). ``hold``: how long a
        bookmarks_only or trickle stream stays open, whatever the client's ``timeoutSeconds``."""
        if mode is not None and mode not in WATCH_MODES:
            raise ValueError(f"unknown watch mode {mode!r}; known: {', '.join(WATCH_MODES)}")
        with self._lock:
            self._watch_mode = None if mode is None else (mode, float(interval), float(hold))

    def set_error_body_delay(self, seconds: float) -> None:
        with self._lock:
            self.error_body_delay = max(0.0, float(seconds))

    def hold(
        self, verbs: list[str] | tuple[str, ...] | None = None, path_regex: str | None = None, seconds: float = 60.0
    ) -> None:
        """Keep each matching request waiting, before it is served, until ``release`` (at most ``seconds``).

        A client stopped while it waits never gets an answer; the request is served once released, as a real server
        serves a request whose client went away (so hold reads, which change nothing).
        """
        with self._lock:
            self._hold = {
                "verbs": frozenset(verbs) if verbs else None,
                "pattern": re.compile(path_regex) if path_regex else None,
                "seconds": float(seconds),
                "released": threading.Event(),
            }
            self._held = 0

    def release(self) -> None:
        with self._lock:
            rule, self._hold = self._hold, None
        if rule is not None:
            rule["released"].set()

    def held(self) -> int:
        """How many requests the current (or last) hold has held, waiting now or released."""
        with self._lock:
            return self._held

    # ----- the server's hooks -----------------------------------------------------------------------------------

    def before_request(self, verb: str, resource: str, path: str) -> None:
        """Hold the request when asked; raise the 429 (or other status) the throttle decides for this request."""
        with self._lock:
            hold = self._hold
            if hold is not None and (hold["verbs"] is None or verb in hold["verbs"]):
                if hold["pattern"] is None or hold["pattern"].search(path):
                    self._held += 1
                else:
                    hold = None
            else:
                hold = None
        if hold is not None:
            hold["released"].wait(hold["seconds"])
        with self._lock:
            rule = self._throttle
            if rule is None:
                return
            if rule["until"] is not None and time.monotonic() >= rule["until"]:
                self._throttle = None
                return
            if rule["verbs"] is not None and verb not in rule["verbs"]:
                return
            if rule["pattern"] is not None and not rule["pattern"].search(path):
                return
            self._credit += rule["share"]
            if self._credit < 1.0 - 1e-9:
                return
            self._credit -= 1.0
        raise ApiError(rule["status"], _THROTTLE_MESSAGE, retry_after=rule["retry_after"])

    def record(self, started: float, verb: str, resource: str, status: int) -> None:
        with self._lock:
            self._log.append((started, verb, resource, status))

    def request_log(self) -> list[tuple[float, str, str, int]]:
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def serve_watch(self, handler: Any, kind: str, api_version: str, resource_version: str) -> bool:
        """Answer the watch in the misbehaving mode, if one is set; False: serve it normally."""
        with self._lock:
            mode = self._watch_mode
        if mode is None:
            return False
        name, interval, hold = mode
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("Cache-Control", "no-cache, private")
        handler.end_headers()
        stop = time.monotonic() + (0.0 if name == "ends_at_once" else hold)
        bookmark = {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": resource_version or "0"}}
        while time.monotonic() < stop:
            if name == "bookmarks_only":
                handler._chunk(b'{"type":"BOOKMARK","object":' + dumps(bookmark) + b"}\n")
            else:
                handler._chunk(b"\n")
            time.sleep(interval)
        handler._chunk(b"")
        return True
