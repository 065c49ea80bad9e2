"""Pods that no DaemonSet owns: a small default scheduler, the kubelet that runs them, and node reboots.

The scheduler binds a pending pod to the first node (by name) that is schedulable, Ready, matches the pod's node
selector and required node affinity, whose taints the pod tolerates, and whose ``allocatable`` still holds every
extended resource (``nvidia.com/gpu``, ...) the pod requests once the pods already bound there are counted (init
containers and sidecars counted as the real scheduler counts them). Pending pods are taken in priority order
(``spec.priority``, which admission.py sets from the pod's PriorityClass). A pod that fits nowhere stays Pending with
``PodScheduled=False`` (reason ``Unschedulable``) and a ``FailedScheduling`` event worded like the real scheduler's
("0/2 nodes are available: 1 Insufficient nvidia.com/gpu, ..."); it is retried whenever a pod or node changes, as the
real scheduler's queue does. Short of an extended resource, a pod whose ``preemptionPolicy`` is not ``Never``
preempts: on the first node where deleting lower-priority pods makes room, those pods are deleted (a ``Preempted``
event each) and the pod is nominated there (``status.nominatedNodeName``), as kube-scheduler's default preemption does.

The kubelet starts a bound pod once its node is Ready. ``restartPolicy: Always`` pods keep running; ``Never`` and
``OnFailure`` pods run to completion after ``run_seconds`` (a ``sleep N`` command: after N seconds). A pod with
``activeDeadlineSeconds`` fails (``DeadlineExceeded``) that long after it started. Nothing is executed: a container
whose command mentions ``nvidia-smi`` prints one ``GPU i: PRODUCT (UUID: GPU-...)`` line per GPU allocated to the
pod, as ``nvidia-smi -L`` does, and fails (exit 6, "No devices were found") when the pod has none; any other container
prints nothing and exits 0. Stand-in only: there is no container runtime behind it.

A node reboot (``reboot_node``) makes the node NotReady (the kubelet stops posting status) with a new
``nodeInfo.bootID``, and Ready again after ``down_seconds``, when its device plugin re-registers its GPUs.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import re
import threading
import uuid
from typing import TYPE_CHECKING, Any

from .api import now
from .errors import ApiError
from .eviction import refresh_budgets
from .resources import BY_PLURAL
from .selectors import _expression, tolerates
from .store import Event

if TYPE_CHECKING:
    from .sim import Simulation

_PODS = BY_PLURAL["pods"]
_NODES = BY_PLURAL["nodes"]
_SCHEDULER = "default-scheduler"
_KUBELET = "kubelet"
DEFAULT_GPU_PRODUCT = "NVIDIA A100-SXM4-80GB"
PRODUCT_ANNOTATION = "kubesim.io/gpu-product"


def _owned_by_daemonset(pod: dict[str, Any]) -> bool:
    return any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or [])


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _container_requests(container: dict[str, Any]) -> collections.Counter[str]:
    resources = container.get("resources") or {}
    # An extended resource's request defaults to its limit.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return collections.Counter({n: int(v) for n, v in merged.items() if "/" in n and str(v).isdigit()})


def extended_requests(pod: dict[str, Any]) -> dict[str, int]:
    """Extended resources (names with a domain, such as nvidia.com/gpu) the pod holds on its node, as the scheduler
    counts them: the app containers' sum, or an init container's request when that is larger; sidecars (init
    containers with ``restartPolicy: Always``) run beside what starts after them. Limits stand for requests."""
    spec = pod.get("spec") or {}
    wanted: collections.Counter[str] = collections.Counter()
    for container in spec.get("containers") or []:
        wanted.update(_container_requests(container))
    sidecars: collections.Counter[str] = collections.Counter()
    peak: collections.Counter[str] = collections.Counter()
    for container in spec.get("initContainers") or []:
        own = _container_requests(container)
        if container.get("restartPolicy") == "Always":
            sidecars.update(own)
            during = sidecars
        else:
            during = sidecars + own
        for name, count in during.items():
            peak[name] = max(peak[name], count)
    wanted.update(sidecars)
    for name, count in peak.items():
        wanted[name] = max(wanted[name], count)
    return {name: count for name, count in wanted.items() if count}


def _priority(pod: dict[str, Any]) -> int:
    """spec.priority, set from the pod's PriorityClass on admission (admission.py)."""
    return int((pod.get("spec") or {}).get("priority") or 0)


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _placement_problem(pod: dict[str, Any], node: dict[str, Any]) -> str:
    """Why the pod cannot go to the node apart from resources, in the scheduler's words; empty when it can."""
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if (node.get("spec") or {}).get("unschedulable"):
        tolerated = tolerates(
            spec.get("tolerations") or [], {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
        )
        if not tolerated:
            return "node(s) were unschedulable"
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return "node(s) didn't match Pod's node affinity/selector"
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required:
        fields = {"metadata.name": node["metadata"]["name"]}
        if not any(
            all(_expression(labels, e) for e in term.get("matchExpressions") or [])
            and all(_expression(fields, e) for e in term.get("matchFields") or [])
            for term in required.get("nodeSelectorTerms") or []
        ):
            return "node(s) didn't match Pod's node affinity/selector"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(spec.get("tolerations") or [], taint):
            value = f": {taint['value']}" if taint.get("value") else ""
            return f"node(s) had untolerated taint {{{taint.get('key')}{value}}}"
    return ""


def unschedulable_message(reasons: dict[str, int], total: int) -> str:
    """The scheduler's FailedScheduling message for a pod that fits none of ``total`` nodes."""
    parts = ", ".join(f"{count} {reason}" for reason, count in sorted(reasons.items()))
    resource_nodes = sum(count for reason, count in reasons.items() if reason.startswith("Insufficient"))
    preemption = []
    if resource_nodes:
        preemption.append(f"{resource_nodes} No preemption victims found for incoming pod")
    if total - resource_nodes:
        preemption.append(f"{total - resource_nodes} Preemption is not helpful for scheduling")
    return (
        f"0/{total} nodes are available: {parts}. preemption: 0/{total} nodes are available: {', '.join(preemption)}."
    )


def _run_time(containers: list[dict[str, Any]], default: float) -> float:
    """How long a run-to-completion pod runs: ``sleep N`` (the command, or ``sh -c 'sleep N'``) for N seconds, any
    other command for ``default``."""
    longest = 0.0
    for container in containers:
        words = " ".join(str(w) for w in (container.get("command") or []) + (container.get("args") or []))
        match = re.search(r"(?:^|[\s;&|])sleep\s+([0-9]+(?:\.[0-9]+)?)", words)
        if match:
            longest = max(longest, float(match.group(1)))
    return longest or default


class Workloads:
    """The scheduler and kubelet for pods without a DaemonSet; runs on the simulation's controller thread."""

    def __init__(self, sim: Simulation, run_seconds: float = 0.3) -> None:
        self.sim = sim
        self.api = sim.api
        self.store = sim.store
        self.run_seconds = run_seconds
        self.keys: set[tuple[str, str]] = set()
        self._launched: set[str] = set()  # pod UIDs the kubelet has started
        self._reported: dict[str, str] = {}  # pod UID -> the FailedScheduling message last reported
        self._gpu_ids: dict[str, tuple[str, list[int]]] = {}  # pod UID -> (node, GPU indexes)
        self._budget_namespaces: set[str] = set()
        # Every preemption the scheduler made: {"preemptor": ns/name, "node": ..., "victims": [ns/name, ...]}.
        self.preemptions: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.store.add_listener(self._on_event)

    # ----- events -----------------------------------------------------------------------------------------------

    def _on_event(self, event: Event) -> None:
        """Store listener (in the writer's thread, under the store lock): note the pod, queue one pass."""
        obj = event.entry.obj
        meta = obj["metadata"]
        if event.plural == "pods":
            if _owned_by_daemonset(obj):
                return
            key = (meta.get("namespace", ""), meta["name"])
            with self._lock:
                if event.type == "DELETED":
                    self.keys.discard(key)
                else:
                    self.keys.add(key)
        elif event.plural == "poddisruptionbudgets":
            with self._lock:
                self._budget_namespaces.add(meta.get("namespace", ""))
        elif event.plural != "nodes" or not self.keys:
            return
        self.sim.schedule(0, self._reconcile, dedupe=("workloads",))

    # ----- one pass ---------------------------------------------------------------------------------------------

    def _reconcile(self) -> None:
        with self._lock:
            keys = sorted(self.keys)
            budget_namespaces = set(self._budget_namespaces)
        pods = [e.obj for e in (self.store.get("pods", ns, name) for ns, name in keys) if e is not None]
        live_uids = {p["metadata"].get("uid") for p in pods if not _terminal(p)}
        for uid in [u for u in self._gpu_ids if u not in live_uids]:
            del self._gpu_ids[uid]
        nodes_list, _rv = self.store.list("nodes")
        nodes = {e.obj["metadata"]["name"]: e.obj for e in sorted(nodes_list, key=lambda e: e.obj["metadata"]["name"])}
        used: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and not _terminal(pod):
                used[node].update(extended_requests(pod))
        waiting = [
            p
            for p in pods
            if not (p.get("spec") or {}).get("nodeName")
            and (p.get("status") or {}).get("phase", "Pending") == "Pending"
            and (p.get("spec") or {}).get("schedulerName", _SCHEDULER) == _SCHEDULER
        ]
        # The scheduling queue: higher priority first, then the older pod.
        waiting.sort(key=lambda p: (-_priority(p), p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]))
        for pod in waiting:
            self._schedule(pod, nodes, used, pods)
        for pod in pods:
            self._maybe_start(pod, nodes)
        for namespace in budget_namespaces:
            refresh_budgets(self.api, namespace)

    def _schedule(
        self,
        pod: dict[str, Any],
        nodes: dict[str, dict[str, Any]],
        used: dict[str, collections.Counter[str]],
        pods: list[dict[str, Any]],
    ) -> None:
        wanted = extended_requests(pod)
        reasons: collections.Counter[str] = collections.Counter()
        for name, node in nodes.items():
            problem = _placement_problem(pod, node)
            if not problem:
                allocatable = (node.get("status") or {}).get("allocatable") or {}
                short = [r for r, n in sorted(wanted.items()) if int(allocatable.get(r, "0") or 0) - used[name][r] < n]
                if short:
                    problem = f"Insufficient {short[0]}"
            if problem:
                reasons[problem] += 1
                continue
            used[name].update(wanted)
            self._bind(pod, name)
            return
        if any(r.startswith("Insufficient") for r in reasons) and self._preempt(pod, nodes, used, pods):
            return
        message = unschedulable_message(dict(reasons), len(nodes))
        uid = pod["metadata"].get("uid", "")
        if self._reported.get(uid) == message:
            return
        self._reported[uid] = message
        stamp = now()

        def unschedulable(live: dict[str, Any]) -> None:
            status = live.setdefault("status", {})
            status["phase"] = "Pending"
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                    "lastProbeTime": None,
                    "lastTransitionTime": stamp,
                }
            ]

        live = self.api.mutate(_PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], unschedulable, _SCHEDULER)
        if live is not None:
            self.sim._event(live, "FailedScheduling", message, "Warning", _SCHEDULER)

    def _preempt(
        self,
        pod: dict[str, Any],
        nodes: dict[str, dict[str, Any]],
        used: dict[str, collections.Counter[str]],
        pods: list[dict[str, Any]],
    ) -> bool:
        """The scheduler's preemption: on the first node where evicting lower-priority pods makes room, delete them
        (lowest priority, then newest, first) and nominate the node; the pod binds on a later pass. A pod whose
        preemptionPolicy is Never preempts nothing. True when victims were chosen."""
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            return False
        mine = _priority(pod)
        wanted = extended_requests(pod)
        for name, node in nodes.items():
            if _placement_problem(pod, node) or not _ready(node):
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            # Victims: lower priority first, and among equals the newest (kube-scheduler reprieves the more important
            # pods: higher priority, then the longer running).
            candidates = sorted(
                (
                    p
                    for p in pods
                    if (p.get("spec") or {}).get("nodeName") == name and not _terminal(p) and _priority(p) < mine
                ),
                key=lambda p: p["metadata"].get("creationTimestamp", ""),
                reverse=True,
            )
            candidates.sort(key=_priority)
            free = collections.Counter({r: int(allocatable.get(r, "0") or 0) - used[name][r] for r in wanted})
            victims = []
            for victim in candidates:
                if all(free[r] >= n for r, n in wanted.items()):
                    break
                victims.append(victim)
                free.update(extended_requests(victim))
            if not victims or not all(free[r] >= n for r, n in wanted.items()):
                continue
            preemptor = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            for victim in victims:
                self.sim._event(
                    victim,
                    "Preempted",
                    f"Preempted by pod {pod['metadata'].get('uid', '')} on node {name}",
                    "Normal",
                    _SCHEDULER,
                )
                with contextlib.suppress(ApiError):
                    self.api.delete(_PODS, victim["metadata"]["namespace"], victim["metadata"]["name"])
                used[name].subtract(extended_requests(victim))
            self.api.mutate(
                _PODS,
                pod["metadata"]["namespace"],
                pod["metadata"]["name"],
                lambda live, node=name: live.setdefault("status", {}).update(nominatedNodeName=node),
                _SCHEDULER,
                subresource="status",
            )
            self.preemptions.append(
                {
                    "preemptor": preemptor,
                    "node": name,
                    "victims": [f"{v['metadata']['namespace']}/{v['metadata']['name']}" for v in victims],
                }
            )
            self.sim.schedule(0, self._reconcile, dedupe=("workloads",))
            return True
        return False

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        stamp = now()

        def bind(live: dict[str, Any]) -> None:
            live.setdefault("spec", {})["nodeName"] = node
            status = live.setdefault("status", {})
            status["phase"] = "Pending"
            status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp}]

        live = self.api.mutate(_PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], bind, _SCHEDULER)
        self._reported.pop(pod["metadata"].get("uid", ""), None)
        if live is not None:
            self.sim._event(
                live,
                "Scheduled",
                f"Successfully assigned {pod['metadata']['namespace']}/{pod['metadata']['name']} to {node}",
                "Normal",
                _SCHEDULER,
            )

    # ----- the kubelet ------------------------------------------------------------------------------------------

    def _maybe_start(self, pod: dict[str, Any], nodes: dict[str, dict[str, Any]]) -> None:
        uid = pod["metadata"].get("uid", "")
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or uid in self._launched or (pod.get("status") or {}).get("phase", "Pending") != "Pending":
            return
        if node not in nodes or not _ready(nodes[node]):
            return
        self._launched.add(uid)
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        self.sim.schedule(self.sim.pod_start_delay, lambda: self._run(key, uid))

    def _live(self, key: tuple[str, str], uid: str) -> dict[str, Any] | None:
        entry = self.store.get("pods", *key)
        if entry is None or entry.obj["metadata"].get("uid") != uid:
            return None
        return entry.obj

    def _allocate(self, pod: dict[str, Any], uid: str) -> list[int]:
        node = pod["spec"]["nodeName"]
        count = extended_requests(pod).get("nvidia.com/gpu", 0)
        taken = {i for other, (n, ids) in self._gpu_ids.items() if n == node and other != uid for i in ids}
        ids = [i for i in range(count + len(taken)) if i not in taken][:count]
        self._gpu_ids[uid] = (node, ids)
        return ids

    def _run(self, key: tuple[str, str], uid: str) -> None:
        from .sim import _running_status

        pod = self._live(key, uid)
        if pod is None:
            return
        gpus = self._allocate(pod, uid)
        containers = pod["spec"].get("containers") or [{}]
        started = now()
        self.api.mutate(
            _PODS,
            *key,
            lambda live: live.update(status=_running_status(live, containers, started)),
            _KUBELET,
            subresource="status",
        )
        self.sim._event(pod, "Started", f"Started container {containers[0].get('name', '')}", "Normal", _KUBELET)
        if pod["spec"].get("restartPolicy", "Always") in ("Never", "OnFailure"):
            self.sim.schedule(_run_time(containers, self.run_seconds), lambda: self._finish(key, uid, gpus, started))
        deadline = pod["spec"].get("activeDeadlineSeconds")
        if isinstance(deadline, int) and deadline > 0:
            self.sim.schedule(deadline, lambda: self._deadline_exceeded(key, uid, deadline))

    def _deadline_exceeded(self, key: tuple[str, str], uid: str, deadline: int) -> None:
        """activeDeadlineSeconds passed: the kubelet kills the pod, which ends Failed (DeadlineExceeded)."""
        pod = self._live(key, uid)
        if pod is None or _terminal(pod):
            return

        def fail(live: dict[str, Any]) -> None:
            status = live.setdefault("status", {})
            status.update(
                phase="Failed",
                reason="DeadlineExceeded",
                message=f"Pod was active on the node longer than the specified deadline ({deadline}s)",
            )

        self.api.mutate(_PODS, *key, fail, _KUBELET, subresource="status")
        self.sim._event(
            pod, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline", "Normal", _KUBELET
        )
        self._gpu_ids.pop(uid, None)

    def _finish(self, key: tuple[str, str], uid: str, gpus: list[int], started: str) -> None:
        pod = self._live(key, uid)
        if pod is None or _terminal(pod):
            return
        node = self.store.get("nodes", None, pod["spec"]["nodeName"])
        annotations = (node.obj["metadata"].get("annotations") or {}) if node else {}
        product = annotations.get(PRODUCT_ANNOTATION, DEFAULT_GPU_PRODUCT)
        containers = pod["spec"].get("containers") or [{}]
        logs: list[str] = []
        exit_code = 0
        for container in containers:
            words = " ".join(str(w) for w in (container.get("command") or []) + (container.get("args") or []))
            if "nvidia-smi" not in words:
                continue
            if not gpus:
                logs.append("No devices were found")
                exit_code = 6
                continue
            for index in gpus:
                digest = hashlib.sha1(f"{pod['spec']['nodeName']}/{index}".encode()).hexdigest()
                gpu_uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
                logs.append(f"GPU {index}: {product} (UUID: {gpu_uuid})")
        self.sim.workload_logs[key] = logs
        finished = now()
        reason = "Completed" if exit_code == 0 else "Error"

        def complete(live: dict[str, Any]) -> None:
            status = live.setdefault("status", {})
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            status["conditions"] = [
                {
                    "type": kind,
                    "status": "False" if kind in ("Ready", "ContainersReady") else "True",
                    "lastTransitionTime": finished,
                    **({"reason": "PodCompleted"} if kind in ("Ready", "ContainersReady") else {}),
                }
                for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
            ]
            status["containerStatuses"] = [
                {
                    "name": c.get("name", ""),
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason,
                            "startedAt": started,
                            "finishedAt": finished,
                        }
                    },
                    "lastState": {},
                }
                for c in containers
            ]

        self.api.mutate(_PODS, *key, complete, _KUBELET, subresource="status")
        self._gpu_ids.pop(uid, None)

    # ----- node reboots -----------------------------------------------------------------------------------------

    def reboot_node(self, name: str, down_seconds: float = 2.0) -> str:
        """The node's machine rebooted: NotReady now with a new boot ID, Ready again after ``down_seconds``."""
        if name not in self.sim.nodes:
            raise KeyError(f"no simulated node {name!r}")
        boot_id = str(uuid.uuid4())
        self.api.mutate(
            _NODES,
            None,
            name,
            lambda node: node["status"].setdefault("nodeInfo", {}).update(bootID=boot_id),
            _KUBELET,
            subresource="status",
        )
        self.sim.set_fault(name, "not_ready")
        self.sim.schedule(down_seconds, lambda: self.sim.clear_fault(name, "not_ready"))
        return boot_id
