"""The simulated cluster behind the API: nodes with GPUs, the DaemonSet controller, and a kubelet per node that runs
the NVIDIA device plugin's pods and reports ``nvidia.com/gpu`` capacity, with injectable faults.

Everything that changes state runs on one controller thread, fed by a timed work queue; the store's listener only
queues work. That keeps the simulation free of races with API writes and keeps each step's cost bounded: a
DaemonSet change costs O(nodes), a node change O(DaemonSets), a pod transition O(1).
"""

from __future__ import annotations

import datetime
import heapq
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from .api import Api, now
from .errors import ApiError
from .resources import BY_PLURAL
from .selectors import DAEMONSET_TOLERATIONS, pod_fits_node
from .store import Event, clone

FAULTS = ("nvml", "no_devices", "unhealthy", "never_reports", "not_ready", "image_pull", "crash_loop")
# MPS: the node's MPS control daemon pod crash-loops (its log says why); the plugin there never gets its daemon.
FAULTS += ("mps_daemon_fails",)
CAPACITY_ANNOTATION = "kubesim.io/capacity-reported-at"
_CONTROLLER = "kube-controller-manager"
_KUBELET = "kubelet"
_PODS = BY_PLURAL["pods"]
_NODES = BY_PLURAL["nodes"]
_DAEMONSETS = BY_PLURAL["daemonsets"]
_EVENTS = BY_PLURAL["events"]


@dataclass
class SimNode:
    """A node of the simulated cluster.

    ``faults``: a fault name, a list of names, or a map of name to parameters (``{"unhealthy": {"devices": 2}}``).
    ``mig_devices``: MIG devices by profile (``{"1g.10gb": 14}``), advertised under the mixed and single strategies.
    ``capacity_delay``: overrides the cluster's delay between the plugin pod running and capacity appearing.
    """

    name: str
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Any] = field(default_factory=list)
    ready: bool = True
    faults: Any = None
    capacity_delay: float | None = None
    mig_devices: dict[str, int] | None = None
    kubelet_version: str = "v1.33.5"


def normalise_faults(spec: Any) -> dict[str, dict[str, Any]]:
    if not spec:
        return {}
    if isinstance(spec, str):
        spec = [spec]
    items = spec.items() if isinstance(spec, dict) else ((name, {}) for name in spec)
    out: dict[str, dict[str, Any]] = {}
    for name, params in items:
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
        out[name] = dict(params or {})
    return out


def parse_taint(taint: Any) -> dict[str, str]:
    """A taint from a dict or from kubectl's ``key[=value]:Effect`` notation."""
    if isinstance(taint, dict):
        return {k: str(v) for k, v in taint.items() if v is not None}
    text = str(taint)
    key_value, _sep, effect = text.rpartition(":")
    if not key_value:
        raise ValueError(f"taint {text!r} needs an effect, as in key=value:NoSchedule")
    key, _sep, value = key_value.partition("=")
    out = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    return out


def node_object(node: SimNode, index: int, not_ready: bool) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        **node.labels,
    }
    base = {"cpu": "64", "memory": "527957484Ki", "pods": "110", "ephemeral-storage": "1919781752Ki"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": labels, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": [parse_taint(t) for t in node.taints]} if node.taints else {},
        "status": {
            "capacity": dict(base),
            "allocatable": dict(base),
            "conditions": _conditions(not_ready),
            "addresses": [
                {"type": "InternalIP", "address": f"10.{index // 65536 % 256}.{index // 256 % 256}.{index % 256}"},
                {"type": "Hostname", "address": node.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12 (bookworm)",
                "kernelVersion": "6.1.0-28-amd64",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kubeletVersion": node.kubelet_version,
                "kubeProxyVersion": node.kubelet_version,
                "machineID": f"{index:032x}",
                "systemUUID": f"{index:08x}-0000-0000-0000-000000000000",
                "bootID": f"{index:08x}-1111-1111-1111-111111111111",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        },
    }


def _conditions(not_ready: bool) -> list[dict[str, str]]:
    stamp = now()
    conditions = [
        {"type": kind, "status": "False", "reason": f"KubeletHas{reason}", "message": message}
        for kind, reason, message in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ]
    if not_ready:
        ready = {
            "type": "Ready",
            "status": "Unknown",
            "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.",
        }
    else:
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
        }
    conditions.append(ready)
    for condition in conditions:
        condition["lastHeartbeatTime"] = stamp
        condition["lastTransitionTime"] = stamp
    return conditions


_UNREACHABLE_TAINTS = (
    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
)


def _klog(level: str, source: str, message: str) -> str:
    stamp = datetime.datetime.now(datetime.UTC)
    return f"{level}{stamp:%m%d %H:%M:%S.%f}       1 {source}] {message}"


@dataclass
class PluginConfig:
    resources: dict[str, int]  # advertised resource -> count per physical device unit
    fail_on_init_error: bool = True
    error: str = ""
    missing_config_map: str = ""
    text: str = ""
    mps: bool = False  # sharing.mps: the plugin serves only once the node's MPS control daemon runs


