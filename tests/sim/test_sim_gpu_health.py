"""kubesim's additions for GPU health, checked against what the real API server does:
a CRD's API (the Prometheus Operator's ServiceMonitor) exists only once it is installed; Services; DaemonSets that
are not device plugins (the DCGM exporter) run without touching GPU capacity; faults that name a DaemonSet; the
atomic list spec.taints under a JSON patch that tests it first (kubernetes/api core/v1/types.go: NodeSpec.Taints is
`+listType=atomic`)."""

from __future__ import annotations

import json
import subprocess

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubesim import SimCluster, SimNode
from sim_objects import daemonset, server_side_apply

EXPORTER = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "dcgm-exporter", "namespace": "kube-system"},
    "spec": {
        "selector": {"matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}},
        "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "dcgm-exporter"}},
            "spec": {
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2"}],
                "volumes": [{"name": "pod-gpu-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}],
            },
        },
    },
}


def _discovery(kubectl: str, kubeconfig: str, path: str) -> tuple[int, dict]:
    """GET a discovery path with kubectl (a real client): (0, document) or (1, {}) when the server answers 404."""
    done = subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "get", "--raw", path], capture_output=True, text=True, check=False
    )
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}


def test_a_crds_api_appears_only_once_the_crd_is_installed(
    cluster: SimCluster, api_client: client.ApiClient, kubectl: str, kubeconfig: str
):
    groups = [g["name"] for g in _discovery(kubectl, kubeconfig, "/apis")[1]["groups"]]
    assert "monitoring.coreos.com" not in groups
    assert _discovery(kubectl, kubeconfig, "/apis/monitoring.coreos.com/v1")[0] != 0
    custom = client.CustomObjectsApi(api_client)
    with pytest.raises(ApiException) as missing:
        custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", "kube-system", "servicemonitors")
    assert missing.value.status == 404
    cluster.install_crd("servicemonitors")
    groups = [g["name"] for g in _discovery(kubectl, kubeconfig, "/apis")[1]["groups"]]
    assert "monitoring.coreos.com" in groups
    resources = _discovery(kubectl, kubeconfig, "/apis/monitoring.coreos.com/v1")[1]["resources"]
    assert [r["kind"] for r in resources] == ["ServiceMonitor"]
    body = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "dcgm-exporter", "namespace": "kube-system"},
        "spec": {"endpoints": [{"port": "metrics"}], "selector": {"matchLabels": {"a": "b"}}},
    }
    custom.create_namespaced_custom_object("monitoring.coreos.com", "v1", "kube-system", "servicemonitors", body)
    assert cluster.get_object("servicemonitor", "dcgm-exporter", "kube-system")["spec"]["endpoints"] == [
        {"port": "metrics"}
    ]


def test_services_are_served(core: client.CoreV1Api):
    body = {
        "metadata": {"name": "dcgm-exporter", "namespace": "kube-system"},
        "spec": {"selector": {"app": "x"}, "ports": [{"name": "metrics", "port": 9400}]},
    }
    core.create_namespaced_service("kube-system", body)
    assert core.read_namespaced_service("dcgm-exporter", "kube-system").spec.ports[0].port == 9400


