# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: the objects the module applies, rendered as plain dicts (pure).
# The DaemonSet follows NVIDIA's static manifest (deployments/static/nvidia-device-plugin.yml) and adds what that
# manifest lacks: node selection, config wiring and an optional RuntimeClass.

from __future__ import annotations

import hashlib

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.args import (
    image_reference,
    image_tag,
    runtime_class_name,
)
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import (
    explicit_fail_on_init_error,
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


def _version_label(image: str) -> str:
    tag = image_tag(image)
    # Label values allow [A-Za-z0-9_.-], at most 63 characters, alphanumeric at both ends.
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "-" for c in tag)[:63].strip("_.-")
    return cleaned


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


def render_daemonset(params: dict, config_text: str | None = None) -> dict:
    image = image_reference(params)
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
    if config_text is not None:
        env.append({"name": "CONFIG_FILE", "value": f"{CONFIG_MOUNT}/{CONFIG_KEY}"})
        volumes.append({"name": "device-plugin-config", "configMap": {"name": params["config_map_name"]}})
        mounts.append({"name": "device-plugin-config", "mountPath": CONFIG_MOUNT, "readOnly": True})
        # The plugin reads its config only at start; a changed digest rolls the pods so they pick the new one up.
        digest = hashlib.sha256(config_text.encode("utf-8")).hexdigest()
        template_meta["annotations"] = {CONFIG_HASH_ANNOTATION: digest}

    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": params.get("image_pull_policy") or "IfNotPresent",
        "env": env,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    if params.get("resources"):
        container["resources"] = params["resources"]

    tolerations = [dict(GPU_TOLERATION)]
    for toleration in params.get("tolerations") or []:
        if toleration not in tolerations:
            tolerations.append(toleration)

    pod_spec: dict = {
        "tolerations": tolerations,
        "priorityClassName": params.get("priority_class_name") or "system-node-critical",
        "containers": [container],
        "volumes": volumes,
    }
    if params.get("node_selector"):
        pod_spec["nodeSelector"] = dict(params["node_selector"])
    if params.get("affinity"):
        pod_spec["affinity"] = params["affinity"]
    if params.get("image_pull_secrets"):
        pod_spec["imagePullSecrets"] = [{"name": secret} for secret in params["image_pull_secrets"]]
    runtime_class = runtime_class_name(params.get("runtime_class"))
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class

    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": params["name"],
            "namespace": params["namespace"],
            "labels": _labels(_version_label(image)),
        },
        "spec": {
            "selector": {"matchLabels": {POD_LABEL_KEY: POD_LABEL_VALUE}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def render_objects(params: dict) -> list[dict]:
    """Every object for state=present, in the order they must be applied (dependencies first)."""
    version_label = _version_label(image_reference(params))
    objects = []
    runtime_class = runtime_class_name(params.get("runtime_class"))
    if runtime_class:
        objects.append(render_runtime_class(runtime_class, version_label))
    config_text = None
    if params.get("config") is not None:
        config_text = render_config(params["config"])
        objects.append(render_config_map(params, config_text, version_label))
    objects.append(render_daemonset(params, config_text))
    return objects


def removal_targets(params: dict) -> list[dict]:
    """Objects state=absent may delete (only those carrying this collection's managed-by label), dependents first."""
    targets = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": params["name"], "namespace": params["namespace"]},
        },
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