@dataclass
class PodState:
    namespace: str
    name: str
    uid: str
    ds_key: tuple[str, str]
    node: str
    generation: int
    container: str
    ready: bool = False
    started: bool = False
    epoch: int = 0  # bumped on every restart, so timers of an earlier run do nothing
    log: list[str] = field(default_factory=list)
    previous_log: list[str] = field(default_factory=list)
    restarts: int = 0
    resources: list[str] = field(default_factory=list)  # GPU resources this pod put on its node
    mps_daemon: bool = False  # a pod of NVIDIA's MPS control daemon (command mps-control-daemon), not a plugin
    waiting_for_mps: bool = False  # a plugin pod whose MPS daemon is not running yet


class Simulation:
    def __init__(
        self,
        api: Api,
        capacity_delay: float,
        capacity_spread: float,
        pod_start_delay: float = 0.05,
        crash_backoff: float = 0.5,
    ) -> None:
        self.api = api
        self.store = api.store
        self.capacity_delay = capacity_delay
        self.capacity_spread = capacity_spread
        self.pod_start_delay = pod_start_delay
        self.crash_backoff = crash_backoff
        self.nodes: dict[str, SimNode] = {}
        self.node_order: dict[str, int] = {}
        self.faults: dict[str, dict[str, dict[str, Any]]] = {}
        self.pods: dict[tuple[str, str], PodState] = {}
        self.ds_pods: dict[tuple[str, str], dict[str, PodState]] = {}
        self.ds_desired: dict[tuple[str, str], set[str]] = {}
        self.capacity_times: dict[str, float] = {}
        # Logs of pods no DaemonSet owns, written by workloads.Workloads when they finish.
        self.workload_logs: dict[tuple[str, str], list[str]] = {}
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._pending: set[tuple[str, ...]] = set()
        self._dirty_ds: set[tuple[str, str]] = set()
        self._stopping = False
        self._busy = 0
        self._thread = threading.Thread(target=self._run, name="kubesim-controller", daemon=True)
        self.store.add_listener(self._on_event)

    # ----- the work queue ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def schedule(self, delay: float, work: Callable[[], None], dedupe: tuple[str, ...] | None = None) -> None:
        with self._cond:
            if dedupe is not None:
                if dedupe in self._pending:
                    return
                self._pending.add(dedupe)
                inner = work

                def work() -> None:
                    with self._cond:
                        self._pending.discard(dedupe)
                    inner()

            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), work))
            self._cond.notify()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until no work is due now (scheduled future work, such as capacity timers, may remain)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while time.monotonic() < deadline:
                due = self._heap and self._heap[0][0] <= time.monotonic()
                if not due and not self._busy:
                    return True
                self._cond.wait(0.01)
        return False

    def _run(self) -> None:
        next_flush = time.monotonic()
        while True:
            with self._cond:
                if self._stopping:
                    return
                wait = min(next_flush, self._heap[0][0] if self._heap else next_flush + 1) - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                work = heapq.heappop(self._heap)[2] if self._heap and self._heap[0][0] <= time.monotonic() else None
                self._busy += 1
            try:
                if work is not None:
                    work()
                if time.monotonic() >= next_flush:
                    # DaemonSet status is written in batches, as the real controller does, so thousands of pod
                    # transitions cost a few status writes rather than one per pod.
                    self._flush_ds_status()
                    next_flush = time.monotonic() + 0.05
            except ApiError:
                pass  # the object went away under us: the next event reconciles
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _on_event(self, event: Event) -> None:
        """Store listener (runs in the writer's thread, under the store lock): only queue work."""
        if threading.current_thread() is self._thread:
            return
        meta = event.entry.obj["metadata"]
        if event.plural == "daemonsets":
            key = (meta["namespace"], meta["name"])
            if event.type == "DELETED":
                self.schedule(0, lambda: self._collect_ds(key, meta.get("uid", "")))
            elif event.old is None or event.old.obj["metadata"].get("generation") != meta.get("generation"):
                self.schedule(0, lambda: self._reconcile_ds(key), dedupe=("ds", *key))
        elif event.plural == "nodes":
            name = meta["name"]
            if event.type == "DELETED":
                self.schedule(0, lambda: self._node_gone(name))
            elif event.old is None or _placement(event.old.obj) != _placement(event.entry.obj):
                self.schedule(0, lambda: self._reconcile_node(name), dedupe=("node", name))
        elif event.plural == "pods" and event.type == "DELETED":
            state = self.pods.get((meta["namespace"], meta["name"]))
            if state is not None and state.uid == meta.get("uid"):
                self.schedule(0, lambda: self._pod_gone(state, recreate=True))
        elif event.plural == "runtimeclasses" and event.type in ("ADDED", "DELETED"):
            for ds_key in list(self.ds_desired):
                self.schedule(0, lambda k=ds_key: self._reconcile_ds(k), dedupe=("ds", *ds_key))

    # ----- nodes and faults -------------------------------------------------------------------------------------

    def add_node(self, node: SimNode) -> None:
        with self.store.lock:
            if node.name in self.nodes:
                raise ValueError(f"node {node.name} already exists")
            self.nodes[node.name] = node
            self.node_order[node.name] = len(self.node_order)
            faults = normalise_faults(node.faults)
            if not node.ready:
                faults.setdefault("not_ready", {})
            if faults:
                self.faults[node.name] = faults
            body = node_object(node, self.node_order[node.name], "not_ready" in self.effective_faults(node.name))
            if "not_ready" in self.effective_faults(node.name):
                body["spec"]["taints"] = body["spec"].get("taints", []) + [dict(t) for t in _UNREACHABLE_TAINTS]
            self.api.create(_NODES, None, body, _KUBELET, keep_status=True)

    def effective_faults(self, node: str) -> dict[str, dict[str, Any]]:
        return {**self.faults.get("*", {}), **self.faults.get(node, {})}

    def set_fault(self, node: str | None, fault: str, **params: Any) -> None:
        target = node or "*"
        if target != "*" and target not in self.nodes:
            raise KeyError(f"no simulated node {target!r}")
        with self.store.lock:
            self.faults.setdefault(target, {}).update(normalise_faults({fault: params}))
        self._faults_changed(target)

    def clear_fault(self, node: str | None, fault: str | None = None) -> None:
        target = node or "*"
        with self.store.lock:
            if fault is None:
                self.faults.pop(target, None)
            else:
                self.faults.get(target, {}).pop(fault, None)
        self._faults_changed(target)

    def _faults_changed(self, target: str) -> None:
        names = list(self.nodes) if target == "*" else [target]
        for name in names:
            self.schedule(0, lambda n=name: self._restart_node(n))

    def _restart_node(self, name: str) -> None:
        """A node's faults changed: set its readiness, then restart the plugin pods on it under the new faults."""
        not_ready = "not_ready" in self.effective_faults(name)

        def readiness(node: dict[str, Any]) -> None:
            node["status"]["conditions"] = _conditions(not_ready)
            taints = [t for t in node["spec"].get("taints", []) if t.get("key") != "node.kubernetes.io/unreachable"]
            if not_ready:
                taints += [dict(t) for t in _UNREACHABLE_TAINTS]
            if taints:
                node["spec"]["taints"] = taints
            else:
                node["spec"].pop("taints", None)

        self.api.mutate(_NODES, None, name, readiness, "node-controller")
        # The unreachable NoSchedule taint keeps new DaemonSet pods off the node (they tolerate only NoExecute).
        self._reconcile_node(name)
        if not_ready:
            return  # a dead kubelet changes nothing on the pods it already has
        for pods in self.ds_pods.values():
            state = pods.get(name)
            if state is not None:
                self._withdraw_capacity(state)
                state.started = state.ready = False
                state.epoch += 1
                state.previous_log, state.log = state.log, []
                self.schedule(self.pod_start_delay, lambda s=state: self._start_pod(s))

    def _node_gone(self, name: str) -> None:
        self.nodes.pop(name, None)
        for ds_key, pods in self.ds_pods.items():
            state = pods.pop(name, None)
            self.ds_desired.get(ds_key, set()).discard(name)
            if state is not None:
                self.pods.pop((state.namespace, state.name), None)
                self.store.remove(_PODS, state.namespace, state.name)
            self._dirty_ds.add(ds_key)

    # ----- the DaemonSet controller -----------------------------------------------------------------------------

    def _reconcile_ds(self, key: tuple[str, str], only_node: str | None = None) -> None:
        entry = self.store.get("daemonsets", key[0], key[1])
        if entry is None:
            return
        ds = entry.obj
        if only_node is None:
            nodes, _rv = self.store.list("nodes")
            desired: set[str] = set()
        else:
            node_entry = self.store.get("nodes", None, only_node)
            nodes = [node_entry] if node_entry else []
            desired = set(self.ds_desired.get(key, set()))
            desired.discard(only_node)
        pods = self.ds_pods.setdefault(key, {})
        spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        runtime_class = spec.get("runtimeClassName")
        missing_rc = bool(runtime_class) and self.store.get("runtimeclasses", None, runtime_class) is None
        generation = int(ds["metadata"].get("generation", 1))
        for count, node_entry in enumerate(nodes):
            if count % 64 == 63:
                time.sleep(0)  # let request threads have the interpreter: a long reconcile must not stall the API
            name = node_entry.obj["metadata"]["name"]
            fits, _reason = pod_fits_node(spec, node_entry.obj)
            state = pods.get(name)
            if state is not None and (not fits or state.generation != generation):
                self._delete_pod(state)
                state = None
            if fits:
                desired.add(name)
                if state is None and not missing_rc:
                    self._create_pod(ds, name, generation)
        for name in [n for n in pods if n not in desired and (only_node is None or n == only_node)]:
            self._delete_pod(pods[name])
        self.ds_desired[key] = desired
        if missing_rc and desired:
            # The RuntimeClass admission plugin refuses such pods, so the controller can create none.
            self._event(
                ds,
                "FailedCreate",
                f'Error creating: pods "{key[1]}-" is forbidden: pod rejected: RuntimeClass "{runtime_class}" '
                "not found",
                "Warning",
                "daemonset-controller",
            )
        self._dirty_ds.add(key)

    def _reconcile_node(self, name: str) -> None:
        for key in list(self.ds_desired):
            self._reconcile_ds(key, only_node=name)

    def _collect_ds(self, key: tuple[str, str], uid: str) -> None:
        """Garbage collection of a deleted DaemonSet's pods (background propagation)."""
        for state in list(self.ds_pods.pop(key, {}).values()):
            self._withdraw_capacity(state)
            self.pods.pop((state.namespace, state.name), None)
            live = self.store.get("pods", state.namespace, state.name)
            if live is not None and any(
                ref.get("uid") == uid for ref in live.obj["metadata"].get("ownerReferences") or []
            ):
                self.store.remove(_PODS, state.namespace, state.name)
        self.ds_desired.pop(key, None)

    def _create_pod(self, ds: dict[str, Any], node: str, generation: int) -> None:
        meta = ds["metadata"]
        template = clone((ds.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        spec["nodeName"] = node
        tolerations = list(spec.get("tolerations") or [])
        for extra in DAEMONSET_TOLERATIONS:
            if extra not in tolerations:
                tolerations.append(dict(extra))
        spec["tolerations"] = tolerations
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        labels = {
            **(tmeta.get("labels") or {}),
            "pod-template-generation": str(generation),
            "controller-revision-hash": f"{abs(hash(json.dumps(spec, sort_keys=True))) % 10**10:010d}",
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-",
                "namespace": meta["namespace"],
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}],
                "qosClass": "BestEffort",
            },
        }
        if tmeta.get("annotations"):
            body["metadata"]["annotations"] = tmeta["annotations"]
        created = self.api.create(_PODS, meta["namespace"], body, _CONTROLLER, keep_status=True)
        containers = spec.get("containers") or [{}]
        state = PodState(
            namespace=meta["namespace"],
            name=created["metadata"]["name"],
            uid=created["metadata"]["uid"],
            ds_key=(meta["namespace"], meta["name"]),
            node=node,
            generation=generation,
            container=containers[0].get("name", ""),
        )
        self.pods[(state.namespace, state.name)] = state
        self.ds_pods.setdefault(state.ds_key, {})[node] = state
        self.schedule(self.pod_start_delay, lambda: self._start_pod(state))

    def _delete_pod(self, state: PodState) -> None:
        self._pod_gone(state, recreate=False)
        self.store.remove(_PODS, state.namespace, state.name)

    def _pod_gone(self, state: PodState, recreate: bool) -> None:
        self._withdraw_capacity(state)
        self.pods.pop((state.namespace, state.name), None)
        pods = self.ds_pods.get(state.ds_key, {})
        if pods.get(state.node) is state:
            del pods[state.node]
        self._dirty_ds.add(state.ds_key)
        if recreate:
            self.schedule(0, lambda: self._reconcile_ds(state.ds_key), dedupe=("ds", *state.ds_key))

    def _flush_ds_status(self) -> None:
        dirty, self._dirty_ds = self._dirty_ds, set()
        for key in dirty:
            entry = self.store.get("daemonsets", key[0], key[1])
            if entry is None:
                continue
            generation = int(entry.obj["metadata"].get("generation", 1))
            desired = self.ds_desired.get(key, set())
            pods = self.ds_pods.get(key, {})
            scheduled = [p for n, p in pods.items() if n in desired]
            ready = sum(1 for p in scheduled if p.ready)
            status: dict[str, Any] = {
                "currentNumberScheduled": len(scheduled),
                "desiredNumberScheduled": len(desired),
                "numberMisscheduled": sum(1 for n in pods if n not in desired),
                "numberReady": ready,
                "numberAvailable": ready,
                "updatedNumberScheduled": sum(1 for p in scheduled if p.generation == generation),
                "observedGeneration": generation,
            }
            if len(desired) - ready > 0:
                status["numberUnavailable"] = len(desired) - ready
            if entry.obj.get("status") != status:
                self.api.mutate(
                    _DAEMONSETS,
                    key[0],
                    key[1],
                    lambda ds, s=status: ds.update(status=s),
                    _CONTROLLER,
                    subresource="status",
                )

    # ----- the kubelet and the device plugin --------------------------------------------------------------------

    def _live_pod(self, state: PodState) -> dict[str, Any] | None:
        entry = self.store.get("pods", state.namespace, state.name)
        if entry is None or entry.obj["metadata"].get("uid") != state.uid:
            return None
        return entry.obj

    def _set_pod_status(self, state: PodState, status: dict[str, Any]) -> None:
        self.api.mutate(
            _PODS, state.namespace, state.name, lambda pod: pod.update(status=status), _KUBELET, subresource="status"
        )
        self._dirty_ds.add(state.ds_key)

    def _start_pod(self, state: PodState) -> None:
        pod = self._live_pod(state)
        if pod is None or state.started or state.node not in self.nodes:
            return
        faults = self.effective_faults(state.node)
        if "not_ready" in faults:
            return  # the kubelet is down: the pod stays Pending until the fault clears
        ds_entry = self.store.get("daemonsets", *state.ds_key)
        containers = pod["spec"].get("containers") or [{}]
        # The device plugin and its MPS control daemon (NVIDIA's chart deploys them together) take the plugin's
        # faults and config; any other DaemonSet's pod just runs.
        plugin_side = is_device_plugin(pod) or _is_mps_daemon(containers)
        faults = pod_faults(faults, state.ds_key[1], plugin_side)
        if not plugin_side:
            self._start_other(state, pod, faults)
            return
        config = self.plugin_config(ds_entry.obj if ds_entry else {}, state.node)
        image = containers[0].get("image", "")
        state.started = True
        started_at = now()
        if config.missing_config_map:
            state.started = False  # the kubelet retries the mount; a later ConfigMap lets it start
            message = (
                f'MountVolume.SetUp failed for volume "{config.missing_config_map}" : configmap '
                f'"{config.missing_config_map}" not found'
            )
            self._event(pod, "FailedMount", message, "Warning", "kubelet")
            self._set_pod_status(state, _pending_status(pod, containers, "ContainerCreating", ""))
            self.schedule(1.0, lambda: self._start_pod(state))
            return
        if "image_pull" in faults:
            message = (
                f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack '
                f'image "{image}": failed to resolve reference "{image}": {image}: not found'
            )
            self._event(pod, "Failed", message, "Warning", "kubelet")
            self._set_pod_status(state, _pending_status(pod, containers, "ErrImagePull", message))
            backoff = f'Back-off pulling image "{image}"'
            self.schedule(
                0.3,
                lambda: (
                    self._live_pod(state)
                    and self._set_pod_status(state, _pending_status(pod, containers, "ImagePullBackOff", backoff))
                ),
            )
            return
        if _is_mps_daemon(containers):
            self._start_mps_daemon(state, pod, containers, faults, started_at)
            return
        state.log = self._plugin_log(state, config, faults)
        state.waiting_for_mps = config.mps and not self._mps_ready(state.node)
        if "crash_loop" in faults or config.error:
            state.previous_log = list(state.log)
            self._crash(state, started_at)
            return
        state.ready = True
        self._set_pod_status(state, _running_status(pod, containers, started_at))
        if self._reports_capacity(state.node, faults, config):
            index = self.node_order.get(state.node, 0)
            total = max(1, len(self.node_order) - 1)
            node = self.nodes[state.node]
            delay = node.capacity_delay if node.capacity_delay is not None else self.capacity_delay
            delay += self.capacity_spread * index / total if len(self.node_order) > 1 else 0.0
            epoch = state.epoch
            self.schedule(delay, lambda: self._report_capacity(state, config, epoch))

    def _start_other(self, state: PodState, pod: dict[str, Any], faults: dict[str, dict[str, Any]]) -> None:
        """A pod of a DaemonSet that is not a device plugin (the DCGM exporter, say): it runs and becomes Ready, and
        reports no capacity; the image_pull and crash_loop faults that name its DaemonSet reach it."""
        containers = pod["spec"].get("containers") or [{}]
        image = containers[0].get("image", "")
        state.started = True
        started_at = now()
        if "image_pull" in faults:
            message = (
                f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack '
                f'image "{image}": failed to resolve reference "{image}": {image}: not found'
            )
            self._event(pod, "Failed", message, "Warning", "kubelet")
            self._set_pod_status(state, _pending_status(pod, containers, "ImagePullBackOff", message))
            return
        state.log = [_klog("I", "main.go:100", f"Starting {containers[0].get('name', 'container')}")]
        if "crash_loop" in faults:
            state.previous_log = [*state.log, _klog("E", "main.go:120", "fatal error, exiting")]
            self._crash(state, started_at)
            return
        state.ready = True
        self._set_pod_status(state, _running_status(pod, containers, started_at))

    def _crash(self, state: PodState, started_at: str) -> None:
        pod = self._live_pod(state)
        if pod is None:
            return
        state.restarts += 1
        containers = pod["spec"].get("containers") or [{}]
        status = _running_status(pod, containers, started_at)
        status["conditions"] = [
            c if c["type"] not in ("Ready", "ContainersReady") else {**c, "status": "False"}
            for c in status["conditions"]
        ]
        first = status["containerStatuses"][0]
        first.update(
            ready=False,
            started=False,
            restartCount=state.restarts,
            state={
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {10 * 2 ** min(state.restarts - 1, 5)}s restarting failed "
                    f"container={first['name']} pod={state.name}_{state.namespace}({state.uid})",
                }
            },
            lastState={
                "terminated": {
                    "exitCode": 1,
                    "reason": "Error",
                    "startedAt": started_at,
                    "finishedAt": now(),
                    "containerID": first.get("containerID", ""),
                }
            },
        )
        self._set_pod_status(state, status)
        if state.restarts == 1:
            self._event(
                pod,
                "BackOff",
                f"Back-off restarting failed container {first['name']} in pod "
                f"{state.name}_{state.namespace}({state.uid})",
                "Warning",
                "kubelet",
            )
        epoch = state.epoch
        if state.restarts < 12:
            self.schedule(
                self.crash_backoff * 2 ** min(state.restarts - 1, 4),
                lambda: self._crash(state, now()) if state.epoch == epoch else None,
            )

    def _reports_capacity(self, node: str, faults: dict[str, dict[str, Any]], config: PluginConfig) -> bool:
        if any(f in faults for f in ("nvml", "no_devices", "never_reports")):
            return False
        if config.mps and not self._mps_ready(node):
            return False  # "error waiting for MPS daemon": the plugin retries every 30 s
        return bool(self._resources(node, config))

    # ----- NVIDIA's MPS control daemon (cmd/mps-control-daemon) ---------------------------------------------------

    def _mps_ready(self, node: str) -> bool:
        return any(p.mps_daemon and p.ready and p.node == node for p in self.pods.values())

    def _start_mps_daemon(
        self,
        state: PodState,
        pod: dict[str, Any],
        containers: list[dict[str, Any]],
        faults: dict[str, dict[str, Any]],
        started_at: str,
    ) -> None:
        state.mps_daemon = True
        state.log = [
            _klog("I", "main.go:80", '"NVIDIA MPS Control Daemon" version="v0.20.0"'),
            _klog("I", "main.go:122", "Starting OS watcher."),
            _klog("I", "main.go:136", "Starting Daemons."),
            _klog("I", "main.go:185", "Loading configuration."),
            _klog("I", "main.go:219", "Retrieving MPS daemons."),
        ]
        if "mps_daemon_fails" in faults or "nvml" in faults or self.nodes[state.node].gpus == 0:
            state.log.append(
                _klog(
                    "E",
                    "main.go:98",
                    "error starting plugins: error getting daemons: error creating resource "
                    "managers: failed to create NVML resource manager: nvml init failed: ERROR_LIBRARY_NOT_FOUND",
                )
            )
            state.previous_log = list(state.log)
            self._crash(state, started_at)
            return
        state.log += [
            _klog("I", "daemon.go:97", '"Staring MPS daemon" resource="nvidia.com/gpu"'),
            _klog("I", "daemon.go:139", '"Starting log tailer" resource="nvidia.com/gpu"'),
        ]
        state.ready = True
        self._set_pod_status(state, _running_status(pod, containers, started_at))
        # The plugins waiting on this node find the daemon at their next retry.
        for plugin in list(self.pods.values()):
            if plugin.node == state.node and plugin.waiting_for_mps and plugin.ready:
                self.schedule(self.pod_start_delay, lambda p=plugin: self._mps_found(p))

    def _mps_found(self, state: PodState) -> None:
        if not state.waiting_for_mps or self._live_pod(state) is None or not self._mps_ready(state.node):
            return
        state.waiting_for_mps = False
        ds_entry = self.store.get("daemonsets", *state.ds_key)
        config = self.plugin_config(ds_entry.obj if ds_entry else {}, state.node)
        state.log.append(_klog("I", "main.go:301", "Starting Plugins."))
        state.log.append(_klog("I", "mps.go:66", '"MPS daemon is healthy" resource="nvidia.com/gpu"'))
        node = self.nodes[state.node]
        delay = node.capacity_delay if node.capacity_delay is not None else self.capacity_delay
        epoch = state.epoch
        self.schedule(delay, lambda: self._report_capacity(state, config, epoch))

    def _resources(self, node_name: str, config: PluginConfig) -> dict[str, int]:
        node = self.nodes[node_name]
        out: dict[str, int] = {}
        for resource, per_unit in config.resources.items():
            if resource.startswith("mig:"):
                profile = resource[4:].split("=", 1)[0]
                name = resource.split("=", 1)[1]
                count = (node.mig_devices or {}).get(profile, 0) * per_unit
            elif resource.startswith("mig-single:"):
                name = resource.split(":", 1)[1]
                count = sum((node.mig_devices or {}).values()) * per_unit if node.mig_devices else node.gpus * per_unit
            else:
                name, count = resource, node.gpus * per_unit
            if count:
                out[name] = out.get(name, 0) + count
        return out

    def _report_capacity(self, state: PodState, config: PluginConfig, epoch: int) -> None:
        if self._live_pod(state) is None or not state.ready or state.epoch != epoch:
            return
        faults = self.effective_faults(state.node)
        if not self._reports_capacity(state.node, faults, config):
            return
        resources = self._resources(state.node, config)
        unhealthy = int(faults.get("unhealthy", {}).get("devices", 1)) if "unhealthy" in faults else 0
        reported = time.time()

        def report(node: dict[str, Any]) -> None:
            for name, count in resources.items():
                per_device = max(1, count // max(1, self.nodes[state.node].gpus))
                node["status"]["capacity"][name] = str(count)
                node["status"]["allocatable"][name] = str(max(0, count - unhealthy * per_device))
            node["metadata"].setdefault("annotations", {})[CAPACITY_ANNOTATION] = f"{reported:.6f}"

        self.api.mutate(_NODES, None, state.node, report, _KUBELET, subresource="status")
        state.resources = list(resources)
        self.capacity_times[state.node] = reported
        if unhealthy:
            state.log.append(
                _klog(
                    "I",
                    "health.go:159",
                    f"XidCriticalError: Xid={faults['unhealthy'].get('xid', 79)} on Device=GPU-{state.uid[:8]}-"
                    "0000-0000-0000-000000000000; marking device as unhealthy.",
                )
            )

    def _withdraw_capacity(self, state: PodState) -> None:
        """The plugin stopped: the kubelet keeps the resource in capacity but nothing is allocatable any more."""
        if not state.resources:
            return
        resources, state.resources = state.resources, []

        def withdraw(node: dict[str, Any]) -> None:
            for name in resources:
                if name in node["status"].get("allocatable", {}):
                    node["status"]["allocatable"][name] = "0"

        self.api.mutate(_NODES, None, state.node, withdraw, _KUBELET, subresource="status")

    def plugin_config(self, ds: dict[str, Any], node: str) -> PluginConfig:
        """What the device plugin would advertise, from its config file (the ConfigMap it mounts) and env."""
        spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        containers = spec.get("containers") or [{}]
        env = {e.get("name"): e.get("value") for e in containers[0].get("env") or [] if isinstance(e, dict)}
        args = " ".join(str(a) for a in (containers[0].get("args") or []) + (containers[0].get("command") or []))
        config_path = env.get("CONFIG_FILE") or ""
        if "--config-file=" in args:
            config_path = args.split("--config-file=", 1)[1].split()[0]
        text, missing = self._config_text(ds, spec, containers[0], config_path)
        if missing:
            return PluginConfig({}, missing_config_map=missing)
        try:
            config = yaml.safe_load(text) if text else {}
        except yaml.YAMLError as exc:
            return PluginConfig(
                {}, error=f"unable to load config: unable to parse config file: {exc}".replace("\n", " ")
            )
        if config is None:
            config = {}
        if not isinstance(config, dict):
            return PluginConfig({}, error="unable to load config: unable to parse config file: not a map")
        if text and config.get("version") != "v1":
            return PluginConfig({}, error=f"unable to load config: unknown version: {config.get('version')!r}")
        flags = config.get("flags") or {}
        mig = str(flags.get("migStrategy") or env.get("MIG_STRATEGY") or "none")
        fail_on_init = flags.get("failOnInitError", str(env.get("FAIL_ON_INIT_ERROR", "true")).lower() == "true")
        sharing = config.get("sharing") or {}
        shared = sharing.get("timeSlicing") or sharing.get("mps") or {}
        rename_default = bool(shared.get("renameByDefault"))
        replicas: dict[str, tuple[int, str]] = {}
        for item in shared.get("resources") or []:
            if isinstance(item, dict) and item.get("name"):
                rename = item.get("rename") or (f"{item['name']}.shared" if rename_default else item["name"])
                replicas[item["name"]] = (int(item.get("replicas", 1) or 1), rename)
        resources: dict[str, int] = {}
        node_mig = (self.nodes.get(node) or SimNode(node)).mig_devices
        if mig == "mixed" and node_mig:
            for profile in node_mig:
                base = f"nvidia.com/mig-{profile}"
                count, name = replicas.get(base, (1, base))
                resources[f"mig:{profile}={name}"] = count
        elif mig == "single" and node_mig:
            count, name = replicas.get("nvidia.com/gpu", (1, "nvidia.com/gpu"))
            resources[f"mig-single:{name}"] = count
        else:
            count, name = replicas.get("nvidia.com/gpu", (1, "nvidia.com/gpu"))
            resources[name] = count
        return PluginConfig(resources, fail_on_init_error=bool(fail_on_init), text=text, mps=bool(sharing.get("mps")))

    def _config_text(
        self, ds: dict[str, Any], spec: dict[str, Any], container: dict[str, Any], config_path: str
    ) -> tuple[str, str]:
        """(the config file's text, the name of a ConfigMap that is missing) for the plugin container."""
        volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict) and v.get("configMap")}
        if not volumes:
            return "", ""
        namespace = ds["metadata"]["namespace"]
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") in volumes]
        for volume in volumes.values():
            source = volume["configMap"]
            entry = self.store.get("configmaps", namespace, source.get("name", ""))
            if entry is None:
                if source.get("optional"):
                    continue
                return "", source.get("name", "")
            data = entry.obj.get("data") or {}
            mount = next((m for m in mounts if m.get("name") == volume.get("name")), None)
            if config_path and mount and config_path.startswith(mount.get("mountPath", "").rstrip("/") + "/"):
                relative = config_path[len(mount["mountPath"].rstrip("/")) + 1 :]
                for item in source.get("items") or []:
                    if item.get("path") == relative:
                        relative = item.get("key", relative)
                if relative in data:
                    return data[relative], ""
            elif data and not config_path:
                return next(iter(data.values())), ""
        return "", ""

    def _plugin_log(self, state: PodState, config: PluginConfig, faults: dict[str, dict[str, Any]]) -> list[str]:
        lines = [
            _klog("I", "main.go:235", '"Starting NVIDIA Device Plugin" version="v0.20.0"'),
            _klog("I", "main.go:238", "Starting FS watcher for /var/lib/kubelet/device-plugins"),
            _klog("I", "main.go:245", "Starting OS watcher."),
            _klog("I", "main.go:260", "Starting Plugins."),
            _klog("I", "main.go:317", "Loading configuration."),
        ]
        if config.error:
            lines.append(_klog("E", "main.go:173", f"error starting plugins: {config.error}"))
            return lines
        lines.append(_klog("I", "main.go:342", "Updating config with default resource matching patterns."))
        if config.text:
            rendered = json.dumps(yaml.safe_load(config.text), separators=(",", ":"))
            lines.append(_klog("I", "main.go:353", f"Running with config: {rendered}"))
        lines.append(_klog("I", "main.go:356", "Retrieving plugins."))
        if "crash_loop" in faults:
            lines.append(
                _klog(
                    "E",
                    "main.go:173",
                    "error starting plugins: error creating plugin manager: unable to "
                    "create plugin manager: nvml init failed: ERROR_LIBRARY_NOT_FOUND",
                )
            )
            return lines
        if "nvml" in faults or self.nodes[state.node].gpus == 0:
            lines += [
                _klog("E", "factory.go:112", "Failed to initialize NVML: could not load NVML library."),
                _klog(
                    "E", "factory.go:113", "If this is a GPU node, did you set the docker default runtime to `nvidia`?"
                ),
                _klog(
                    "E",
                    "factory.go:114",
                    "You can check the prerequisites at: https://github.com/NVIDIA/k8s-device-plugin#prerequisites",
                ),
                _klog(
                    "E",
                    "factory.go:115",
                    "You can learn how to set the runtime at: https://github.com/NVIDIA/k8s-device-plugin#quick-start",
                ),
                _klog(
                    "E",
                    "factory.go:116",
                    "If this is not a GPU node, you should set up a toleration or "
                    "nodeSelector to only deploy this plugin on GPU nodes",
                ),
                _klog("I", "main.go:370", "No devices found. Waiting indefinitely."),
            ]
            return lines
        if "no_devices" in faults:
            lines.append(_klog("I", "main.go:370", "No devices found. Waiting indefinitely."))
            return lines
        if config.mps and not self._mps_ready(state.node):
            return lines + _mps_wait_lines()
        for name in self._resources(state.node, config):
            socket = name.replace("nvidia.com/", "nvidia-").replace("/", "-")
            lines += [
                _klog("I", "server.go:176", f"Starting GRPC server for '{name}'"),
                _klog(
                    "I", "server.go:110", f"Starting to serve '{name}' on /var/lib/kubelet/device-plugins/{socket}.sock"
                ),
                _klog("I", "server.go:117", f"Registered device plugin for '{name}' with Kubelet"),
            ]
        return lines

    def pod_log(self, namespace: str, name: str, previous: bool = False) -> list[str] | None:
        state = self.pods.get((namespace, name))
        if state is None:
            logs = self.workload_logs.get((namespace, name))
            return None if logs is None or previous else list(logs)
        return list(state.previous_log if previous else state.log)

    def _event(self, obj: dict[str, Any], reason: str, message: str, kind: str, component: str) -> None:
        meta = obj["metadata"]
        name = f"{meta['name']}.{abs(hash((meta.get('uid'), reason))) % 16**16:016x}"
        stamp = now()
        existing = self.store.get("events", meta["namespace"], name)
        if existing is not None:
            self.api.mutate(
                _EVENTS,
                meta["namespace"],
                name,
                lambda ev: ev.update(count=ev.get("count", 1) + 1, lastTimestamp=stamp, message=message),
                component,
            )
            return
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": component},
        }
        self.api.create(_EVENTS, meta["namespace"], body, component)


