# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.site's GPU validation (the action kubegpu.node.gpu_validation), not a public API: it
# can change at any time. Pure functions over what the API and the nodes returned (plain dicts), so that the unit tests
# need no cluster: which nodes to validate, how many GPUs each has free, the validation pods, when a wait is over, and
# each node's row of the table.
#
# On a live cluster a node's GPUs belong to its workloads first. A node is checked with the GPUs that no running pod
# holds, and judged on its own pods only; the validation pods have the lowest priority and never preempt; each run's
# objects carry the run's id, so that runs at once (two node pools, AWX job slices) never touch each other's.

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.readiness import pod_problem

GPU = "nvidia.com/gpu"
RECORD_ANNOTATION = "kubegpu.node/validated"
NODE_ANNOTATION = "kubegpu.node/node"
RUN_LABEL = "kubegpu.node/run"
CHECK_LABEL = "kubegpu.node/check"
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
APP = "kubegpu-validation"
COLLECTION = "kubegpu.node"
RECORD_FIELD_MANAGER = "kubegpu.node-validation"
PRIORITY_CLASS = "kubegpu-validation"
# The lowest priority a workload is likely to have: every pod of any ordinary class (0 by default, negative for
# "batch" classes) is scheduled first and is never preempted for a validation pod; below the cluster autoscaler's
# expendable-pods cutoff (-10), so no node is ever added for one. Kubernetes allows any int32 below the user maximum
# of 1e9; -1e9 mirrors it and leaves room below for an operator who wants a still lower class.
PRIORITY_VALUE = -1_000_000_000
# The user the validation pods run as: `nobody`. Pod Security's `restricted` profile wants runAsNonRoot, and an image
# without a USER (the CUDA base images) would run as root, which the kubelet refuses under runAsNonRoot; nvidia-smi
# needs no root (the NVIDIA device nodes are 0666).
POD_USER = 65534
MODES = ("all", "changed", "none")
CHECKS = ("smi", "holder", "surplus")
TERMINAL = ("Succeeded", "Failed")
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_RUN_ID = re.compile(r"^[a-z0-9]([a-z0-9-]{0,18}[a-z0-9])?$")
_GPU_LINE = re.compile(r"^GPU [0-9]+:")


class ValidationError(ValueError):
    """A setting or input the validation cannot work with; the text says what to change."""


# ----- settings -------------------------------------------------------------------------------------------------


def validation_mode(value: Any) -> tuple[str, str | None]:
    """(all | changed | none, a deprecation note or None) from kubegpu_validate.

    true and false (booleans, or the strings AWX and -e pass) are the former switch: true validated every node on
    every run (now `all`), false none (now `none`).
    """
    if value is None:
        return "changed", None
    text = ("true" if value else "false") if isinstance(value, bool) else str(value).strip().lower()
    if text in MODES:
        return text, None
    if text not in _TRUE and text not in _FALSE:
        raise ValidationError(
            f"kubegpu_validate must be all, changed or none (true and false still work, deprecated); it is {value!r}"
        )
    mode = "all" if text in _TRUE else "none"
    meaning = "all (every node on every run)" if mode == "all" else "none"
    note = (
        f"kubegpu_validate: {value!r} is deprecated: it means {meaning}; set all, changed (the default: the nodes "
        "this run changed and those not validated with their current driver and toolkit) or none"
    )
    return mode, note


def run_id(awx_job_id: Any = None, token: str | None = None) -> str:
    """The id a run's objects carry (a label value and a name suffix): AWX's job id when AWX runs the playbook (each
    job slice is a job of its own), else 6 random characters."""
    if awx_job_id not in (None, ""):
        text = f"awx-{awx_job_id}".lower()
        if not _RUN_ID.match(text):
            raise ValidationError(f"awx_job_id {awx_job_id!r} cannot name Kubernetes objects")
        return text
    return token if token is not None else secrets.token_hex(3)


