# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: pure decisions over Node and Pod objects (plain dicts as the API
# returns them): which nodes the wait covers, whether each reports the GPUs it should, and, on timeout, why not.
# No I/O and no clock here, so that unit tests run over captured objects.

from __future__ import annotations

import re

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import (
    GPU_RESOURCE,
    advertised,
)

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
LOG_LINES_IN_MESSAGE = 5

MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"
MPS_WAIT_MARKER = "error waiting for MPS daemon"
NVML_MARKERS = (
    "could not load NVML",
    "Failed to initialize NVML",
    "nvml init failed",
    "Incompatible strategy detected",
    "Incompatible platform detected",
    "did you configure the NVIDIA Container Toolkit",
    "default runtime to `nvidia`",
)
NO_DEVICES_MARKER = "No devices found"
NVML_HINT = (
    "the plugin cannot load NVML: the container runtime that runs it is not nvidia (the default runtime is not "
    "nvidia); set the nvidia runtime as the node's default runtime, or use runtime_class so the plugin runs under "
    "a RuntimeClass with handler nvidia"
)
NO_DEVICES_HINT = (
    "the plugin runs but found no GPU ('No devices found'): check the driver on the node (nvidia-smi) and that the "
    "nvidia runtime injects the devices into the plugin's container"
)


