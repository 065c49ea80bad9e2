# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: the event-driven wait for GPU capacity.
#
# One list of nodes, then one watch from that list's resourceVersion; each event re-evaluates only the node it names,
# so the cost per event does not depend on the cluster's size. A stream that ends or breaks before the deadline is
# resumed from its last resourceVersion (after a backoff when it ended early); a 410 Gone (history compacted) leads
# to a fresh list, at most one per MIN_RELIST_INTERVAL. At the deadline the nodes still pending are read once more
# (refresh_pending): a server that throttled every watch showed the wait nothing since its list, and a node must not
# be blamed for GPUs it reported seconds ago. Pods are read only to explain a timeout (one list by label, then the
# logs of at most MAX_LOGS failing pods). The clock and sleep are parameters so tests control time.

from __future__ import annotations

import time

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import retry_delay
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import (
    KubeApiError,
    KubeTransportError,
    WatchGone,
    WatchInterrupted,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.manifests import (
    CONTAINER_NAME,
    MPS_CONTAINER_NAME,
    MPS_POD_SELECTOR,
    POD_SELECTOR,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.readiness import (
    diagnose,
    log_tail,
    mps_daemon_problem,
    needs_logs,
    node_state,
    plugin_would_run,
    pod_problem,
    pods_by_node,
)

NODES_PATH = "/api/v1/nodes"
MAX_LOGS = 5
LOG_TAIL_LINES = 20
LOG_LIMIT_BYTES = 16384
# The fresh read at the deadline: GETs of single nodes up to this many pending, one list beyond; its own time budget.
MAX_SINGLE_READS = 10
REFRESH_BUDGET = 10.0
# The Go client's reflector: a watch shorter than this, or without events, counts as ending early.
HEALTHY_WATCH_SECONDS = 1.0
MIN_RELIST_INTERVAL = 1.0
LIST_TIMEOUT = 60.0


def slim_node(node: dict) -> dict:
    """Only what readiness and diagnosis read, so that thousands of nodes stay small in memory."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {}},
        "spec": {"taints": (node.get("spec") or {}).get("taints") or []},
        "status": {
            "capacity": {k: v for k, v in (status.get("capacity") or {}).items() if k.startswith("nvidia.com/")},
            "allocatable": {k: v for k, v in (status.get("allocatable") or {}).items() if k.startswith("nvidia.com/")},
            "conditions": [c for c in status.get("conditions") or [] if c.get("type") == "Ready"],
        },
    }


class CapacityWait:
    """Tracks the nodes the wait covers and which of them are done."""

    def __init__(
        self,
        plan: dict,
        pod_spec: dict,
        expected: dict | None = None,
        names: list | None = None,
        resources: dict | None = None,
    ):
        self.plan = plan
        self.pod_spec = pod_spec
        self.expected = expected
        # Per node, the resources it must advertise (before sharing), such as its MIG devices.
        self.resources = resources or {}
        self.fixed_targets = set(expected) if expected is not None else (set(names) if names else None)
        if self.resources:
            self.fixed_targets = (self.fixed_targets or set()) | set(self.resources)
        self.nodes: dict = {}
        self.states: dict = {}
        self.pending: set = set()

    def _physical(self, name: str):
        return None if self.expected is None else self.expected.get(name)

    def _is_target(self, name: str) -> bool:
        if self.fixed_targets is not None:
            return name in self.fixed_targets
        node = self.nodes.get(name)
        return node is not None and plugin_would_run(node, self.pod_spec)

    def update(self, name: str) -> None:
        if not self._is_target(name):
            self.states.pop(name, None)
            self.pending.discard(name)
            return
        state = node_state(self.nodes.get(name), name, self.plan, self._physical(name), self.resources.get(name))
        self.states[name] = state
        if state["done"]:
            self.pending.discard(name)
        else:
            self.pending.add(name)

    def reset(self, nodes: dict) -> None:
        self.nodes = nodes
        self.states = {}
        self.pending = set()
        names = set(self.fixed_targets) if self.fixed_targets is not None else set(nodes)
        for name in names:
            self.update(name)

    def apply_event(self, event: dict) -> None:
        obj = event.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if event.get("type") == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = slim_node(obj)
        self.update(name)

    def complete(self) -> bool:
        return bool(self.states) and not self.pending


def _selectors(pod_spec: dict, fixed_targets) -> dict:
    query = {}
    if fixed_targets is None and pod_spec.get("nodeSelector"):
        # The server filters by the plugin's node selector, so nodes that can never run it cost no traffic.
        query["labelSelector"] = ",".join(f"{k}={v}" for k, v in sorted(pod_spec["nodeSelector"].items()))
    return query


def wait_for_capacity(client, tracker: CapacityWait, timeout: float, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Wait until every covered node is done or the timeout passes; returns counters and the outcome.

    ``timeout`` bounds the whole wait whatever the server does: each request gets the remaining time as its own
    deadline (retries included), each watch asks the server to end by then and is ended by the client at that time.
    A watch that ends normally is resumed from its last resourceVersion. One that fails (429/5xx, a broken stream) is
    resumed too, after a backoff. One that ends at once without an event, or a 410 Gone, leads to a new list, never
    sooner than MIN_RELIST_INTERVAL after the previous one. Backoffs grow exponentially with jitter while watches keep
    failing, and are never shorter than the server's Retry-After, as with the Go client's reflector.
    """
    start = clock()
    deadline = start + timeout
    selectors = _selectors(tracker.pod_spec, tracker.fixed_targets)
    lists = watches = 0
    last_list = None
    version = None
    failures = 0
    while clock() < deadline:
        if version is None:
            if last_list is not None:
                pause = last_list + MIN_RELIST_INTERVAL - clock()
                if pause > 0:
                    if clock() + pause >= deadline:
                        break
                    sleep(pause)
            last_list = clock()
            listing = client.request(
                "GET", NODES_PATH, query=selectors or None, timeout=LIST_TIMEOUT, deadline=deadline
            )
            lists += 1
            tracker.reset({node["metadata"]["name"]: slim_node(node) for node in listing.get("items") or []})
            if tracker.complete():
                break
            version = (listing.get("metadata") or {}).get("resourceVersion")
        remaining = deadline - clock()
        if remaining <= 0:
            break
        watches += 1
        opened = clock()
        events = 0
        retry_after = None
        try:
            for event in client.watch(NODES_PATH, dict(selectors, resourceVersion=version), timeout=remaining):
                version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion") or version
                if event.get("type") != "BOOKMARK":
                    events += 1
                    tracker.apply_event(event)
                if tracker.complete() or clock() >= deadline:
                    break
        except WatchGone:
            version = None
            continue
        except WatchInterrupted as error:
            # Throttled, a server error or a broken stream: back off, then resume from the last resourceVersion.
            retry_after = error.retry_after
            events = 0
        else:
            if tracker.complete() or clock() >= deadline:
                break
            if clock() - opened >= HEALTHY_WATCH_SECONDS:
                # A normal end (the server's own timeout, a restart): resume at once.
                failures = 0
                continue
            if not events:
                # Ended at once without an event: the stream cannot be trusted, so list again, after a backoff.
                version = None
        if tracker.complete() or clock() >= deadline:
            break
        failures += 1
        delay = retry_delay(failures, retry_after)
        if clock() + delay >= deadline:
            sleep(max(0.0, deadline - clock()))
            break
        sleep(delay)
    return {
        "done": tracker.complete(),
        "waited": round(clock() - start, 3),
        "lists": lists,
        "watches": watches,
    }


def refresh_pending(client, tracker: CapacityWait, clock=time.monotonic, budget: float = REFRESH_BUDGET) -> str | None:
    """Read the nodes still pending afresh and judge them again; None, or why the read failed.

    What the tracker holds comes from the last list and the events since: when every watch was throttled or broken,
    that is the list from the start of the wait. One GET per node for a few pending nodes (a 404: the node is gone),
    one list (with the wait's label selector) for more. The read has ``budget`` seconds of its own, retries included,
    so a throttling server delays the result by at most that much.
    """
    if not tracker.pending:
        return None
    deadline = clock() + budget
    try:
        if len(tracker.pending) <= MAX_SINGLE_READS:
            for name in sorted(tracker.pending):
                node = client.get_or_none(f"{NODES_PATH}/{name}", deadline=deadline)
                tracker.apply_event(
                    {"type": "DELETED", "object": {"metadata": {"name": name}}}
                    if node is None
                    else {"type": "MODIFIED", "object": node}
                )
        else:
            selectors = _selectors(tracker.pod_spec, tracker.fixed_targets)
            listing = client.request(
                "GET", NODES_PATH, query=selectors or None, timeout=LIST_TIMEOUT, deadline=deadline
            )
            tracker.reset({node["metadata"]["name"]: slim_node(node) for node in listing.get("items") or []})
    except KubeApiError as error:
        return f"{error.status} {error.api_reason or error.reason}: {error.api_message or error}".strip()
    except KubeTransportError as error:
        return error.msg
    return None


def _pod_logs(client, namespace: str, pod: dict, container: str = CONTAINER_NAME) -> str | None:
    kind, _text = pod_problem(pod)
    query = {"container": container, "tailLines": LOG_TAIL_LINES, "limitBytes": LOG_LIMIT_BYTES}
    if kind in ("crash_loop", "terminated"):
        query["previous"] = "true"
    path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/log"
    try:
        return client.get_text(path, query)
    except (KubeApiError, KubeTransportError):
        # A missing log leaves the rest of the diagnosis intact.
        return None


def _daemonset_create_failure(client, namespace: str, daemonset: str) -> str | None:
    """The newest FailedCreate event of the DaemonSet (a missing RuntimeClass, a quota, an admission webhook)."""
    selector = f"involvedObject.kind=DaemonSet,involvedObject.name={daemonset},reason=FailedCreate"
    try:
        listing = client.request("GET", f"/api/v1/namespaces/{namespace}/events", query={"fieldSelector": selector})
    except (KubeApiError, KubeTransportError):
        return None
    events = listing.get("items") or []
    if not events:
        return None
    newest = max(events, key=lambda event: event.get("lastTimestamp") or event.get("eventTime") or "")
    return newest.get("message") or None


def diagnose_timeout(
    client, tracker: CapacityWait, namespace: str, daemonset: str | None = None, known_unhealthy: dict | None = None
) -> list:
    """One message per node not done: a single pod list, then logs of at most MAX_LOGS failing pods.

    ``known_unhealthy``: node -> what the GPU health check found (kubegpu.node.gpu_health), added to its message.
    """
    messages = _diagnose_timeout(client, tracker, namespace, daemonset)
    if not tracker.states:
        return messages
    # One message per pending node, in sorted order, as _diagnose_timeout writes them.
    return [_with_known(message, name, known_unhealthy) for name, message in zip(sorted(tracker.pending), messages)]


def _with_known(message: str, name: str, known_unhealthy: dict | None) -> str:
    known = (known_unhealthy or {}).get(name)
    return f"{message}; GPU health check: {known}" if known else message


def _diagnose_timeout(client, tracker: CapacityWait, namespace: str, daemonset: str | None = None) -> list:
    if not tracker.states:
        if tracker.fixed_targets is None:
            return ["no node matches the plugin's node_selector, affinity and tolerations, so none can report GPUs"]
        return ["none of the named nodes exists"]
    try:
        listing = client.request("GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": POD_SELECTOR})
    except KubeApiError as error:
        # Narrow RBAC (no list on pods) must not hide what the nodes themselves say.
        return [
            diagnose_without_pods(tracker.states[name], tracker.nodes.get(name), tracker.pod_spec, error)
            for name in sorted(tracker.pending)
        ]
    by_node = pods_by_node(listing.get("items") or [])
    mps_pods = _mps_pods(client, namespace, tracker.plan)
    create_failure = None
    if daemonset and any(not by_node.get(name) for name in tracker.pending):
        create_failure = _daemonset_create_failure(client, namespace, daemonset)
    messages = []
    logs_read = 0
    for name in sorted(tracker.pending):
        state = tracker.states[name]
        pods = by_node.get(name) or []
        pod = pods[0] if pods else None
        logs = None
        if needs_logs(state, pod) and logs_read < MAX_LOGS:
            logs = _pod_logs(client, namespace, pod)
            logs_read += 1
        message = diagnose(state, tracker.nodes.get(name), pod, tracker.pod_spec, logs)
        if pod is None and create_failure and state.get("node_ready"):
            message += f"; the DaemonSet cannot create its pods: {create_failure}"
        if mps_pods is not None and pod is not None and state.get("node_ready") and not state.get("capacity"):
            message = _mps_message(client, namespace, state, tracker.nodes.get(name), mps_pods, message)
        messages.append(message)
    return messages


def _mps_pods(client, namespace: str, plan: dict) -> dict | None:
    """The MPS control daemon's pods by node under an MPS config (one list); None otherwise or when unreadable."""
    if plan.get("sharing") != "mps":
        return None
    try:
        listing = client.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": MPS_POD_SELECTOR}
        )
    except (KubeApiError, KubeTransportError):
        return None
    return pods_by_node(listing.get("items") or [])