def gpu_count(value: Any) -> int | None:
    """A kubegpu_gpu_count as an int; None when not given; ValidationError when it is not a whole number."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValidationError(f"{value!r} is not a number of GPUs")
    text = str(value).strip()
    if not text.isdigit():
        raise ValidationError(f"{value} is not a number of GPUs")
    return int(text)


# ----- the play's hosts -----------------------------------------------------------------------------------------


@dataclass
class Target:
    """One host of the play as the validation sees it."""

    host: str
    node: str
    expected: int | None = None
    changes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    mode: str = "changed"


def _detected(pci: Any) -> Any:
    """The GPU count site.yml read from the PCI bus (its registered kubegpu.node.nvidia_pci_gpus), or None."""
    return pci.get("count") if isinstance(pci, Mapping) and not pci.get("skipped") else None


def collect_targets(hosts: Iterable[str], host_vars: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The Kubernetes node of each host, the GPUs it should have and how it is validated (site.yml's third play).

    ``host_vars``: per host, ``kubegpu_node_name`` (default: the inventory name), ``kubegpu_gpu_count`` (wins),
    ``__kubegpu_pci_gpus`` (site.yml's registered kubegpu.node.nvidia_pci_gpus: its ``count``) and
    ``kubegpu_validate`` (see validation_mode; a host or group variable, so a node pool can have its own). Returns
    ``nodes`` (in play order), ``expected`` (only the nodes whose count is known), ``modes`` (per host),
    ``validating`` (whether any host is validated at all), ``deprecation_notes`` and ``problems`` (one sentence per
    value that cannot be used).
    """
    nodes: list[str] = []
    expected: dict[str, int] = {}
    modes: dict[str, str] = {}
    problems: list[str] = []
    deprecations: list[str] = []
    for host in hosts:
        values = host_vars.get(host) or {}
        node = str(values.get("kubegpu_node_name") or host)
        nodes.append(node)
        try:
            modes[host], note = validation_mode(values.get("kubegpu_validate"))
            if note and note not in deprecations:
                deprecations.append(note)
        except ValidationError as exc:
            problems.append(f"{host}: {exc}.")
        given = values.get("kubegpu_gpu_count")
        try:
            count = gpu_count(given) if given is not None else gpu_count(_detected(values.get("__kubegpu_pci_gpus")))
        except ValidationError:
            problems.append(
                f"kubegpu_gpu_count of {host} is {given}: it must be the number of physical GPUs in the node "
                "(0 or more)."
            )
            continue
        if count is not None:
            expected[node] = count
    return {
        "nodes": nodes,
        "expected": expected,
        "modes": modes,
        "validating": any(mode != "none" for mode in modes.values()),
        "deprecation_notes": deprecations,
        "problems": problems,
    }


def host_changes(values: Mapping[str, Any]) -> list[str]:
    """What this run changed on a host that a GPU check should follow, from site.yml's and the roles' outputs: what
    the drain window applied (a reboot, runtime restarts) and the kubelet's feature gates."""
    changes = [str(item) for item in values.get("__kubegpu_disruptions") or []]
    kubelet = values.get("kubelet_feature_gates_result") or {}
    if isinstance(kubelet, Mapping) and str(kubelet.get("changed", "")).lower() in _TRUE:
        changes.append("kubelet feature gates")
    return changes


def toolkit_version(output: str | None) -> str:
    """The installed nvidia-container-toolkit version from `dpkg-query -W -f '${db:Status-Abbrev}|${Version}'` (or
    rpm's `%{VERSION}-%{RELEASE}`); '' when it is not installed."""
    for line in (output or "").splitlines():
        line = line.strip()
        if "|" in line:
            status, _sep, version = line.partition("|")
            # dpkg's abbreviation: want, status, error flag; "ii" and "hi" (held) are installed.
            if len(status) >= 2 and status[1] == "i" and version.strip():
                return version.strip()
        elif line and not line.startswith("package ") and " " not in line:
            return line
    return ""


def driver_version(facts: Any) -> str:
    """The driver version the node runs, from the nvidia_driver role's facts (ansible_local.nvidia)."""
    if not isinstance(facts, Mapping):
        return ""
    return str(facts.get("loaded_version") or facts.get("installed_version") or "")


# ----- the record on the Node -----------------------------------------------------------------------------------