def test_a_daemonset_that_is_no_device_plugin_runs_without_reporting_capacity(
    cluster: SimCluster, apps: client.AppsV1Api, core: client.CoreV1Api
):
    server_side_apply(apps, daemonset())
    cluster.wait_for(lambda: cluster.get_object("node", "gpu-1")["status"]["allocatable"].get("nvidia.com/gpu") == "8")
    server_side_apply(apps, EXPORTER)

    def ready() -> list[str]:
        pods = core.list_namespaced_pod("kube-system", label_selector="app.kubernetes.io/name=dcgm-exporter").items
        return sorted(
            p.spec.node_name
            for p in pods
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        )

    assert cluster.wait_for(lambda: ready() == ["gpu-1", "gpu-2"])
    # Deleting the exporter leaves the plugin's capacity alone.
    apps.delete_namespaced_daemon_set("dcgm-exporter", "kube-system")
    cluster.settle()
    assert cluster.get_object("node", "gpu-1")["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_a_fault_that_names_a_daemonset_reaches_only_its_pods(
    cluster: SimCluster, apps: client.AppsV1Api, core: client.CoreV1Api
):
    cluster.set_fault("gpu-1", "image_pull", daemonset="dcgm-exporter")
    server_side_apply(apps, daemonset())
    server_side_apply(apps, EXPORTER)

    def waiting(label: str) -> str:
        pods = core.list_namespaced_pod("kube-system", field_selector="spec.nodeName=gpu-1", label_selector=label).items
        if not pods or not pods[0].status.container_statuses:
            return ""
        state = pods[0].status.container_statuses[0].state
        return state.waiting.reason if state.waiting else "running"

    assert cluster.wait_for(lambda: waiting("app.kubernetes.io/name=dcgm-exporter") == "ImagePullBackOff")
    assert cluster.wait_for(lambda: waiting("name=nvidia-device-plugin-ds") == "running")
    assert cluster.wait_for(
        lambda: cluster.get_object("node", "gpu-1")["status"]["capacity"].get("nvidia.com/gpu") == "8"
    )


def test_an_unhealthy_gpu_logs_the_xid_given():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=4, labels={"nvidia.com/gpu.present": "true"})], tls=False) as sim:
        sim.set_fault("gpu-1", "unhealthy", devices=1, xid=48)
        sim.create_object(daemonset())
        assert sim.wait_for(
            lambda: sim.get_object("node", "gpu-1")["status"]["allocatable"].get("nvidia.com/gpu") == "3"
        )
        pod = sim.list_objects("pods", "kube-system")[0]["metadata"]["name"]
        assert any("Xid=48" in line for line in sim.pod_log("kube-system", pod))


def test_taints_are_an_atomic_list_under_a_tested_json_patch(
    cluster: SimCluster, core: client.CoreV1Api, kubectl, kubeconfig
):
    """What the health marks rely on: a JSON patch that first tests the taints it read fails (422) when another writer
    changed them in between, and otherwise replaces the list whole, leaving every other taint as written."""
    node = core.read_node("gpu-2")
    read = [t.to_dict() for t in node.spec.taints]
    read = [{k: v for k, v in t.items() if v is not None} for t in read]
    # Another writer adds a taint between our read and our patch (kubectl taint, a real client).
    subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "taint", "node", "gpu-2", "example.com/maintenance=soon:NoSchedule"],
        check=True,
        capture_output=True,
    )
    ours = {"key": "kubegpu.node/gpu-unhealthy", "value": "failed", "effect": "NoSchedule"}
    patch = [
        {"op": "test", "path": "/spec/taints", "value": read},
        {"op": "replace", "path": "/spec/taints", "value": [*read, ours]},
    ]
    with pytest.raises(ApiException) as stale:
        core.patch_node("gpu-2", patch, field_manager="kubegpu.node-gpu-health")
    assert stale.value.status == 422
    now = [{k: v for k, v in t.to_dict().items() if v is not None} for t in core.read_node("gpu-2").spec.taints]
    patch = [
        {"op": "test", "path": "/spec/taints", "value": now},
        {"op": "replace", "path": "/spec/taints", "value": [*now, ours]},
    ]
    core.patch_node("gpu-2", patch, field_manager="kubegpu.node-gpu-health")
    keys = [t["key"] for t in cluster.get_object("node", "gpu-2")["spec"]["taints"]]
    assert sorted(keys) == ["example.com/maintenance", "kubegpu.node/gpu-unhealthy", "nvidia.com/gpu"]
    assert keys[-1] == "kubegpu.node/gpu-unhealthy"
    managed = cluster.get_object("node", "gpu-2")["metadata"]["managedFields"]
    assert any(m["manager"] == "kubegpu.node-gpu-health" and m["operation"] == "Update" for m in managed)
    assert json.dumps(managed)  # serialisable as the server returns it