def _is_mps_daemon(containers: list[dict[str, Any]]) -> bool:
    return bool(containers) and (containers[0].get("command") or [""])[0] == "mps-control-daemon"


def _mps_wait_lines() -> list[str]:
    """What the plugin (v0.20.0) logs while the MPS daemon does not answer (internal/plugin/server.go, main.go)."""
    return [
        _klog(
            "E",
            "main.go:409",
            "Failed to start plugin: error waiting for MPS daemon: error checking MPS daemon health: failed to send "
            "command to MPS daemon: exit status 1",
        ),
        _klog("I", "main.go:302", "Failed to start one or more plugins. Retrying in 30s..."),
    ]


DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def is_device_plugin(pod: dict[str, Any]) -> bool:
    """A device plugin registers with the kubelet through its socket folder: a pod that mounts it from the host is one
    (it reports capacity); any other DaemonSet pod just runs."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any(((v.get("hostPath") or {}).get("path") or "").rstrip("/") == DEVICE_PLUGIN_DIR for v in volumes)


def pod_faults(faults: dict[str, dict[str, Any]], daemonset: str, device_plugin: bool) -> dict[str, dict[str, Any]]:
    """The node's faults that reach a DaemonSet's pod: a fault whose ``daemonset`` parameter names a DaemonSet reaches
    only that DaemonSet's pods; one without it reaches the device plugin's (the faults are about the plugin)."""
    out = {}
    for name, params in faults.items():
        target = params.get("daemonset")
        if (target is None and device_plugin) or target == daemonset:
            out[name] = params
    return out


def _placement(node: dict[str, Any]) -> tuple[Any, ...]:
    """What decides which DaemonSet pods a node gets."""
    return (
        json.dumps(node["metadata"].get("labels") or {}, sort_keys=True),
        json.dumps((node.get("spec") or {}).get("taints") or [], sort_keys=True),
    )


def _container_statuses(containers: list[dict[str, Any]], state: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
    return [
        {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": "",
            "ready": ready,
            "started": ready,
            "restartCount": 0,
            "state": clone(state),
            "lastState": {},
            **({"containerID": f"containerd://{abs(hash(c.get('name', ''))):064x}"[:77]} if ready else {}),
        }
        for c in containers
    ]


def _pending_status(pod: dict[str, Any], containers: list[dict[str, Any]], reason: str, message: str) -> dict[str, Any]:
    waiting: dict[str, Any] = {"reason": reason}
    if message:
        waiting["message"] = message
    stamp = now()
    return {
        "phase": "Pending",
        "hostIP": "10.0.0.1",
        "startTime": stamp,
        "qosClass": "BestEffort",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp},
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            {
                "type": "ContainersReady",
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": stamp,
                "message": f"containers with unready status: [{' '.join(c.get('name', '') for c in containers)}]",
            },
            {
                "type": "Ready",
                "status": "False",
                "reason": "ContainersNotReady",
                "lastTransitionTime": stamp,
                "message": f"containers with unready status: [{' '.join(c.get('name', '') for c in containers)}]",
            },
        ],
        "containerStatuses": _container_statuses(containers, {"waiting": waiting}, False),
    }


def _running_status(pod: dict[str, Any], containers: list[dict[str, Any]], started_at: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "hostIP": "10.0.0.1",
        "podIP": "10.244.0.10",
        "startTime": started_at,
        "qosClass": "BestEffort",
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": started_at}
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": _container_statuses(containers, {"running": {"startedAt": started_at}}, True),
    }