def _mps_message(client, namespace: str, state: dict, node: dict | None, mps_pods: dict, message: str) -> str:
    """Under MPS, a node without capacity is most often one whose MPS control daemon does not run: say so first."""
    daemon = (mps_pods.get(state["name"]) or [None])[0]
    problem = mps_daemon_problem(node or {}, daemon)
    if problem is None:
        return message
    text = f"{state['name']}: node reports no {state['resource']}: {problem}"
    kind, _text = pod_problem(daemon) if daemon is not None else (None, "")
    if kind in ("crash_loop", "terminated"):
        tail = log_tail(_pod_logs(client, namespace, daemon, MPS_CONTAINER_NAME))
        if tail:
            text += "; last log lines of the daemon: " + " | ".join(tail)
    return text


def diagnose_without_pods(state: dict, node: dict | None, pod_spec: dict, error: KubeApiError) -> str:
    """What the node alone tells, when the plugin's pods cannot be read."""
    if node is None or not state.get("node_ready"):
        return diagnose(state, node, None, pod_spec)
    return (
        f"{state['name']}: reports {state['capacity']} {state['resource']}, allocatable {state['allocatable']}"
        f"{'' if state['expected'] is None else ', expected ' + str(state['expected'])}; the plugin's pods could not"
        f" be read to say why ({error.status} {error.api_reason or error.reason}: allow list on pods for a diagnosis)"
    )
