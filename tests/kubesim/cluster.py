"""``SimCluster``: the simulated API server and cluster, started and stopped as a context manager."""

from __future__ import annotations

import base64
import collections
import re
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

import yaml

from .admission import SYSTEM_PRIORITY_CLASSES
from .api import Api
from .errors import ApiError
from .faults import FaultPlan
from .resources import BY_PLURAL, resource_for
from .server import SimHTTPServer
from .sim import CAPACITY_ANNOTATION, FAULTS, SimNode, Simulation, normalise_faults
from .store import Store, clone
from .tlsutil import make_ca, make_server_cert
from .workloads import Workloads

__all__ = ["CAPACITY_ANNOTATION", "FAULTS", "SimCluster", "SimNode"]

_DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_CONTROL_METHODS = frozenset(
    {
        "set_fault",
        "clear_fault",
        "drop_watches",
        "fail_requests",
        "set_latency",
        "compact",
        "reset_counts",
        "request_counts_json",
        "capacity_times",
        "add_node",
        # faults.FaultPlan
        "throttle",
        "stop_throttle",
        "set_watch_mode",
        "set_error_body_delay",
        "request_log",
        "reboot_node",
        "install_crd",
        "creations",
        "preemptions",
        "hold",
        "release",
        "held",
    }
)