def _quantity(value) -> int:
    """An extended-resource quantity as an integer (they are whole numbers; '0' when absent or unparsable)."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    match = re.match(r"^\s*([0-9]+)\s*$", str(value))
    if match:
        return int(match.group(1))
    match = re.match(r"^\s*([0-9]+)k\s*$", str(value))
    return int(match.group(1)) * 1000 if match else 0


def node_name(node: dict) -> str:
    return (node.get("metadata") or {}).get("name", "")


def node_labels(node: dict) -> dict:
    return (node.get("metadata") or {}).get("labels") or {}


def node_is_ready(node: dict) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _ready_condition_text(node: dict) -> str:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            reason = condition.get("reason") or ""
            message = condition.get("message") or ""
            return f"Ready={condition.get('status')} {reason}: {message}".strip().rstrip(":")
    return "no Ready condition reported"


def gpu_resources(node: dict, plan: dict) -> tuple:
    """(capacity, allocatable, per-resource detail) of the GPU resources the plan counts on this node."""
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    names = {plan["resource"]}
    if plan.get("mig_resources"):
        names.add(GPU_RESOURCE)
        names.update(name for name in list(capacity) + list(allocatable) if name.startswith(MIG_RESOURCE_PREFIX))
    detail = {}
    for name in sorted(names):
        if name in capacity or name in allocatable:
            detail[name] = {"capacity": _quantity(capacity.get(name)), "allocatable": _quantity(allocatable.get(name))}
    total_capacity = sum(entry["capacity"] for entry in detail.values())
    total_allocatable = sum(entry["allocatable"] for entry in detail.values())
    return total_capacity, total_allocatable, detail


def expected_capacity(plan: dict, physical_gpus):
    """Schedulable units a node with this many physical GPUs should advertise; None when it cannot be predicted."""
    if physical_gpus is None or not plan.get("exact", True):
        return None
    return physical_gpus * int(plan.get("replicas", 1))


def node_state(node: dict | None, name: str, plan: dict, physical_gpus=None, resources: dict | None = None) -> dict:
    """Whether one node is done: Ready, capacity as expected (or non-zero), and allocatable equal to capacity.

    ``resources`` (resource name -> count before sharing, such as a MIG layout's devices) replaces the physical GPU
    count: each resource, as the plan's sharing advertises it, must then be reported exactly.
    """
    if resources is not None:
        return _resources_state(node, name, plan, advertised(plan, resources))
    expected = expected_capacity(plan, physical_gpus)
    state = {
        "name": name,
        "found": node is not None,
        "node_ready": False,
        "resource": plan["resource"],
        "capacity": 0,
        "allocatable": 0,
        "expected": expected,
        "physical_gpus": physical_gpus,
        "replicas": int(plan.get("replicas", 1)),
        "done": False,
    }
    if node is None:
        return state
    capacity, allocatable, detail = gpu_resources(node, plan)
    state.update(node_ready=node_is_ready(node), capacity=capacity, allocatable=allocatable)
    if plan.get("mig_resources") and detail:
        state["resources"] = detail
    if not state["node_ready"]:
        return state
    if expected is not None:
        counts_match = capacity == expected
    elif physical_gpus == 0:
        counts_match = capacity == 0
    else:
        counts_match = capacity > 0
    state["done"] = counts_match and allocatable == capacity
    return state


def _resources_state(node: dict | None, name: str, plan: dict, expected: dict) -> dict:
    """node_state for a node with an expected count per resource (MIG layouts: nvidia.com/mig-<profile>, ...)."""
    state = {
        "name": name,
        "found": node is not None,
        "node_ready": False,
        "resource": ",".join(sorted(expected)) or plan["resource"],
        "capacity": 0,
        "allocatable": 0,
        "expected": sum(expected.values()),
        "physical_gpus": None,
        "replicas": int(plan.get("replicas", 1)),
        "expected_resources": dict(expected),
        "done": False,
    }
    if node is None:
        return state
    status = node.get("status") or {}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    detail = {
        resource: {
            "capacity": _quantity(capacity.get(resource)),
            "allocatable": _quantity(allocatable.get(resource)),
            "expected": count,
        }
        for resource, count in sorted(expected.items())
    }
    state.update(
        node_ready=node_is_ready(node),
        capacity=sum(d["capacity"] for d in detail.values()),
        allocatable=sum(d["allocatable"] for d in detail.values()),
        resources=detail,
    )
    state["done"] = state["node_ready"] and all(
        d["capacity"] == d["expected"] and d["allocatable"] == d["capacity"] for d in detail.values()
    )
    return state


def resources_mismatch(state: dict) -> list:
    """'nvidia.com/mig-1g.10gb 1 (expected 2)' for each resource a node reports in another count than expected."""
    return [
        f"{resource} {entry['capacity']} (expected {entry['expected']})"
        for resource, entry in sorted((state.get("resources") or {}).items())
        if "expected" in entry and entry["capacity"] != entry["expected"]
    ]


def mps_daemon_problem(node: dict, daemon_pod: dict | None) -> str | None:
    """Why NVIDIA's MPS control daemon does not serve this node; None when its pod runs."""
    if daemon_pod is None:
        value = node_labels(node).get(MPS_CAPABLE_LABEL)
        if value != "true":
            found = "no such label" if value is None else f"{MPS_CAPABLE_LABEL}={value}"
            return (
                f"no MPS control daemon on this node: it runs only on nodes labelled {MPS_CAPABLE_LABEL}=true (the "
                f"node has {found}); GPU feature discovery sets it when the config shares GPUs with MPS and no GPU "
                "has MIG enabled, and kubegpu.node.site's labels step sets it from the config"
            )
        return "no MPS control daemon pod on this node yet (its DaemonSet has not scheduled one)"
    kind, text = pod_problem(daemon_pod)
    if kind is not None:
        return f"the MPS control daemon pod {_pod_name(daemon_pod)} is not running: {text}"
    return None


def _label_expression_matches(labels: dict, expression: dict) -> bool:
    key = expression.get("key")
    operator = expression.get("operator")
    values = expression.get("values") or []
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and values:
        try:
            actual, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def _field_expression_matches(node: dict, expression: dict) -> bool:
    if expression.get("key") != "metadata.name":
        return False
    return _label_expression_matches({"metadata.name": node_name(node)}, expression)


def affinity_matches(node: dict, affinity: dict | None) -> bool:
    """Required node affinity: the terms are ORed, the expressions within a term ANDed."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    labels = node_labels(node)
    for term in terms:
        expressions = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not expressions and not fields:
            continue
        if all(_label_expression_matches(labels, e) for e in expressions) and all(
            _field_expression_matches(node, f) for f in fields
        ):
            return True
    return False


def selector_mismatch(node: dict, node_selector: dict | None) -> list:
    """Labels of the node selector that this node lacks or has with another value."""
    labels = node_labels(node)
    missing = []
    for key, value in (node_selector or {}).items():
        if labels.get(key) != value:
            actual = labels.get(key)
            missing.append(f"{key}={value} (node has {'no such label' if actual is None else actual})")
    return missing


def _tolerates(toleration: dict, taint: dict) -> bool:
    if toleration.get("effect") and toleration.get("effect") != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if not toleration.get("key"):
        return operator == "Exists"
    if toleration.get("key") != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taints(node: dict, tolerations: list) -> list:
    """NoSchedule/NoExecute taints of the node that none of the pod's tolerations covers.

    DaemonSet pods tolerate node.kubernetes.io/unschedulable and the not-ready/unreachable/pressure taints
    automatically, so those never explain a missing pod.
    """
    automatic = (
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
    )
    blocking = []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute") or taint.get("key") in automatic:
            continue
        if not any(_tolerates(t, taint) for t in tolerations or []):
            value = f"={taint['value']}" if taint.get("value") else ""
            blocking.append(f"{taint.get('key')}{value}:{taint.get('effect')}")
    return blocking


def plugin_would_run(node: dict, pod_spec: dict) -> bool:
    return (
        not selector_mismatch(node, pod_spec.get("nodeSelector"))
        and affinity_matches(node, pod_spec.get("affinity"))
        and not untolerated_taints(node, pod_spec.get("tolerations") or [])
    )


# Diagnosis -------------------------------------------------------------------------------------------------------


def _container_status(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return statuses[0] if statuses else {}


def pod_problem(pod: dict) -> tuple:
    """(kind, text) for a plugin pod that is not running well; (None, '') when it runs.

    kind is one of image_pull, crash_loop, pending, terminated, not_ready.
    """
    status = pod.get("status") or {}
    container = _container_status(pod)
    state = container.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = waiting.get("reason") or ""
    message = waiting.get("message") or ""
    if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
        image = container.get("image") or ""
        return "image_pull", f"image pull error ({reason}) for {image}: {message}".rstrip(": ")
    if reason == "CrashLoopBackOff":
        restarts = container.get("restartCount", 0)
        last = ((container.get("lastState") or {}).get("terminated")) or {}
        exit_text = f", last exit code {last.get('exitCode')}" if last.get("exitCode") is not None else ""
        return "crash_loop", f"crash loop (CrashLoopBackOff, {restarts} restarts{exit_text})"
    if reason:
        return "pending", f"container waiting: {reason} {message}".strip()
    if state.get("terminated"):
        terminated = state["terminated"]
        return "terminated", f"container terminated: {terminated.get('reason', '')} exit {terminated.get('exitCode')}"
    phase = status.get("phase") or "Unknown"
    if phase != "Running":
        conditions = [
            f"{c.get('type')}: {c.get('reason', '')} {c.get('message', '')}".strip()
            for c in status.get("conditions") or []
            if c.get("status") != "True"
        ]
        detail = "; ".join(conditions) if conditions else (status.get("message") or status.get("reason") or "")
        return "pending", f"pod phase {phase}{': ' + detail if detail else ''}"
    return None, ""


def log_tail(logs: str | None, lines: int = LOG_LINES_IN_MESSAGE) -> list:
    if not logs:
        return []
    return [line for line in logs.strip().splitlines() if line.strip()][-lines:]


def classify_logs(logs: str | None) -> str | None:
    """'nvml' or 'no_devices' when the plugin's log has one of its known failure messages."""
    if not logs:
        return None
    if any(marker.lower() in logs.lower() for marker in NVML_MARKERS):
        return "nvml"
    if NO_DEVICES_MARKER in logs:
        return "no_devices"
    return None


def pods_by_node(pods: list) -> dict:
    result: dict = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            result.setdefault(node, []).append(pod)
    return result


def _pod_name(pod: dict) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def _with_logs(text: str, logs: str | None) -> str:
    tail = log_tail(logs)
    if not tail:
        return text
    return text + "; last log lines: " + " | ".join(tail)


def needs_logs(state: dict, pod: dict | None) -> bool:
    """Whether reading this pod's log could explain the node's state (only such pods' logs are fetched)."""
    if pod is None or state.get("done"):
        return False
    kind, _text = pod_problem(pod)
    if kind in ("crash_loop", "terminated"):
        return True
    return kind is None and state.get("node_ready")


def unscheduled_reasons(node: dict, pod_spec: dict) -> list[str]:
    """Why a DaemonSet's pod cannot land on the node (its node selector, its required node affinity, taints it does not
    tolerate); empty when nothing keeps it off."""
    reasons = []
    mismatch = selector_mismatch(node, pod_spec.get("nodeSelector"))
    if mismatch:
        reasons.append("node_selector does not match: needs " + ", ".join(mismatch))
    if not affinity_matches(node, pod_spec.get("affinity")):
        reasons.append("affinity's required node terms do not match the node's labels")
    taints = untolerated_taints(node, pod_spec.get("tolerations") or [])
    if taints:
        reasons.append("taint not tolerated: " + ", ".join(taints) + " (add a toleration)")
    return reasons


def diagnose(state: dict, node: dict | None, pod: dict | None, pod_spec: dict, logs: str | None = None) -> str:
    """One sentence saying why a node is not done, from its state, its plugin pod and that pod's log."""
    name = state["name"]
    if node is None:
        return f"{name}: node not found in the cluster (check the name in expected_gpus or nodes)"
    if not state.get("node_ready"):
        return f"{name}: node is not Ready ({_ready_condition_text(node)})"
    if pod is None:
        reasons = unscheduled_reasons(node, pod_spec)
        if reasons:
            return f"{name}: no device plugin pod on this node: " + "; ".join(reasons)
        return f"{name}: no device plugin pod on this node yet (the DaemonSet has not scheduled one)"
    kind, text = pod_problem(pod)
    pod_ref = f"pod {_pod_name(pod)}"
    if kind == "image_pull":
        return f"{name}: device plugin {pod_ref} cannot start: {text} (check image, registry and image_pull_secrets)"
    if kind in ("crash_loop", "terminated"):
        message = f"{name}: device plugin {pod_ref} is not running: {text}"
        if classify_logs(logs) == "nvml":
            message += "; " + NVML_HINT
        return _with_logs(message, logs)
    if kind is not None:
        return f"{name}: device plugin {pod_ref} is not running: {text}"
    capacity, allocatable, expected = state["capacity"], state["allocatable"], state["expected"]
    resource = state["resource"]
    if capacity == 0:
        found = classify_logs(logs)
        if found == "nvml":
            return _with_logs(f"{name}: node reports no {resource}: {NVML_HINT}", logs)
        if found == "no_devices":
            return _with_logs(f"{name}: node reports no {resource}: {NO_DEVICES_HINT}", logs)
        return _with_logs(f"{name}: {pod_ref} is running but the node reports no {resource} yet", logs)
    if allocatable < capacity:
        return (
            f"{name}: {capacity - allocatable} of {capacity} {resource} unhealthy (allocatable {allocatable} < "
            f"capacity {capacity}); the plugin marks a device unhealthy after a critical Xid error, see the node's "
            "kernel log (dmesg) and nvidia-smi"
        )
    mismatch = resources_mismatch(state)
    if mismatch:
        return (
            f"{name}: node reports {', '.join(mismatch)}: its MIG layout is not the one expected (the gpu_mig "
            "role's layout and the plugin's migStrategy decide these resources), or a GPU is missing"
        )
    if expected is not None and capacity != expected:
        replicas = ""
        if state.get("replicas", 1) > 1:
            replicas = f" = {state['physical_gpus']} GPUs x {state['replicas']} replicas"
        return (
            f"{name}: node reports {capacity} {resource}, expected {expected}{replicas} (a GPU missing from the node, "
            "a wrong expected_gpus count or a different time-slicing config)"
        )
    if state.get("physical_gpus") == 0 and capacity:
        return f"{name}: node reports {capacity} {resource}, expected none"
    return f"{name}: not done (capacity {capacity}, allocatable {allocatable})"