def read_record(node: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The versions a node was last validated with (its annotation), or None (never, or not readable)."""
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(RECORD_ANNOTATION)
    if not text:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def record_text(versions: Mapping[str, str], run: str, when: str) -> str:
    return json.dumps(
        {"driver": versions.get("driver", ""), "toolkit": versions.get("toolkit", ""), "run": run, "at": when},
        sort_keys=True,
    )


def _same_versions(record: Mapping[str, Any], versions: Mapping[str, str]) -> bool:
    return all(str(record.get(key, "")) == str(versions.get(key, "")) for key in ("driver", "toolkit"))


def _versions_text(versions: Mapping[str, Any]) -> str:
    driver = versions.get("driver") or "none"
    toolkit = versions.get("toolkit") or "none"
    return f"driver {driver}, toolkit {toolkit}"


# ----- which nodes --------------------------------------------------------------------------------------------


def select_nodes(
    targets: Iterable[Target], nodes: Mapping[str, Mapping[str, Any]], plugin_changed: bool = False
) -> dict[str, Any]:
    """Which nodes this run validates, each with the reason, and why the others are left alone.

    By each target's mode: ``changed`` (the default) validates a node this run changed (``Target.changes``), one whose
    record (see read_record) names another driver or toolkit than it runs now or that has no record, and every node
    when the device plugin changed in this run (its pods restarted everywhere). ``all`` validates the node, ``none``
    does not. A node with no GPU expected (a count of 0) is never validated. Returns ``validate`` and ``skip``
    (node: reason) and ``hosts`` (the inventory names of the nodes validated).
    """
    validate: dict[str, str] = {}
    skip: dict[str, str] = {}
    hosts: list[str] = []
    for target in targets:
        mode = target.mode
        if mode not in MODES:
            raise ValidationError(f"unknown validation mode {mode!r}")
        node = nodes.get(target.node)
        if target.expected == 0:
            skip[target.node] = "no GPU expected"
            continue
        reason = None
        if mode == "none":
            skip[target.node] = "kubegpu_validate is none"
            continue
        if mode == "all":
            reason = "kubegpu_validate is all"
        elif plugin_changed:
            reason = "the device plugin changed in this run"
        elif target.changes:
            reason = "this run changed it: " + ", ".join(target.changes)
        elif node is None:
            reason = "not found in the cluster"
        else:
            record = read_record(node)
            if record is None:
                reason = "never validated"
            elif not _same_versions(record, target.versions):
                reason = f"validated with {_versions_text(record)}; it runs {_versions_text(target.versions)}"
            else:
                skip[target.node] = f"validated with {_versions_text(record)}" + (
                    f" (run {record['run']}, {record['at']})" if record.get("run") and record.get("at") else ""
                )
        if reason is not None:
            validate[target.node] = reason
            hosts.append(target.host)
    return {"validate": validate, "skip": skip, "hosts": hosts}


# Beyond this many nodes left alone, the summary counts them instead of naming each (a nightly run over a fleet).
SUMMARY_NODES = 20


def selection_summary(selection: Mapping[str, Any]) -> list[str]:
    """One line saying how many nodes are validated, then one per node validated with its reason, and one per node
    left alone (or, beyond SUMMARY_NODES of them, how many and the first few)."""
    validate, skip = selection["validate"], selection["skip"]
    total = len(validate) + len(skip)
    lines = [f"Validating {len(validate)} of {total} nodes"]
    lines += [f"{node}: validated: {reason}" for node, reason in validate.items()]
    if len(skip) <= SUMMARY_NODES:
        lines += [f"{node}: not validated: {reason}" for node, reason in skip.items()]
    else:
        names = list(skip)
        lines.append(
            f"{len(skip)} nodes not validated ({', '.join(names[:5])}, ...): validated before with the driver and "
            "toolkit they run, no GPU expected, or kubegpu_validate: none"
        )
    return lines


# ----- free GPUs ----------------------------------------------------------------------------------------------


def quantity(value: Any) -> int:
    """An extended resource's quantity (a whole number; '4', 4, '2k'); 0 when absent or unreadable."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.fullmatch(r"\s*([0-9]+)(k?)\s*", str(value))
    if not match:
        return 0
    return int(match.group(1)) * (1000 if match.group(2) else 1)


def _container_request(container: Mapping[str, Any], resource: str) -> int:
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    if resource in requests:
        return quantity(requests[resource])
    # An extended resource's request defaults to its limit (the API server fills it in).
    return quantity((resources.get("limits") or {}).get(resource))


def pod_request(pod: Mapping[str, Any], resource: str = GPU) -> int:
    """How many of ``resource`` a pod holds on its node, as the scheduler counts it: the app containers' sum plus the
    sidecars (init containers with restartPolicy Always), or a plain init container's request plus the sidecars
    started before it when that is larger; plus the pod's overhead."""
    spec = pod.get("spec") or {}
    app = sum(_container_request(c, resource) for c in spec.get("containers") or [])
    sidecars = 0
    peak = 0
    for container in spec.get("initContainers") or []:
        own = _container_request(container, resource)
        if container.get("restartPolicy") == "Always":
            sidecars += own
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + own)
    return max(app + sidecars, peak) + quantity((spec.get("overhead") or {}).get(resource))


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """A pod bound to a node that has not terminated holds what it requests (pending, running, or being deleted)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get("phase") not in TERMINAL


def _pod_ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def gpu_usage(
    node: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    resource: str = GPU,
    exclude_run: str | None = None,
) -> dict[str, Any]:
    """``allocatable``, ``used`` (by the node's own non-terminated pods), ``free`` and ``holders`` (ns/name: count)
    of one node; pods of the validation run ``exclude_run`` are left out."""
    name = ((node or {}).get("metadata") or {}).get("name")
    allocatable = quantity((((node or {}).get("status") or {}).get("allocatable") or {}).get(resource))
    holders: dict[str, int] = {}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") != name or not holds_resources(pod):
            continue
        if exclude_run and ((pod.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL) == exclude_run:
            continue
        count = pod_request(pod, resource)
        if count:
            holders[_pod_ref(pod)] = count
    used = sum(holders.values())
    return {"allocatable": allocatable, "used": used, "free": max(0, allocatable - used), "holders": holders}


def in_use_text(usage: Mapping[str, Any]) -> str:
    return f"{usage['used']}/{usage['allocatable']} in use"


# ----- the objects ----------------------------------------------------------------------------------------------


@dataclass
class Settings:
    namespace: str
    run: str
    image: str
    timeout: int
    runtime_class: str | None = None


def _labels(run: str, check: str | None = None) -> dict[str, str]:
    labels = {NAME_LABEL: APP, MANAGED_BY_LABEL: COLLECTION, RUN_LABEL: run}
    if check:
        labels[CHECK_LABEL] = check
    return labels


# Namespaces that belong to the cluster or its users: the validation labels its namespace to enforce Pod Security
# restricted, which must never happen to one of these.
_FOREIGN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def namespace_object(name: str) -> dict[str, Any]:
    """The validation namespace: shared by every run (each deletes only its own pods), so it is kept, and its pods
    must pass Pod Security's restricted profile."""
    if name in _FOREIGN_NAMESPACES:
        raise ValidationError(
            f"kubegpu_validation_namespace is {name}: the validation needs a namespace of its own (it enforces Pod "
            "Security restricted there); the default is kubegpu-validation"
        )
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                NAME_LABEL: APP,
                MANAGED_BY_LABEL: COLLECTION,
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }


