# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.dcgm_exporter: the objects it applies and, per node, whether the exporter runs there and why
# not (pure: plain dicts in, plain dicts out).
#
# Facts from NVIDIA/dcgm-exporter (read at commit d5e5f51, release 4.8.2; not copied): the image
# nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless (DCGM 4.5.3, exporter 4.8.2), metrics on port 9400 named
# "metrics" (DCGM_EXPORTER_LISTEN), DCGM_EXPORTER_KUBERNETES=true with the kubelet's pod-resources socket folder
# /var/lib/kubelet/pod-resources mounted read-only so that metrics carry the pod, namespace and container of the GPU,
# NODE_NAME from spec.nodeName, root with SYS_ADMIN for the profiling metrics (DCGM_FI_PROF_*), every other capability
# dropped and no privilege escalation, /health for the probes, system-node-critical priority, a ServiceMonitor
# (monitoring.coreos.com/v1) scraping the "metrics" port at /metrics (dcgm-exporter.yaml, service-monitor.yaml,
# deployment/values.yaml and deployment/templates/ of the Helm chart).

from __future__ import annotations

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import image_of, image_version_label
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.readiness import (
    node_is_ready,
    node_name,
    pod_problem,
    unscheduled_reasons,
)
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health.marks import TAINT_KEY

DEFAULT_REGISTRY = "nvcr.io/nvidia/k8s"
IMAGE_REPOSITORY = "dcgm-exporter"
DEFAULT_VERSION = "4.5.3-4.8.2-distroless"
DEFAULT_NAME = "dcgm-exporter"
DEFAULT_NAMESPACE = "kube-system"
DEFAULT_PORT = 9400
DEFAULT_FIELD_MANAGER = "kubegpu.node-dcgm-exporter"
DEFAULT_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
POD_RESOURCES = "/var/lib/kubelet/pod-resources"
NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "kubegpu.node"
SERVICE_MONITOR_API = "monitoring.coreos.com/v1"
CONTAINER = "exporter"
# It runs where the GPUs are, also on a node this collection tainted for its GPU health: a sick GPU is the one whose
# metrics matter most.
DEFAULT_TOLERATIONS = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
)

PATHS = {
    "DaemonSet": "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}",
    "Service": "/api/v1/namespaces/{namespace}/services/{name}",
    "ServiceMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{namespace}/servicemonitors/{name}",
}


def object_path(obj: dict) -> str:
    meta = obj["metadata"]
    return PATHS[obj["kind"]].format(namespace=meta["namespace"], name=meta["name"])


def image_reference(params: dict) -> str:
    return image_of(params, DEFAULT_REGISTRY, IMAGE_REPOSITORY, DEFAULT_VERSION)


def selector_labels(params: dict) -> dict:
    # The selector of a DaemonSet cannot change: it names the exporter and this instance only, never the version.
    return {NAME_LABEL: IMAGE_REPOSITORY, "app.kubernetes.io/instance": params["name"]}


def _labels(params: dict) -> dict:
    labels = dict(selector_labels(params))
    labels[MANAGED_BY_LABEL] = MANAGED_BY_VALUE
    version = image_version_label(image_reference(params))
    if version:
        labels["app.kubernetes.io/version"] = version
    return labels


def render_daemonset(params: dict) -> dict:
    port = int(params["port"])
    security = {
        "runAsNonRoot": False,
        "runAsUser": 0,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    if params.get("profiling_metrics", True):
        security["capabilities"]["add"] = ["SYS_ADMIN"]
    probe = {"httpGet": {"path": "/health", "port": port}, "initialDelaySeconds": 45, "periodSeconds": 5}
    container = {
        "name": CONTAINER,
        "image": image_reference(params),
        "imagePullPolicy": params.get("image_pull_policy") or "IfNotPresent",
        "env": [
            {"name": "DCGM_EXPORTER_LISTEN", "value": f":{port}"},
            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "ports": [{"name": "metrics", "containerPort": port}],
        "securityContext": security,
        "volumeMounts": [{"name": "pod-gpu-resources", "mountPath": POD_RESOURCES, "readOnly": True}],
        "readinessProbe": probe,
        "livenessProbe": probe,
        "resources": params.get("resources")
        or {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "200m", "memory": "512Mi"}},
    }
    tolerations = [dict(t) for t in DEFAULT_TOLERATIONS]
    tolerations += [t for t in params.get("tolerations") or [] if t not in tolerations]
    spec = {
        "automountServiceAccountToken": False,
        "priorityClassName": params.get("priority_class_name") or "system-node-critical",
        "tolerations": tolerations,
        "containers": [container],
        "volumes": [{"name": "pod-gpu-resources", "hostPath": {"path": POD_RESOURCES}}],
    }
    node_selector = params.get("node_selector")
    if node_selector is None:
        node_selector = DEFAULT_NODE_SELECTOR
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if params.get("runtime_class"):
        spec["runtimeClassName"] = params["runtime_class"]
    if params.get("image_pull_secrets"):
        spec["imagePullSecrets"] = [{"name": name} for name in params["image_pull_secrets"]]
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": params["name"], "namespace": params["namespace"], "labels": _labels(params)},
        "spec": {
            "selector": {"matchLabels": selector_labels(params)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": selector_labels(params)}, "spec": spec},
        },
    }


def render_service(params: dict) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": params["name"], "namespace": params["namespace"], "labels": _labels(params)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(params),
            "ports": [{"name": "metrics", "port": int(params["port"]), "targetPort": "metrics", "protocol": "TCP"}],
        },
    }


