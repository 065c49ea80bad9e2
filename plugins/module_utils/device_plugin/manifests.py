# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: the objects the module applies, rendered as plain dicts (pure).
# The DaemonSet follows NVIDIA's static manifest (deployments/static/nvidia-device-plugin.yml) and adds what that
# manifest lacks: node selection, config wiring and an optional RuntimeClass. With MPS sharing in the config, the MPS
# control daemon runs beside it as NVIDIA's Helm chart runs it (deployments/helm/nvidia-device-plugin, templates
# daemonset-mps-control-daemon.yml and daemonset-device-plugin.yml, v0.20.0): the same image started as
# mps-control-daemon, on nodes labelled nvidia.com/mps.capable=true, sharing the MPS root on the host with the plugin.

from __future__ import annotations

import hashlib

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import (
    image_reference,
    image_version_label,
    runtime_class_name,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import (
    explicit_fail_on_init_error,
    mig_strategy,
    mps_enabled,
    mps_root,
    render_config,
)

POD_LABEL_KEY = "name"
POD_LABEL_VALUE = "nvidia-device-plugin-ds"
POD_SELECTOR = f"{POD_LABEL_KEY}={POD_LABEL_VALUE}"
CONTAINER_NAME = "nvidia-device-plugin-ctr"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "kubegpu.node"
CONFIG_HASH_ANNOTATION = "kubegpu.node/config-sha256"
CONFIG_KEY = "config.yaml"
CONFIG_MOUNT = "/etc/nvidia-device-plugin"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

MPS_POD_LABEL_VALUE = "nvidia-device-plugin-mps-control-daemon"
MPS_POD_SELECTOR = f"{POD_LABEL_KEY}={MPS_POD_LABEL_VALUE}"
MPS_CONTAINER_NAME = "mps-control-daemon-ctr"
# The label GPU feature discovery sets on nodes whose GPUs can be shared through MPS (internal/lm/nvml.go): the
# chart runs the control daemon only there.
MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"
# Where both containers see the MPS root (cmd/mps-control-daemon/mps/root.go: ContainerRoot).
MPS_CONTAINER_ROOT = "/mps"

KIND_PATHS = {
    "DaemonSet": ("apps/v1", "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"),
    "ConfigMap": ("v1", "/api/v1/namespaces/{namespace}/configmaps/{name}"),
    "RuntimeClass": ("node.k8s.io/v1", "/apis/node.k8s.io/v1/runtimeclasses/{name}"),
}


def object_path(obj: dict) -> str:
    meta = obj["metadata"]
    return KIND_PATHS[obj["kind"]][1].format(namespace=meta.get("namespace", ""), name=meta["name"])


def object_ref(obj: dict) -> str:
    meta = obj["metadata"]
    if meta.get("namespace"):
        return f"{obj['kind']} {meta['namespace']}/{meta['name']}"
    return f"{obj['kind']} {meta['name']}"


def _labels(version_label: str) -> dict:
    labels = {
        "app.kubernetes.io/name": "nvidia-device-plugin",
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
    }
    if version_label:
        labels["app.kubernetes.io/version"] = version_label
    return labels


def render_runtime_class(name: str, version_label: str = "") -> dict:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name, "labels": _labels(version_label)},
        "handler": "nvidia",
    }


def render_config_map(params: dict, config_text: str, version_label: str = "") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": params["config_map_name"],
            "namespace": params["namespace"],
            "labels": _labels(version_label),
        },
        "data": {CONFIG_KEY: config_text},
    }


def _config_wiring(params: dict, config_text: str | None) -> tuple:
    """(env, volumes, mounts, template annotations) that hand the config file to a container."""
    if config_text is None:
        return [], [], [], {}
    env = [{"name": "CONFIG_FILE", "value": f"{CONFIG_MOUNT}/{CONFIG_KEY}"}]
    volumes = [{"name": "device-plugin-config", "configMap": {"name": params["config_map_name"]}}]
    mounts = [{"name": "device-plugin-config", "mountPath": CONFIG_MOUNT, "readOnly": True}]
    # The plugin and the MPS daemon read the config only at start; a changed digest rolls their pods.
    digest = hashlib.sha256(config_text.encode("utf-8")).hexdigest()
    return env, volumes, mounts, {CONFIG_HASH_ANNOTATION: digest}