def priority_class_object() -> dict[str, Any]:
    """The validation pods' PriorityClass: the lowest priority, and preemptionPolicy Never, so a validation pod never
    evicts a pod to get GPUs, whatever that pod's priority (even one below this value waits in its place)."""
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS, "labels": {NAME_LABEL: APP, MANAGED_BY_LABEL: COLLECTION}},
        "value": PRIORITY_VALUE,
        "preemptionPolicy": "Never",
        "globalDefault": False,
        "description": "kubegpu.node's GPU validation pods: scheduled after everything else, never preempting.",
    }


def pod_name(check: str, node: str, run: str) -> str:
    """kubegpu-<check>-<node>-<run>, a valid pod name whatever the node's name's length."""
    name = f"kubegpu-{check}-{node}-{run}"
    if len(name) <= 253:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:8]
    return f"kubegpu-{check}-{node[: 253 - len(check) - len(run) - 20].rstrip('.-')}-{digest}-{run}"


def pod_object(node: str, check: str, gpus: int, settings: Settings) -> dict[str, Any]:
    """One validation pod on ``node``: it asks for ``gpus`` GPUs, has the lowest priority and never preempts, passes
    Pod Security's restricted profile, and ends by itself (activeDeadlineSeconds) if the run that made it is killed."""
    if check not in CHECKS:
        raise ValidationError(f"unknown check {check!r}")
    lifetime = 3 * settings.timeout + 60
    command = ["nvidia-smi", "-L"] if check == "smi" else ["sleep", str(lifetime)]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "activeDeadlineSeconds": lifetime,
        "priorityClassName": PRIORITY_CLASS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": POD_USER,
            "runAsGroup": POD_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The scheduler places it (so that the GPU count is checked), only on this node, also when the node is tainted
        # for GPU workloads or was cordoned before the run.
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        },
        "tolerations": [
            {"key": GPU, "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
            # A node tainted for its GPU health (tasks/gpu_health.yml) is validated too; the table's health column
            # says what is wrong with it.
            {"key": "kubegpu.node/gpu-unhealthy", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "containers": [
            {
                "name": check,
                "image": settings.image,
                "command": command,
                # The NVIDIA runtime mounts the host's nvidia-smi into the container for the utility capability.
                "env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"}],
                "resources": {"limits": {GPU: str(gpus)}},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                    "readOnlyRootFilesystem": True,
                },
            }
        ],
    }
    if settings.runtime_class:
        spec["runtimeClassName"] = settings.runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(check, node, settings.run),
            "namespace": settings.namespace,
            "labels": _labels(settings.run, check),
            "annotations": {NODE_ANNOTATION: node},
        },
        "spec": spec,
    }


