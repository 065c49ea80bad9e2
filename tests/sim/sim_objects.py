"""Objects the simulator's own tests share (imported by name: a test that imports from `conftest` gets whichever
conftest module pytest loaded last, which depends on the order of the folders it collects)."""

from __future__ import annotations

import copy
from typing import Any

PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"

# The shape of NVIDIA's static manifest (deployments/static/nvidia-device-plugin.yml), trimmed to what matters here.
DAEMONSET: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "nvidia-device-plugin-daemonset", "namespace": "kube-system"},
    "spec": {
        "selector": {"matchLabels": {"name": "nvidia-device-plugin-ds"}},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": {
            "metadata": {"labels": {"name": "nvidia-device-plugin-ds"}},
            "spec": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "priorityClassName": "system-node-critical",
                "containers": [
                    {
                        "name": "nvidia-device-plugin-ctr",
                        "image": PLUGIN_IMAGE,
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}],
                    }
                ],
                "volumes": [{"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}],
            },
        },
    },
}


def daemonset(**template_spec: Any) -> dict[str, Any]:
    """The plugin DaemonSet with extra pod template spec fields."""
    ds = copy.deepcopy(DAEMONSET)
    ds["spec"]["template"]["spec"].update(template_spec)
    return ds


def server_side_apply(apps: Any, body: dict[str, Any], manager: str = "test", **kwargs: Any) -> Any:
    """Server-side apply of a DaemonSet through the kubernetes client's AppsV1Api."""
    return apps.patch_namespaced_daemon_set(
        body["metadata"]["name"],
        body["metadata"]["namespace"],
        body,
        field_manager=manager,
        _content_type="application/apply-patch+yaml",
        **kwargs,
    )