def render_service_monitor(params: dict) -> dict:
    labels = dict(_labels(params))
    labels.update(params.get("service_monitor_labels") or {})
    return {
        "apiVersion": SERVICE_MONITOR_API,
        "kind": "ServiceMonitor",
        "metadata": {"name": params["name"], "namespace": params["namespace"], "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector_labels(params)},
            "namespaceSelector": {"matchNames": [params["namespace"]]},
            "endpoints": [
                {"port": "metrics", "path": "/metrics", "interval": params.get("service_monitor_interval") or "15s"}
            ],
        },
    }


def removal_target(kind: str, params: dict) -> dict:
    api = {"DaemonSet": "apps/v1", "Service": "v1", "ServiceMonitor": SERVICE_MONITOR_API}[kind]
    return {"apiVersion": api, "kind": kind, "metadata": {"name": params["name"], "namespace": params["namespace"]}}


# ----- readiness, per node -----------------------------------------------------------------------------------------


def _pod_ready(pod: dict) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _current(pod: dict, generation) -> bool:
    """Whether the pod runs the DaemonSet's current template (the DaemonSet controller's pod-template-generation)."""
    label = ((pod.get("metadata") or {}).get("labels") or {}).get("pod-template-generation")
    return label is None or generation is None or str(label) == str(generation)


def node_states(nodes: list, pods: list, pod_spec: dict, generation, names=None) -> dict:
    """Per node the wait covers: ``{"ready": bool, "reason": str}``. The covered nodes are ``names`` (every one must
    run the exporter), else every node the DaemonSet would run on (node selector, affinity, tolerations)."""
    by_name = {node_name(n): n for n in nodes}
    by_node: dict = {}
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        target = (pod.get("spec") or {}).get("nodeName")
        if target:
            by_node.setdefault(target, []).append(pod)
    if names is None:
        names = sorted(name for name, node in by_name.items() if not unscheduled_reasons(node, pod_spec))
    states = {}
    for name in names:
        states[name] = node_state(by_name.get(name), name, by_node.get(name) or [], pod_spec, generation)
    return states


def node_state(node: dict | None, name: str, pods: list, pod_spec: dict, generation) -> dict:
    if node is None:
        return {"ready": False, "reason": "node not found in the cluster"}
    current = [p for p in pods if _current(p, generation)]
    if any(_pod_ready(p) for p in current):
        return {"ready": True, "reason": ""}
    if not node_is_ready(node):
        return {"ready": False, "reason": "the node is not Ready"}
    if not pods:
        reasons = unscheduled_reasons(node, pod_spec)
        if reasons:
            return {"ready": False, "reason": "no exporter pod on this node: " + "; ".join(reasons)}
        return {"ready": False, "reason": "no exporter pod on this node yet (the DaemonSet has not scheduled one)"}
    pod = (current or pods)[0]
    ref = f"pod {(pod.get('metadata') or {}).get('name', '')}"
    if not current:
        return {"ready": False, "reason": f"{ref} still runs the previous template (rolling update under way)"}
    kind, text = pod_problem(pod)
    if kind == "image_pull":
        return {"ready": False, "reason": f"{ref} cannot start: {text} (check image, registry and image_pull_secrets)"}
    if kind is not None:
        return {"ready": False, "reason": f"{ref} is not running: {text}"}
    return {
        "ready": False,
        "reason": f"{ref} runs but is not Ready (its /health answers no: DCGM cannot reach the GPUs; check the node's "
        "driver and that the nvidia runtime, or runtime_class, gives the pod the GPUs)",
    }