def plan(
    validate: Iterable[str],
    nodes: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    settings: Settings,
) -> dict[str, Any]:
    """For each node to validate: its GPUs in use by other pods, and the three pods of its checks (nvidia-smi on one
    free GPU; a holder of every free GPU; one more GPU, which must stay Pending); a node with no free GPU is skipped
    ("skipped: 4/4 in use"), not failed. Returns ``usage`` and ``busy`` (the row text of a node with no free GPU) per
    node, and ``pods`` per check."""
    pods = list(pods)
    usage: dict[str, dict[str, Any]] = {}
    busy: dict[str, str] = {}
    objects: dict[str, list[dict[str, Any]]] = {check: [] for check in CHECKS}
    for name in validate:
        node = nodes.get(name)
        if node is None:
            continue
        usage[name] = gpu_usage(node, pods, exclude_run=settings.run)
        free = usage[name]["free"]
        if usage[name]["allocatable"] == 0:
            continue
        if free == 0:
            busy[name] = f"skipped: {in_use_text(usage[name])}"
            continue
        objects["smi"].append(pod_object(name, "smi", 1, settings))
        objects["holder"].append(pod_object(name, "holder", free, settings))
        objects["surplus"].append(pod_object(name, "surplus", 1, settings))
    # Not "skipped": in a task's result that key would mark the task skipped.
    return {"usage": usage, "busy": busy, "pods": objects}


# ----- waiting ------------------------------------------------------------------------------------------------


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's message when it found no node for the pod, else None."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False" and not (pod.get("spec") or {}).get("nodeName"):
        return str(scheduled.get("message") or scheduled.get("reason") or "Unschedulable")
    return None


def settled(check: str, pod: Mapping[str, Any] | None) -> bool:
    """Whether a check's pod has reached what the check waits for: nvidia-smi finished, the holder bound, the scheduler
    decided on the surplus pod. A pod that is gone, or that no node can take, is settled too (judged later)."""
    if pod is None:
        return True
    phase = (pod.get("status") or {}).get("phase")
    if phase in TERMINAL or unschedulable(pod) is not None:
        return True
    if check == "smi":
        return False
    return bool((pod.get("spec") or {}).get("nodeName"))


def by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(((p.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION, "")): dict(p) for p in pods}


