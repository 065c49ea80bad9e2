"""The HTTP(S) front of the simulator: routing, authentication, injected faults, lists, watches and logs."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import ssl
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import yaml

from . import resources as res
from .api import PATCH_TYPES
from .errors import ApiError, status_object
from .eviction import evict
from .resources import BY_PATH, ResourceType
from .selectors import parse_field_selector, parse_label_selector
from .store import Entry, Event, dumps

if TYPE_CHECKING:
    from .cluster import SimCluster

LOG = logging.getLogger("kubesim")
_UNAUTHENTICATED = frozenset({"/version", "/version/", "/healthz", "/livez", "/readyz"})
_MAX_WATCH_SECONDS = 1800.0


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Idle keep-alive connections must not hold up shutdown.
    block_on_close = False
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, cluster: SimCluster, ssl_context: ssl.SSLContext | None, port: int = 0) -> None:
        # Loopback only: this server must never be reachable from another machine.
        super().__init__(("127.0.0.1", port), SimRequestHandler)
        self.cluster = cluster
        self.ssl_context = ssl_context
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake happens here, in the connection's own thread, so a slow client cannot stall accept().
        conn = request
        if self.ssl_context is not None:
            try:
                request.settimeout(10)
                conn = self.ssl_context.wrap_socket(request, server_side=True)
                conn.settimeout(None)
            except (ssl.SSLError, OSError):
                request.close()
                return
        with self._connections_lock:
            self._connections.add(conn)
        try:
            self.RequestHandlerClass(conn, client_address, self)
        finally:
            with self._connections_lock:
                self._connections.discard(conn)
            with contextlib.suppress(OSError):
                conn.close()

    def close_connections(self) -> None:
        with self._connections_lock:
            conns = list(self._connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        LOG.debug("connection error from %s:\n%s", client_address, traceback.format_exc())


class _WatchDropped(Exception):
    """The injected fault ends a watch stream by closing the connection."""


def _single(query: dict[str, list[str]], name: str, default: str | None = None) -> str | None:
    values = query.get(name)
    return values[-1] if values else default


def _resource_version(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise ApiError(400, f'invalid resource version "{text}"') from exc


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _age(stamp: str) -> str:
    try:
        created = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except (ValueError, TypeError):
        return "<unknown>"
    seconds = max(0, int(time.time() - created))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


class SimRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kubesim"
    sys_version = ""
    server: SimHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # ----- plumbing ---------------------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status_sent = code
        super().send_response(code, message)

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        body_delay: float = 0.0,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-cache, private")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body_delay:
            # faults.FaultPlan.set_error_body_delay: the status line now, the body later.
            self.wfile.flush()
            time.sleep(body_delay)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, code: int, obj: Any) -> None:
        self._send(code, dumps(obj))

    def _send_error(self, error: ApiError) -> None:
        headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
        self._send(
            error.code, dumps(error.status()), headers=headers, body_delay=self.server.cluster.faults.error_body_delay
        )

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _parse_body(self, raw: bytes) -> Any:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            pass
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ApiError(400, f"error decoding the request body: {exc}") from exc

    # ----- dispatch ---------------------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        cluster = self.server.cluster
        raw = self._read_body()
        url = urlsplit(self.path)
        path = url.path.rstrip("/") or "/"
        query = parse_qs(url.query, keep_blank_values=True)
        token = ""
        auth = self.headers.get("Authorization") or ""
        if auth.lower().startswith("bearer "):
            token = auth[7:].strip()
        verb, resource, started = "", "", time.monotonic()
        self.status_sent = 0
        try:
            if path.startswith("/kubesim/"):
                self._authenticate(cluster, token, path)
                self._control(method, path, raw)
                return
            target = self._target(path)
            if target is not None and not res.served(target[0], cluster.crds):
                raise ApiError(404, "the server could not find the requested resource", details={})
            verb, resource = self._classify(method, target, query, path)
            cluster.count_request(verb, resource, self.headers.get("User-Agent") or "", token)
            cluster.before_request(path)
            cluster.faults.before_request(verb, resource, path)
            self._authenticate(cluster, token, path)
            if target is None:
                self._discovery(path)
                return
            if token and token in cluster.forbidden_tokens:
                rtype = target[0]
                scope = f'in the namespace "{target[1]}"' if target[1] else "at the cluster scope"
                raise ApiError(
                    403,
                    f'{rtype.qualified} is forbidden: User "system:serviceaccount:default:restricted" cannot {verb} '
                    f'resource "{rtype.plural}" in API group "{rtype.group}" {scope}',
                    details={"group": rtype.group, "kind": rtype.plural},
                )
            self._resource(method, target, query, raw)
        except _WatchDropped:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except ApiError as error:
            self._send_error(error)
        except (ConnectionError, ssl.SSLError, TimeoutError):
            # The client went away mid-answer (a watch it stopped reading, a process it killed).
            self.close_connection = True
        except Exception as exc:  # pylint: disable=broad-exception-caught
            # A server answers 500 rather than dropping the connection, so a bug shows up as a readable error.
            LOG.error("kubesim internal error on %s %s:\n%s", method, self.path, traceback.format_exc())
            self._send_error(ApiError(500, f"Internal error occurred: kubesim: {exc!r}"))
        finally:
            if verb:
                cluster.faults.record(started, verb, resource, self.status_sent)

    def _authenticate(self, cluster: SimCluster, token: str, path: str) -> None:
        if cluster.token is None or path in _UNAUTHENTICATED:
            return
        if token != cluster.token and token not in cluster.forbidden_tokens:
            raise ApiError(401, "Unauthorized")

    @staticmethod
    def _target(path: str) -> tuple[ResourceType, str | None, str | None, str | None] | None:
        """(type, namespace, name, subresource) for a resource path; None for everything else."""
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 3:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 4:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            inner = BY_PATH.get((group, version, rest[2]))
            if inner is not None and inner.namespaced:
                namespace, rest = rest[1], rest[2:]
        rtype = BY_PATH.get((group, version, rest[0]))
        if rtype is None or len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource", details={})
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in rtype.subresources:
            raise ApiError(404, "the server could not find the requested resource", details={})
        return rtype, namespace, name, sub

    @staticmethod
    def _classify(
        method: str,
        target: tuple[ResourceType, str | None, str | None, str | None] | None,
        query: dict[str, list[str]],
        path: str,
    ) -> tuple[str, str]:
        if target is None:
            return "get", "openapi" if path.startswith("/openapi") else "discovery"
        rtype, _ns, name, sub = target
        resource = f"{rtype.plural}/{sub}" if sub else rtype.plural
        if method == "GET":
            if name is not None:
                return "get", resource
            return ("watch" if _truthy(_single(query, "watch")) else "list"), resource
        verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
        if method == "DELETE":
            return ("delete" if name else "deletecollection"), resource
        return verbs.get(method, method.lower()), resource

    # ----- discovery --------------------------------------------------------------------------------------------

    def _discovery(self, path: str) -> None:
        host, port = self.server.server_address[:2]
        crds = self.server.cluster.crds
        doc: Any = None
        if path == "/version":
            doc = res.SERVER_VERSION
        elif path in ("/healthz", "/livez", "/readyz"):
            self._send(200, b"ok", "text/plain")
            return
        elif path == "/api":
            doc = res.api_versions(f"{host}:{port}")
        elif path == "/api/v1":
            doc = res.api_resource_list("", "v1", crds)
        elif path == "/apis":
            doc = res.api_group_list(crds)
        elif path.startswith("/apis/"):
            parts = path.split("/")[2:]
            doc = res.api_group(parts[0], crds) if len(parts) == 1 else res.api_resource_list(parts[0], parts[1], crds)
        elif path == "/openapi/v3":
            doc = res.openapi_v3_root(crds)
        elif path.startswith("/openapi/v3/"):
            parts = path[len("/openapi/v3/") :].split("/")
            if parts[0] == "api" and len(parts) == 2:
                doc = res.openapi_v3_document("", parts[1], crds)
            elif parts[0] == "apis" and len(parts) == 3:
                doc = res.openapi_v3_document(parts[1], parts[2], crds)
        if doc is None:
            raise ApiError(404, "the server could not find the requested resource", details={})
        self._send_json(200, doc)

    # ----- resources --------------------------------------------------------------------------------------------

    def _resource(
        self,
        method: str,
        target: tuple[ResourceType, str | None, str | None, str | None],
        query: dict[str, list[str]],
        raw: bytes,
    ) -> None:
        cluster = self.server.cluster
        api = cluster.api
        rtype, namespace, name, sub = target
        dry_run_value = _single(query, "dryRun")
        if dry_run_value not in (None, "", "All"):
            raise ApiError(400, f'dryRun: Unsupported value: "{dry_run_value}": supported values: "All"')
        dry_run = dry_run_value == "All"
        manager = _single(query, "fieldManager") or (self.headers.get("User-Agent") or "unknown").split("/")[0]
        if method == "GET":
            if name is None:
                if _truthy(_single(query, "watch")):
                    self._watch(rtype, namespace, query)
                else:
                    self._list(rtype, namespace, query)
            elif sub == "log":
                self._log(namespace, name, query)
            else:
                self._send_object(200, api.get(rtype, namespace, name).obj, rtype)
            return
        body = self._parse_body(raw)
        if method == "POST" and sub == "eviction" and name is not None:
            self._send_json(201, evict(api, namespace or "default", name, body, dry_run))
            return
        if method == "POST" and name is None:
            self._send_json(201, api.create(rtype, namespace, body or {}, manager, dry_run))
        elif method == "PUT" and name is not None:
            self._send_json(200, api.update(rtype, namespace, name, body or {}, manager, dry_run, sub or ""))
        elif method == "PATCH" and name is not None:
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            kind = PATCH_TYPES.get(content_type)
            if kind is None:
                raise ApiError(
                    415,
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {', '.join(PATCH_TYPES)}",
                )
            if kind == "apply":
                if sub:
                    raise ApiError(400, "apply to a subresource is not supported by kubesim")
                force = _truthy(_single(query, "force"))
                obj, created = api.apply(
                    rtype, namespace, name, body or {}, _single(query, "fieldManager") or "", force, dry_run
                )
                self._send_json(201 if created else 200, obj)
            else:
                self._send_json(200, api.patch(rtype, namespace, name, body, kind, manager, dry_run, sub or ""))
        elif method == "DELETE" and name is not None:
            options = body if isinstance(body, dict) else {}
            propagation = _single(query, "propagationPolicy") or options.get("propagationPolicy")
            if options.get("dryRun") == ["All"]:
                dry_run = True
            self._send_json(200, api.delete(rtype, namespace, name, propagation, dry_run))
        elif method == "DELETE":
            matches = self._predicate(rtype, query)
            entries, _rv = api.list(rtype, namespace, matches)
            deleted = [
                api.delete(rtype, e.obj["metadata"].get("namespace"), e.obj["metadata"]["name"], None, dry_run)
                for e in entries
            ]
            self._send_json(
                200,
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": {},
                    "items": [d for d in deleted if d.get("kind") != "Status"],
                },
            )
        else:
            raise ApiError(405, "the server does not allow this method on the requested resource")

    def _predicate(self, rtype: ResourceType, query: dict[str, list[str]]) -> Any:
        labels = parse_label_selector(_single(query, "labelSelector"))
        fields_match = parse_field_selector(_single(query, "fieldSelector"), rtype.plural)
        return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields_match(obj)

    def _wants_table(self) -> bool:
        return "as=Table" in (self.headers.get("Accept") or "")

    def _send_object(self, code: int, obj: dict[str, Any], rtype: ResourceType) -> None:
        if self._wants_table():
            self._send_json(code, _table(rtype, [obj], obj["metadata"].get("resourceVersion", "")))
        else:
            self._send_json(code, obj)

    def _list(self, rtype: ResourceType, namespace: str | None, query: dict[str, list[str]]) -> None:
        cluster = self.server.cluster
        store = cluster.store
        wanted_rv = _single(query, "resourceVersion")
        exact = _single(query, "resourceVersionMatch") == "Exact"
        if exact and wanted_rv not in (None, "", "0") and _resource_version(wanted_rv) < store.oldest_rv:
            raise ApiError(410, f"too old resource version: {wanted_rv} ({store.oldest_rv + 1})")
        entries, rv = cluster.api.list(rtype, namespace, self._predicate(rtype, query))
        limit = int(_single(query, "limit") or 0)
        token = _single(query, "continue")
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if token:
            try:
                cont = json.loads(base64.urlsafe_b64decode(token.encode()))
                start_rv, last = int(cont["rv"]), tuple(cont["key"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ApiError(400, "continue key is not valid") from exc
            if start_rv < store.oldest_rv:
                raise ApiError(
                    410,
                    "The provided continue parameter is too old to display a consistent list result. "
                    "You can start a new list without the continue parameter.",
                )
            entries = [e for e in entries if (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]) > last]
            meta["resourceVersion"] = str(start_rv)
            rv = start_rv
        if limit and len(entries) > limit:
            last_obj = entries[limit - 1].obj["metadata"]
            key = [last_obj.get("namespace", ""), last_obj["name"]]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps({"rv": rv, "key": key}).encode()).decode()
            meta["remainingItemCount"] = len(entries) - limit
            entries = entries[:limit]
        if self._wants_table():
            table = _table(rtype, [e.obj for e in entries], meta["resourceVersion"])
            table["metadata"] = meta
            self._send_json(200, table)
            return
        head = dumps({"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version, "metadata": meta})
        # Items are spliced in from each object's cached JSON: a list of 5,000 nodes costs a join, not a re-encode.
        body = head[:-1] + b',"items":[' + b",".join(e.raw for e in entries) + b"]}"
        self._send(200, body)

    def _log(self, namespace: str | None, name: str, query: dict[str, list[str]]) -> None:
        cluster = self.server.cluster
        pod = cluster.api.get(res.BY_PLURAL["pods"], namespace, name).obj
        containers = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []]
        container = _single(query, "container")
        if container is None:
            if len(containers) > 1:
                raise ApiError(
                    400, f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]"
                )
            container = containers[0] if containers else ""
        elif container not in containers:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        previous = _truthy(_single(query, "previous"))
        statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
        status = statuses.get(container, {})
        waiting = (status.get("state") or {}).get("waiting") or {}
        if previous and not status.get("restartCount"):
            raise ApiError(400, f'previous terminated container "{container}" in pod "{name}" not found')
        if not previous and (
            not status
            or waiting.get("reason") in ("ContainerCreating", "ErrImagePull", "ImagePullBackOff", "PodInitializing")
        ):
            reason = waiting.get("reason", "ContainerCreating")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                reason = "trying and failing to pull image"
            raise ApiError(400, f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        lines = cluster.sim.pod_log(namespace or "", name, previous) or []
        tail = _single(query, "tailLines")
        if tail not in (None, ""):
            count = int(tail)
            lines = lines[-count:] if count > 0 else []
        self._send(200, "".join(f"{line}\n" for line in lines).encode(), "text/plain")

    # ----- watch ------------------------------------------------------------------------------------------------

    def _watch(self, rtype: ResourceType, namespace: str | None, query: dict[str, list[str]]) -> None:
        cluster = self.server.cluster
        store = cluster.store
        matches = self._predicate(rtype, query)
        wanted = _single(query, "resourceVersion") or ""
        initial = _truthy(_single(query, "sendInitialEvents"))
        bookmarks = _truthy(_single(query, "allowWatchBookmarks"))
        timeout = min(float(_single(query, "timeoutSeconds") or _MAX_WATCH_SECONDS), _MAX_WATCH_SECONDS)
        table = self._wants_table()
        ns = namespace if rtype.namespaced else None
        if cluster.faults.serve_watch(self, rtype.kind, rtype.api_version, _single(query, "resourceVersion") or ""):
            return

        def visible(obj: dict[str, Any]) -> bool:
            return (ns is None or obj["metadata"].get("namespace") == ns) and bool(matches(obj))

        gone: str | None = None
        with store.lock:
            if wanted in ("", "0") or initial:
                snapshot, rv = store.list(rtype.plural, ns)
                watcher, _backlog = store.watch(rtype.plural, ns, visible, None)
                backlog: list[tuple[str, Entry]] = [("ADDED", e) for e in snapshot if visible(e.obj)]
            else:
                since = _resource_version(wanted)
                rv = since
                forced = cluster.consume_forced_gone()
                if since < store.oldest_rv or forced:
                    gone = f"too old resource version: {since} ({store.oldest_rv + 1})"
                    watcher = None
                    backlog = []
                else:
                    watcher, events = store.watch(rtype.plural, ns, visible, since)
                    backlog = [pair for pair in (_translate(e, visible) for e in events) if pair]
                    rv = max([since] + [e.rv for e in events])
        if gone is not None and cluster.gone_as_http:
            raise ApiError(410, gone)

        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        if watcher is None:
            self._chunk(b'{"type":"ERROR","object":' + dumps(status_object(410, gone or "", "Expired")) + b"}\n")
            self._chunk(b"")
            return

        drop_events, drop_seconds, clean_drop = cluster.watch_drop_policy()
        started = time.monotonic()
        deadline = started + timeout
        sent = 0
        last_rv = rv
        last_bookmark = started

        def emit(kind: str, entry: Entry) -> None:
            nonlocal sent, last_rv
            obj_raw = dumps(_table(rtype, [entry.obj], "")) if table else entry.raw
            self._chunk(b'{"type":"' + kind.encode() + b'","object":' + obj_raw + b"}\n")
            sent += 1
            last_rv = max(last_rv, int(entry.obj["metadata"].get("resourceVersion") or 0))
            if drop_events is not None and sent >= drop_events:
                raise _WatchDropped

        def bookmark(extra: dict[str, str] | None = None) -> None:
            meta: dict[str, Any] = {"resourceVersion": str(last_rv)}
            if extra:
                meta["annotations"] = extra
            obj = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta}
            self._chunk(b'{"type":"BOOKMARK","object":' + dumps(obj) + b"}\n")

        try:
            for kind, entry in backlog:
                emit(kind, entry)
            last_rv = max(last_rv, rv)
            if initial:
                bookmark({"k8s.io/initial-events-end": "true"})
            self.wfile.flush()
            while True:
                now = time.monotonic()
                if now >= deadline:
                    break
                if drop_seconds is not None and now - started >= drop_seconds:
                    raise _WatchDropped
                wait = deadline - now
                if drop_seconds is not None:
                    wait = min(wait, drop_seconds - (now - started))
                if bookmarks:
                    wait = min(wait, max(0.0, cluster.bookmark_interval - (now - last_bookmark)))
                events = watcher.next_events(max(0.0, wait))
                if watcher.overflowed:
                    self._chunk(
                        b'{"type":"ERROR","object":'
                        + dumps(status_object(410, "too old resource version: watcher fell behind", "Expired"))
                        + b"}\n"
                    )
                    break
                if watcher.closed:
                    break
                for event in events:
                    pair = _translate(event, visible)
                    if pair:
                        emit(*pair)
                    last_rv = max(last_rv, event.rv)
                if bookmarks and time.monotonic() - last_bookmark >= cluster.bookmark_interval:
                    bookmark()
                    last_bookmark = time.monotonic()
            self._chunk(b"")
        except _WatchDropped:
            if clean_drop:
                self._chunk(b"")
                self.close_connection = True
                return
            raise
        finally:
            store.unwatch(watcher)

    # ----- control ----------------------------------------------------------------------------------------------

    def _control(self, method: str, path: str, raw: bytes) -> None:
        """A small JSON endpoint so a benchmark or demo can drive a simulator running in another process."""
        cluster = self.server.cluster
        if path == "/kubesim/counts" and method == "GET":
            self._send_json(200, cluster.request_counts_json())
            return
        if path == "/kubesim/control" and method == "POST":
            body = self._parse_body(raw) or {}
            self._send_json(
                200,
                {"result": cluster.control(body.get("method", ""), body.get("args") or [], body.get("kwargs") or {})},
            )
            return
        raise ApiError(404, "the server could not find the requested resource", details={})


def _translate(event: Event, visible: Any) -> tuple[str, Entry] | None:
    """The event a watcher with a selector sees: objects entering or leaving the selection become ADDED/DELETED."""
    now_visible = visible(event.entry.obj)
    was_visible = event.old is not None and visible(event.old.obj)
    if event.type == "ADDED":
        return ("ADDED", event.entry) if now_visible else None
    if event.type == "DELETED":
        return ("DELETED", event.entry) if (was_visible or now_visible) else None
    if now_visible and was_visible:
        return ("MODIFIED", event.entry)
    if now_visible:
        return ("ADDED", event.entry)
    if was_visible:
        return ("DELETED", event.entry)
    return None


def _table(rtype: ResourceType, objs: list[dict[str, Any]], rv: str) -> dict[str, Any]:
    """Server-side printing (what ``kubectl get`` asks for), with the columns kubectl users expect."""
    columns: list[tuple[str, str]] = [("Name", "string")]
    if rtype.plural == "nodes":
        columns += [("Status", "string"), ("Roles", "string"), ("Age", "string"), ("Version", "string")]
    elif rtype.plural == "pods":
        columns += [("Ready", "string"), ("Status", "string"), ("Restarts", "string"), ("Age", "string")]
    elif rtype.plural == "daemonsets":
        columns += [(c, "integer") for c in ("Desired", "Current", "Ready", "Up-to-date", "Available")]
        columns += [("Node Selector", "string"), ("Age", "string")]
    else:
        columns += [("Age", "string")]
    rows = []
    for obj in objs:
        meta = obj["metadata"]
        status = obj.get("status") or {}
        cells: list[Any] = [meta["name"]]
        if rtype.plural == "nodes":
            ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
            state = "Ready" if ready.get("status") == "True" else "NotReady"
            if (obj.get("spec") or {}).get("unschedulable"):
                state += ",SchedulingDisabled"
            cells += [
                state,
                "<none>",
                _age(meta.get("creationTimestamp", "")),
                (status.get("nodeInfo") or {}).get("kubeletVersion", ""),
            ]
        elif rtype.plural == "pods":
            statuses = status.get("containerStatuses") or []
            ready = sum(1 for s in statuses if s.get("ready"))
            waiting = next(
                (
                    (s.get("state") or {}).get("waiting", {}).get("reason")
                    for s in statuses
                    if (s.get("state") or {}).get("waiting")
                ),
                None,
            )
            cells += [
                f"{ready}/{len((obj.get('spec') or {}).get('containers') or [])}",
                waiting or status.get("phase", "Pending"),
                str(sum(int(s.get("restartCount", 0)) for s in statuses)),
                _age(meta.get("creationTimestamp", "")),
            ]
        elif rtype.plural == "daemonsets":
            selector = ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("nodeSelector") or {}
            cells += [
                status.get(k, 0)
                for k in (
                    "desiredNumberScheduled",
                    "currentNumberScheduled",
                    "numberReady",
                    "updatedNumberScheduled",
                    "numberAvailable",
                )
            ]
            cells += [
                ",".join(f"{k}={v}" for k, v in selector.items()) or "<none>",
                _age(meta.get("creationTimestamp", "")),
            ]
        else:
            cells.append(_age(meta.get("creationTimestamp", "")))
        rows.append(
            {
                "cells": cells,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta},
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": [
            {"name": name, "type": kind, "format": "name" if name == "Name" else "", "description": name, "priority": 0}
            for name, kind in columns
        ],
        "rows": rows,
    }