class SimCluster:
    """A simulated Kubernetes API server on 127.0.0.1 with simulated GPU nodes.

    ``faults`` maps a node name (or ``"*"`` for every node) to fault names, as ``SimNode.faults`` does.
    ``forbidden_tokens`` authenticate but are refused (403) on every resource.
    ``gone_as_http``: answer a watch from an expired resourceVersion with HTTP 410 instead of the real server's
    200 stream carrying one ERROR event.
    """

    def __init__(
        self,
        nodes: Iterable[SimNode] = (),
        tls: bool = True,
        token: str | None = "test-token",
        capacity_delay: float = 0.2,
        capacity_spread: float = 0.0,
        *,
        faults: dict[str, Any] | None = None,
        forbidden_tokens: Iterable[str] = ("forbidden-token",),
        pod_start_delay: float = 0.05,
        history_size: int = 50_000,
        bookmark_interval: float = 5.0,
        gone_as_http: bool = False,
        port: int = 0,
        crds: Iterable[str] = (),
    ) -> None:
        self.tls = tls
        self.token = token
        self.forbidden_tokens = frozenset(forbidden_tokens)
        self.bookmark_interval = bookmark_interval
        self.gone_as_http = gone_as_http
        # Plurals of the CustomResourceDefinitions installed (kubesim knows "servicemonitors", the Prometheus
        # Operator's); their API is served only once installed.
        self.crds: set[str] = set(crds)
        self.store = Store(history_size=history_size)
        self.api = Api(self.store)
        self.sim = Simulation(self.api, capacity_delay, capacity_spread, pod_start_delay)
        # The scheduler and kubelet for pods no DaemonSet owns (run-to-completion pods, drains, GPU requests).
        self.workloads = Workloads(self.sim)
        self._port = port
        self._initial_nodes = list(nodes)
        self._initial_faults = dict(faults or {})
        self._lock = threading.Lock()
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._by_agent: collections.Counter[str] = collections.Counter()
        self._by_token: collections.Counter[str] = collections.Counter()
        self._failures: list[dict[str, Any]] = []
        self._latency = 0.0
        self._drop: tuple[int | None, float | None, bool] = (None, None, False)
        self._force_gone = False
        self.faults = FaultPlan()
        self._tmpdir: str | None = None
        self._server: SimHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.ca_file: str | None = None

    # ----- lifecycle --------------------------------------------------------------------------------------------

    def __enter__(self) -> SimCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._tmpdir = tempfile.mkdtemp(prefix="kubesim-")
        context = None
        if self.tls:
            self.ca_file, ca_key, ca_cert = make_ca(self._tmpdir)
            cert, key = make_server_cert(self._tmpdir, ca_key, ca_cert)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(cert, key)
            # HTTP/1.1 only: the Go client would otherwise try HTTP/2, which http.server does not speak.
            context.set_alpn_protocols(["http/1.1"])
        for name in _DEFAULT_NAMESPACES:
            self.api.create(
                BY_PLURAL["namespaces"], None, {"metadata": {"name": name}}, "kube-apiserver", keep_status=True
            )
            self.api.mutate(
                BY_PLURAL["namespaces"],
                None,
                name,
                lambda ns: ns.update(status={"phase": "Active"}),
                "kube-apiserver",
                subresource="status",
            )
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            # The API server creates these at start; the device plugin's pods use system-node-critical.
            self.api.create(
                BY_PLURAL["priorityclasses"],
                None,
                {"metadata": {"name": name}, "value": value, "description": f"Built-in {name} priority class"},
                "kube-apiserver",
            )
        for target, spec in self._initial_faults.items():
            self.sim.faults.setdefault(target, {}).update(normalise_faults(spec))
        for node in self._initial_nodes:
            self.sim.add_node(node)
        self.sim.start()
        self._server = SimHTTPServer(self, context, self._port)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="kubesim-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.store.close_watchers()
        if self._server is not None:
            self._server.shutdown()
            self._server.close_connections()
            self._server.server_close()
            self._server = None
        self.sim.stop()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # ----- connection details -----------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the cluster is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def kubeconfig_dict(self, context: str = "kubesim", namespace: str = "default") -> dict[str, Any]:
        cluster: dict[str, Any] = {"server": self.url}
        if self.tls and self.ca_file:
            with open(self.ca_file, "rb") as handle:
                cluster["certificate-authority-data"] = base64.b64encode(handle.read()).decode()
        user: dict[str, Any] = {"token": self.token} if self.token else {}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "preferences": {},
            "clusters": [{"name": context, "cluster": cluster}],
            "users": [{"name": f"{context}-user", "user": user}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": f"{context}-user", "namespace": namespace}}
            ],
            "current-context": context,
        }

    def write_kubeconfig(self, path: str, context: str = "kubesim", namespace: str = "default") -> str:
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.kubeconfig_dict(context, namespace), handle, sort_keys=False)
        return path

    # ----- objects ----------------------------------------------------------------------------------------------

    def add_node(self, node: SimNode | dict[str, Any]) -> None:
        self.sim.add_node(node if isinstance(node, SimNode) else SimNode(**node))

    def get_object(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """A copy of a stored object (``kind``: plural, singular, kind or short name), or None."""
        rtype = resource_for(kind)
        entry = self.store.get(rtype.plural, namespace if rtype.namespaced else None, name)
        return clone(entry.obj) if entry else None

    def list_objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        rtype = resource_for(kind)
        entries, _rv = self.api.list(rtype, namespace)
        return [clone(e.obj) for e in entries]

    def create_object(self, obj: dict[str, Any], manager: str = "kubesim-test") -> dict[str, Any]:
        rtype = resource_for(obj.get("kind", ""))
        namespace = (obj.get("metadata") or {}).get("namespace") or ("default" if rtype.namespaced else None)
        return clone(self.api.create(rtype, namespace, obj, manager))

    def delete_object(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.api.delete(resource_for(kind), namespace, name)

    def creations(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every object created since the start, in order: {"kind", "namespace", "name", "labels", "node",
        "manager"}; ``kind`` (plural, singular, kind or short name) keeps only that kind. Tests count pod creations."""
        wanted = resource_for(kind).kind if kind else None
        with self.store.lock:
            return [dict(c) for c in self.api.creations if wanted is None or c["kind"] == wanted]

    def preemptions(self) -> list[dict[str, Any]]:
        """Every preemption the simulated scheduler made: {"preemptor", "node", "victims"}."""
        return [dict(p) for p in self.workloads.preemptions]

    def pod_log(self, namespace: str, name: str, previous: bool = False) -> list[str]:
        return self.sim.pod_log(namespace, name, previous) or []

    def capacity_times(self) -> dict[str, float]:
        """When each node last reported GPU capacity (``time.time()``): for measuring detection delay."""
        return dict(self.sim.capacity_times)

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until the simulation has no work due now."""
        return self.sim.settle(timeout)

    def wait_for(self, predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return bool(predicate())

    def reboot_node(self, name: str, down_seconds: float = 2.0) -> str:
        """The node's machine rebooted: NotReady at once with a new ``nodeInfo.bootID``, Ready after ``down_seconds``.

        Returns the new boot ID. A demo tells a simulator in another process through ``/kubesim/control``.
        """
        return self.workloads.reboot_node(name, down_seconds)

    def install_crd(self, plural: str) -> None:
        """Install a CustomResourceDefinition kubesim knows (``servicemonitors``): its API appears at once."""
        from .resources import RESOURCES

        if not any(r.crd and r.plural == plural for r in RESOURCES):
            raise KeyError(f"kubesim knows no CRD {plural!r}")
        self.crds.add(plural)

    # ----- faults -----------------------------------------------------------------------------------------------

    def set_fault(self, node: str | None, fault: str, **params: Any) -> None:
        """Inject a fault on one node (or every node with ``None`` / ``"*"``); see ``FAULTS``.

        The plugin pods on the affected nodes restart under the new faults.
        """
        self.sim.set_fault(None if node == "*" else node, fault, **params)

    def clear_fault(self, node: str | None, fault: str | None = None) -> None:
        self.sim.clear_fault(None if node == "*" else node, fault)

    def drop_watches(
        self, after_events: int | None = None, after_seconds: float | None = None, clean: bool = False
    ) -> None:
        """Make watch streams end after N events or T seconds (both None: never).

        By default the connection is cut mid-stream, as a failing load balancer would; ``clean`` ends the chunked
        body properly instead, as the real server does at its own watch timeout.
        """
        with self._lock:
            self._drop = (after_events, after_seconds, clean)

    def watch_drop_policy(self) -> tuple[int | None, float | None, bool]:
        with self._lock:
            return self._drop

    def fail_requests(
        self, count: int = 1, status: int = 503, path_regex: str | None = None, retry_after: int | None = None
    ) -> None:
        """Answer the next ``count`` requests whose path matches ``path_regex`` (any, if None) with ``status``.

        ``retry_after`` adds a Retry-After header; note that urllib3 (under the Python client) then retries 429 and
        503 answers by itself, so the caller sees the failure only once the retries are spent.
        """
        with self._lock:
            self._failures.append(
                {
                    "count": count,
                    "status": status,
                    "retry_after": retry_after,
                    "pattern": re.compile(path_regex) if path_regex else None,
                }
            )

    def set_latency(self, seconds: float) -> None:
        with self._lock:
            self._latency = max(0.0, seconds)

    def compact(self) -> None:
        """Forget the event history: the next watch from any earlier resourceVersion gets 410 Gone."""
        self.store.compact()
        with self._lock:
            self._force_gone = True

    # Throttling, misbehaving watches and slow error bodies: see faults.FaultPlan.
    def throttle(self, *args: Any, **kwargs: Any) -> None:
        self.faults.throttle(*args, **kwargs)

    def stop_throttle(self) -> None:
        self.faults.stop_throttle()

    def set_watch_mode(self, mode: str | None, interval: float = 0.1, hold: float = 8.0) -> None:
        self.faults.set_watch_mode(mode, interval, hold)

    def set_error_body_delay(self, seconds: float) -> None:
        self.faults.set_error_body_delay(seconds)

    def request_log(self) -> list[tuple[float, str, str, int]]:
        """(monotonic start time, verb, resource, HTTP status) of every resource request, in order."""
        return self.faults.request_log()

    def hold(self, verbs: list[str] | None = None, path_regex: str | None = None, seconds: float = 60.0) -> None:
        """Keep matching requests waiting before they are served, until ``release`` (see faults.FaultPlan.hold)."""
        self.faults.hold(verbs, path_regex, seconds)

    def release(self) -> None:
        self.faults.release()

    def held(self) -> int:
        return self.faults.held()

    def consume_forced_gone(self) -> bool:
        with self._lock:
            forced, self._force_gone = self._force_gone, False
            return forced

    def before_request(self, path: str) -> None:
        with self._lock:
            latency = self._latency
            failure, retry_after = None, None
            for rule in self._failures:
                if rule["count"] > 0 and (rule["pattern"] is None or rule["pattern"].search(path)):
                    rule["count"] -= 1
                    failure, retry_after = rule["status"], rule["retry_after"]
                    break
            self._failures = [r for r in self._failures if r["count"] > 0]
        if latency:
            time.sleep(latency)
        if failure is not None:
            message = {
                500: "Internal error occurred: injected by kubesim",
                503: "the server is currently unable to handle the request",
                429: "the server has received too many requests and has asked us to try again later",
                504: "the server was unable to return a response in the time allotted",
            }.get(failure, f"injected failure {failure}")
            raise ApiError(failure, message, retry_after=retry_after)

    # ----- accounting -------------------------------------------------------------------------------------------

    def count_request(self, verb: str, resource: str, user_agent: str, token: str) -> None:
        with self._lock:
            self._counts[(verb, resource)] += 1
            self._by_agent[user_agent] += 1
            self._by_token[token] += 1

    def request_counts(self) -> dict[str, Any]:
        """{"total": n, "by_verb_resource": {(verb, resource): n}, "by_user_agent": {...}, "by_token": {...}}."""
        with self._lock:
            return {
                "total": sum(self._counts.values()),
                "by_verb_resource": dict(self._counts),
                "by_user_agent": dict(self._by_agent),
                "by_token": dict(self._by_token),
            }

    def request_counts_json(self) -> dict[str, Any]:
        counts = self.request_counts()
        counts["by_verb_resource"] = {f"{v} {r}": n for (v, r), n in counts["by_verb_resource"].items()}
        return counts

    def reset_counts(self) -> None:
        with self._lock:
            self._counts.clear()
            self._by_agent.clear()
            self._by_token.clear()
        self.faults.clear_log()

    def control(self, method: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run one whitelisted method (for the ``/kubesim/control`` endpoint)."""
        if method not in _CONTROL_METHODS:
            raise ApiError(400, f"unknown kubesim control method {method!r}")
        try:
            return getattr(self, method)(*args, **kwargs)
        except (TypeError, ValueError, KeyError) as exc:
            raise ApiError(400, f"{method}: {exc}") from exc