def unsettled(check: str, wanted: Iterable[str], pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """The nodes whose pod for ``check`` is not settled yet."""
    found = by_node(pods)
    return [node for node in wanted if not settled(check, found.get(node))]


# ----- judging ------------------------------------------------------------------------------------------------


def _waited_text(what: str, waited: float, pod: Mapping[str, Any]) -> str:
    _kind, text = pod_problem(dict(pod))
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    return f"waited {round(waited)} s for {what}; it is {text or phase}"


def smi_verdict(pod: Mapping[str, Any] | None, log_lines: list[str] | None, waited: float) -> tuple[str, str]:
    """(ok | failed | gone | unschedulable, text) of the nvidia-smi pod."""
    if pod is None:
        return "gone", "the nvidia-smi pod was deleted during the check"
    phase = (pod.get("status") or {}).get("phase")
    lines = [line for line in log_lines or [] if line.strip()]
    gpu_lines = [line for line in lines if _GPU_LINE.match(line)]
    if phase == "Succeeded" and gpu_lines:
        return "ok", "ok: " + re.sub(r" \(UUID:.*$", "", gpu_lines[0])
    if phase in TERMINAL:
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        terminated = ((statuses[0] or {}).get("state") or {}).get("terminated") or {}
        exit_text = f" (exit {terminated['exitCode']})" if terminated.get("exitCode") is not None else ""
        said = " ".join(lines)[:120] or (pod.get("status") or {}).get("message") or "printed no GPU"
        return "failed", f"FAILED: nvidia-smi -L {phase.lower()}{exit_text}: {said}"
    message = unschedulable(pod)
    if message is not None:
        return "unschedulable", message
    return "failed", "FAILED: " + _waited_text("nvidia-smi -L to finish", waited, pod)


def _scheduled_message(pod: Mapping[str, Any]) -> str:
    condition = _condition(pod, "PodScheduled") or {}
    return str(condition.get("message") or condition.get("reason") or "")


def judge_node(
    node: str,
    allocatable: int,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    smi: tuple[Mapping[str, Any] | None, list[str] | None] | None,
    holder: Mapping[str, Any] | None,
    surplus: Mapping[str, Any] | None,
    waited: Mapping[str, float],
    reached: Mapping[str, bool],
) -> dict[str, str]:
    """The pod and scheduling cells of one node's row, and its verdict (ok | failed | skipped).

    ``before``/``after``: the node's GPU usage by other pods when the checks were planned and once they were over
    (gpu_usage); ``smi``: the nvidia-smi pod and its log lines; ``holder``/``surplus``: those pods as last seen;
    ``reached``: which checks' pods were created. A check that found its GPUs taken, or freed, by other pods meanwhile
    is skipped, not failed: a node is judged on what the scheduler and its own pods did.
    """
    before = before or {"used": 0, "allocatable": allocatable, "free": allocatable}
    after = after or before
    taken = after["used"] > before["used"]
    freed = after["used"] < before["used"]
    now_in_use = f"{after['used']}/{after['allocatable']} in use by other pods"
    if not reached.get("smi"):
        return {"pod": "not run", "scheduling": "not run", "verdict": "failed"}
    smi_pod, smi_log = smi or (None, None)
    kind, text = smi_verdict(smi_pod, smi_log, waited.get("smi", 0.0))
    if kind == "gone":
        pod_cell, pod_ok = "skipped: " + text + " (preempted?)", None
    elif kind == "unschedulable":
        pod_cell, pod_ok = (
            (f"skipped: its GPU was taken during the check ({now_in_use})", None)
            if taken
            else (f"FAILED: the scheduler did not place the nvidia-smi pod: {text}", False)
        )
    else:
        pod_cell, pod_ok = text, kind == "ok"
    scheduling_cell, scheduling_ok = _scheduling_cell(
        allocatable, before, after, holder, surplus, waited, reached, taken, freed, now_in_use
    )
    verdicts = [pod_ok, scheduling_ok]
    if any(v is False for v in verdicts):
        verdict = "failed"
    elif all(v is True for v in verdicts):
        verdict = "ok"
    else:
        verdict = "skipped"
    return {"pod": pod_cell, "scheduling": scheduling_cell, "verdict": verdict}


def _scheduling_cell(
    allocatable: int,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    holder: Mapping[str, Any] | None,
    surplus: Mapping[str, Any] | None,
    waited: Mapping[str, float],
    reached: Mapping[str, bool],
    taken: bool,
    freed: bool,
    now_in_use: str,
) -> tuple[str, bool | None]:
    if not reached.get("holder"):
        return "not run", False
    if holder is None:
        return "skipped: the holding pod was deleted during the check (preempted?)", None
    holder_gpus = pod_request(holder)
    if not (holder.get("spec") or {}).get("nodeName"):
        message = unschedulable(holder)
        if message is None:
            return "FAILED: " + _waited_text(
                f"the pod holding {holder_gpus} free GPUs to be placed", waited.get("holder", 0.0), holder
            ), False
        if taken:
            return f"skipped: GPUs were taken during the check ({now_in_use})", None
        return (
            f"FAILED: {holder_gpus} GPUs were free but the scheduler did not place a pod asking for them: {message}",
            False,
        )
    if not reached.get("surplus"):
        return "not run", False
    if surplus is None:
        return "skipped: the surplus pod was deleted during the check", None
    if (surplus.get("spec") or {}).get("nodeName"):
        requested = after["used"] + holder_gpus + pod_request(surplus)
        if requested > allocatable:
            return (
                f"FAILED: the scheduler placed a pod asking for one GPU more than the node has: {requested} GPUs "
                f"requested on {allocatable} allocatable",
                False,
            )
        return f"skipped: GPUs were freed during the check, so the surplus pod fitted ({now_in_use})", None
    message = unschedulable(surplus)
    if message is None:
        return "FAILED: " + _waited_text(
            "the scheduler to decide on a pod asking for one GPU more", waited.get("surplus", 0.0), surplus
        ), False
    if f"Insufficient {GPU}" in message:
        return f"ok: surplus pod Pending (Insufficient {GPU})", True
    return f"FAILED: the surplus pod is Pending for another reason: {message[:160]}", False


def _status_message(text: str) -> str | None:
    """The ``message`` of a Kubernetes Status in ``text`` (kubernetes.core puts the answer's body into its msg)."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        decoded = json.loads(text[start:])
    except ValueError:
        return None
    return str(decoded["message"]) if isinstance(decoded, dict) and decoded.get("message") else None


def _one_result_text(result: Mapping[str, Any]) -> str:
    parts = []
    msg = str(result.get("msg") or "").strip()
    if msg and msg != "Unknown error.":
        status = _status_message(msg)
        parts.append(f"{msg[: msg.find('{')].strip()} {status}".strip() if status else msg)
    body = result.get("body")
    if isinstance(body, (str, bytes)):
        status = _status_message(body.decode() if isinstance(body, bytes) else body)
        if status and status not in " ".join(parts):
            parts.append(status)
    for key in ("reason", "status", "error"):
        value = result.get(key)
        if value not in (None, "") and not parts:
            parts.append(f"{key} {value}")
    if result.get("attempts") and not parts:
        parts.append(f"gave up after {result['attempts']} attempts")
    item = result.get("item")
    label = ""
    if isinstance(item, Mapping) and item.get("kind"):
        label = f"{item['kind']} {(item.get('metadata') or {}).get('name', '')}: "
    return label + ("; ".join(parts) or "failed without a message (run with -v to see the task's result)")


def failure_text(task: str | None, result: Mapping[str, Any] | None) -> str:
    """What a failed API step says, from its result: the API server's own message (a Status's ``message``, also
    inside kubernetes.core's msg or a loop's failed items), never the generic "Unknown error." that ansible-core puts
    where a result has no ``msg``."""
    result = result or {}
    items = [r for r in result.get("results") or [] if isinstance(r, Mapping) and r.get("failed")]
    text = "; ".join(_one_result_text(r) for r in items) if items else _one_result_text(result)
    return f"{task}: {text}" if task else text


# ----- the node's own checks (tasks/validate_node.yml) and the table -------------------------------------------


def host_cell(result: Mapping[str, Any] | None, expected: int | None) -> str:
    """The HOST cell from `nvidia-smi --query-gpu=index,name,uuid --format=csv,noheader` run on the node."""
    if not result or result.get("skipped"):
        return "not run"
    rc = result.get("rc")
    lines = result.get("stdout_lines") or str(result.get("stdout") or "").splitlines()
    gpus = len([line for line in lines if re.match(r"^[0-9]+,", line)])
    if rc == 0 and (expected is None or gpus == expected):
        return f"ok ({gpus} GPUs)"
    if rc == 0:
        return f"FAILED: nvidia-smi saw {gpus} of {expected} GPUs"
    said = " ".join(str(result.get(k) or "").strip() for k in ("stderr", "stdout")).strip()
    return f"FAILED: exit {rc}: {(said or str(result.get('msg') or '')).strip()[:80]}"


def container_cell(result: Mapping[str, Any] | None) -> str:
    """The CONTAINER cell from nvidia-smi -L run in a container through the node's runtime (rc 4: no docker or ctr)."""
    if not result or result.get("skipped"):
        return "skipped"
    rc = result.get("rc")
    if rc == 4:
        return "not checked (no docker or ctr)"
    lines = result.get("stdout_lines") or str(result.get("stdout") or "").splitlines()
    gpus = len([line for line in lines if _GPU_LINE.match(line)])
    if rc == 0 and gpus > 0:
        return f"ok ({gpus} GPUs)"
    return f"FAILED: exit {rc}: {str(result.get('stderr') or result.get('stdout') or '').strip()[:80]}"


