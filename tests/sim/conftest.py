"""Fixtures for the simulator's own tests: a running SimCluster, a client for it, and kubectl."""

from __future__ import annotations

import copy
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS_DIR = Path(__file__).resolve().parent.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

from kubesim import SimCluster, SimNode

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes Python client is not installed")
from kubernetes import client, config

REPO = TESTS_DIR.parent
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


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    nodes = [
        SimNode("gpu-1", gpus=8, labels={"nvidia.com/gpu.present": "true"}),
        SimNode(
            "gpu-2", gpus=4, labels={"nvidia.com/gpu.present": "true"}, taints=["nvidia.com/gpu=present:NoSchedule"]
        ),
        SimNode("cpu-1", gpus=0),
    ]
    with SimCluster(nodes=nodes, tls=True, token="test-token", capacity_delay=0.1) as sim:
        yield sim


@pytest.fixture
def kubeconfig(cluster: SimCluster, tmp_path: Path) -> str:
    return cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))


@pytest.fixture
def api_client(kubeconfig: str) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(kubeconfig)
    yield api
    api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def apps(api_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


def server_side_apply(apps: client.AppsV1Api, body: dict[str, Any], manager: str = "test", **kwargs: Any) -> Any:
    return apps.patch_namespaced_daemon_set(
        body["metadata"]["name"],
        body["metadata"]["namespace"],
        body,
        field_manager=manager,
        _content_type="application/apply-patch+yaml",
        **kwargs,
    )


@pytest.fixture
def kubectl() -> str:
    path = os.environ.get("KUBECTL") or str(REPO / ".tmp" / "bin" / "kubectl")
    if not os.access(path, os.X_OK):
        path = shutil.which("kubectl") or ""
    if not path:
        pytest.skip("kubectl is not installed: run `make kubectl` (Debian's kubectl into .tmp/bin)")
    return path