def _mps_volumes(config: dict | None) -> list:
    """The MPS root on the host and the shared memory under it (the chart's mps-root and mps-shm)."""
    root = mps_root(config)
    return [
        {"name": "mps-root", "hostPath": {"path": root, "type": "DirectoryOrCreate"}},
        {"name": "mps-shm", "hostPath": {"path": f"{root.rstrip('/')}/shm"}},
    ]


def _pod_spec(params: dict, containers: list, volumes: list, node_selector: dict) -> dict:
    """What the plugin's and the MPS daemon's pods share: tolerations, priority, node selection, pull secrets."""
    tolerations = [dict(GPU_TOLERATION)]
    for toleration in params.get("tolerations") or []:
        if toleration not in tolerations:
            tolerations.append(toleration)
    pod_spec: dict = {
        "tolerations": tolerations,
        "priorityClassName": params.get("priority_class_name") or "system-node-critical",
        "containers": containers,
        "volumes": volumes,
    }
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if params.get("affinity"):
        pod_spec["affinity"] = params["affinity"]
    if params.get("image_pull_secrets"):
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in params["image_pull_secrets"]]
    runtime_class = runtime_class_name(params.get("runtime_class"))
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    return pod_spec


def _daemonset(params: dict, name: str, pod_label: str, template_meta: dict, pod_spec: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": params["namespace"],
            "labels": _labels(image_version_label(image_reference(params))),
        },
        "spec": {
            "selector": {"matchLabels": {POD_LABEL_KEY: pod_label}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def render_daemonset(params: dict, config_text: str | None = None) -> dict:
    config = params.get("config")
    env = []
    volumes = [
        {
            "name": "kubelet-device-plugins-dir",
            "hostPath": {"path": DEVICE_PLUGIN_DIR, "type": "Directory"},
        }
    ]
    mounts = [{"name": "kubelet-device-plugins-dir", "mountPath": DEVICE_PLUGIN_DIR}]
    template_meta: dict = {"labels": {POD_LABEL_KEY: POD_LABEL_VALUE}}
    if not explicit_fail_on_init_error(config):
        # As NVIDIA's static manifest: a node without usable GPUs keeps a running pod that logs why. Environment
        # variables override the config file, so a failOnInitError set in the config must not be shadowed here.
        env.append({"name": "FAIL_ON_INIT_ERROR", "value": "false"})
    config_env, config_volumes, config_mounts, annotations = _config_wiring(params, config_text)
    env += config_env
    volumes += config_volumes
    mounts += config_mounts
    if annotations:
        template_meta["annotations"] = annotations
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if mig_strategy(config) != "none":
        # As the chart does for a MIG strategy: NVML reads MIG devices' health through the MIG monitor capability,
        # which the toolkit injects for NVIDIA_MIG_MONITOR_DEVICES and which needs CAP_SYS_ADMIN. The API refuses
        # allowPrivilegeEscalation=false together with CAP_SYS_ADMIN.
        env.append({"name": "NVIDIA_MIG_MONITOR_DEVICES", "value": "all"})
        security = {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}
    if mps_enabled(config):
        # The plugin checks the daemon's health through its pipe under the MPS root and its shared memory.
        env.append({"name": "MPS_ROOT", "value": mps_root(config)})
        volumes += _mps_volumes(config)
        mounts += [
            {"name": "mps-shm", "mountPath": "/dev/shm"},
            {"name": "mps-root", "mountPath": MPS_CONTAINER_ROOT},
        ]

    container = {
        "name": CONTAINER_NAME,
        "image": image_reference(params),
        "imagePullPolicy": params.get("image_pull_policy") or "IfNotPresent",
        "env": env,
        "securityContext": security,
        "volumeMounts": mounts,
    }
    if params.get("resources"):
        container["resources"] = params["resources"]
    pod_spec = _pod_spec(params, [container], volumes, dict(params.get("node_selector") or {}))
    return _daemonset(params, params["name"], POD_LABEL_VALUE, template_meta, pod_spec)


def mps_daemonset_name(params: dict) -> str:
    return f"{params['name']}-mps-control-daemon"[:63].rstrip("-.")


def render_mps_daemonset(params: dict, config_text: str) -> dict:
    """NVIDIA's MPS control daemon, as the Helm chart deploys it beside the plugin.

    A privileged init container mounts a tmpfs at <MPS root>/shm on the host (mps-control-daemon mount-shm, with
    bidirectional propagation so the host and the plugin see it); the daemon runs nvidia-cuda-mps-control per shared
    resource, sets the GPUs' compute mode, and needs the host's PID namespace (the chart's mps.enableHostPID default).
    """
    config = params.get("config")
    image = image_reference(params)
    env, config_volumes, config_mounts, annotations = _config_wiring(params, config_text)
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
        *env,
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
    ]
    pull_policy = params.get("image_pull_policy") or "IfNotPresent"
    init = {
        "name": "mps-control-daemon-mounts",
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["mps-control-daemon", "mount-shm"],
        "securityContext": {"privileged": True},
        "volumeMounts": [{"name": "mps-root", "mountPath": MPS_CONTAINER_ROOT, "mountPropagation": "Bidirectional"}],
    }
    container = {
        "name": MPS_CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["mps-control-daemon"],
        "env": env,
        "securityContext": {"privileged": True},
        "volumeMounts": [
            {"name": "mps-shm", "mountPath": "/dev/shm"},
            {"name": "mps-root", "mountPath": MPS_CONTAINER_ROOT},
            *config_mounts,
        ],
    }
    if params.get("resources"):
        container["resources"] = params["resources"]
        init["resources"] = params["resources"]
    node_selector = {MPS_CAPABLE_LABEL: "true", **dict(params.get("node_selector") or {})}
    pod_spec = _pod_spec(params, [container], _mps_volumes(config) + config_volumes, node_selector)
    pod_spec["hostPID"] = True
    pod_spec["initContainers"] = [init]
    template_meta: dict = {"labels": {POD_LABEL_KEY: MPS_POD_LABEL_VALUE}}
    if annotations:
        template_meta["annotations"] = annotations
    return _daemonset(params, mps_daemonset_name(params), MPS_POD_LABEL_VALUE, template_meta, pod_spec)


def render_objects(params: dict) -> list[dict]:
    """Every object for state=present, in the order they must be applied (dependencies first)."""
    version_label = image_version_label(image_reference(params))
    objects = []
    runtime_class = runtime_class_name(params.get("runtime_class"))
    if runtime_class:
        objects.append(render_runtime_class(runtime_class, version_label))
    config_text = None
    if params.get("config") is not None:
        config_text = render_config(params["config"])
        objects.append(render_config_map(params, config_text, version_label))
        if mps_enabled(params["config"]):
            objects.append(render_mps_daemonset(params, config_text))
    # The plugin's DaemonSet comes last: the module waits on it.
    objects.append(render_daemonset(params, config_text))
    return objects


def mps_daemonset_ref(params: dict) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": mps_daemonset_name(params), "namespace": params["namespace"]},
    }


def stale_targets(params: dict) -> list[dict]:
    """Objects of an earlier config that state=present must remove: the MPS control daemon once MPS is off (its
    daemons would keep the GPUs in exclusive-process compute mode)."""
    if mps_enabled(params.get("config")):
        return []
    return [mps_daemonset_ref(params)]


def removal_targets(params: dict) -> list[dict]:
    """Objects state=absent may delete (only those carrying this collection's managed-by label), dependents first."""
    targets = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": params["name"], "namespace": params["namespace"]},
        },
        mps_daemonset_ref(params),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": params["config_map_name"], "namespace": params["namespace"]},
        },
    ]
    runtime_class = runtime_class_name(params.get("runtime_class"))
    if runtime_class:
        targets.append({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": runtime_class}})
    return targets