@dataclass
class Outcome:
    """What the cluster checks left: the plan, the pods as last seen per check, nvidia-smi's logs per node, the
    node's usage once the checks were over, how long each wait took, which checks' pods were created, an error."""

    plan: dict[str, Any] = field(default_factory=dict)
    pods: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    waited: dict[str, float] = field(default_factory=dict)
    reached: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    check_mode: bool = False


def rows(
    targets: Iterable[Target],
    selection: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    node_checks: Mapping[str, Mapping[str, str]],
    outcome: Outcome,
    run: str,
    when: str,
) -> dict[str, Any]:
    """The table's rows (one per node validated), the nodes that passed, failed or were skipped, and the records to
    write: a node that passed gets the versions it passed with (when its record names others), a node that failed
    loses its record (the next run validates it again); a skipped node keeps what it had."""
    table: list[dict[str, str]] = []
    passed: list[str] = []
    failed: list[str] = []
    skipped: list[str] = []
    records: dict[str, str | None] = {}
    validate = selection.get("validate") or {}
    usage = outcome.plan.get("usage") or {}
    busy = outcome.plan.get("busy") or {}
    found = {check: by_node(outcome.pods.get(check) or []) for check in CHECKS}
    for target in targets:
        if target.node not in validate:
            continue
        node = nodes.get(target.node)
        allocatable = quantity((((node or {}).get("status") or {}).get("allocatable") or {}).get(GPU))
        checks = node_checks.get(target.host) or {}
        host, container = checks.get("host", "not run"), checks.get("container", "not run")
        before = usage.get(target.node)
        if allocatable == 0 and not target.expected and not outcome.check_mode:
            continue  # not a GPU node: nothing to validate
        if outcome.check_mode:
            # Nothing was applied: the device plugin may not even run yet.
            cells = {"pod": "not run (check mode)", "scheduling": "not run (check mode)", "verdict": "skipped"}
        elif allocatable == 0:
            cells = {"pod": f"FAILED: no allocatable {GPU}", "scheduling": "-", "verdict": "failed"}
        elif target.node in busy:
            cells = {"pod": busy[target.node], "scheduling": busy[target.node], "verdict": "skipped"}
        else:
            smi = (found["smi"].get(target.node), outcome.logs.get(target.node))
            cells = judge_node(
                target.node,
                allocatable,
                before,
                outcome.after.get(target.node),
                smi,
                found["holder"].get(target.node),
                found["surplus"].get(target.node),
                outcome.waited,
                outcome.reached,
            )
        verdict = cells["verdict"]
        if host.startswith("FAILED") or container.startswith("FAILED"):
            verdict = "failed"
        gpus = str(allocatable)
        if before and before.get("used"):
            gpus += f" ({before['used']} in use)"
        table.append(
            {
                "node": target.node,
                "gpus": gpus,
                "host": host,
                "container": container,
                "pod": cells["pod"],
                "scheduling": cells["scheduling"],
            }
        )
        record = read_record(node)
        if verdict == "ok":
            passed.append(target.node)
            if record is None or not _same_versions(record, target.versions):
                records[target.node] = record_text(target.versions, run, when)
        elif verdict == "failed":
            failed.append(target.node)
            if record is not None:
                records[target.node] = None
        else:
            skipped.append(target.node)
    # Not "failed": in a task's result that key would fail the task.
    return {
        "rows": table,
        "passed_nodes": passed,
        "failed_nodes": failed,
        "skipped_nodes": skipped,
        "records": records,
    }


def failure_message(failed: list[str], error: str | None) -> str:
    """The run's failure, naming the step that broke and the nodes that did not pass."""
    text = "GPU validation failed" + (f": {error}" if error else "") + "."
    if failed:
        text += f" Nodes that did not pass: {', '.join(failed)}."
    return (
        text + " This run's validation pods were removed. See the table above; kubegpu_validate: none skips the "
        "validation."
    )


def table(rows: list[Mapping[str, Any]], columns: Iterable[str] | None = None) -> list[str]:
    """Rows as aligned text lines, a header first (site.yml prints them); ``columns`` picks and orders the keys
    (default: every key, in order of first appearance)."""
    keys = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    cells = [[k.upper() for k in keys]] + [[str(r.get(k, "")) for k in keys] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(keys))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in cells]
