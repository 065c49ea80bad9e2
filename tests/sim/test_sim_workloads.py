"""The simulator's scheduler, run-to-completion pods, evictions with PodDisruptionBudgets and node reboots.

site.yml's drain window and GPU validation rely on these; each test asserts what a real cluster would show.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubesim import SimCluster
from sim_objects import DAEMONSET


def _capacity(cluster: SimCluster) -> None:
    """Deploy the plugin and wait until both GPU nodes advertise their GPUs."""
    cluster.create_object(json.loads(json.dumps(DAEMONSET)))
    assert cluster.wait_for(
        lambda: all(
            (cluster.get_object("node", n) or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu") == g
            for n, g in (("gpu-1", "8"), ("gpu-2", "4"))
        )
    )


def _pod(name: str, gpus: int = 0, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox", "command": ["sleep", "3600"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", **spec.pop("metadata", {})},
        "spec": {"containers": [container], **spec},
    }


def _phase(cluster: SimCluster, name: str) -> tuple[str | None, str]:
    pod = cluster.get_object("pod", name, "default") or {}
    return pod.get("spec", {}).get("nodeName"), pod.get("status", {}).get("phase", "")


def _events(cluster: SimCluster, name: str, reason: str) -> list[str]:
    return [
        e["message"]
        for e in cluster.list_objects("events", "default")
        if e["involvedObject"]["name"] == name and e["reason"] == reason
    ]


def test_surplus_gpu_requests_stay_pending_with_the_schedulers_reason(cluster: SimCluster) -> None:
    _capacity(cluster)
    pin = {"nodeSelector": {"kubernetes.io/hostname": "gpu-1"}}
    cluster.create_object(_pod("holder", gpus=8, **pin))
    assert cluster.wait_for(lambda: _phase(cluster, "holder") == ("gpu-1", "Running"))
    cluster.create_object(_pod("surplus", gpus=1, **pin))
    assert cluster.wait_for(lambda: _events(cluster, "surplus", "FailedScheduling"))
    message = _events(cluster, "surplus", "FailedScheduling")[0]
    assert message.startswith("0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match")
    pod = cluster.get_object("pod", "surplus", "default")
    assert pod["status"]["phase"] == "Pending" and "nodeName" not in pod["spec"]
    assert pod["status"]["conditions"][0]["reason"] == "Unschedulable"
    # The GPUs come free: the scheduler retries and binds the pod.
    cluster.delete_object("pod", "holder", "default")
    assert cluster.wait_for(lambda: _phase(cluster, "surplus") == ("gpu-1", "Running"))


def test_taints_cordons_and_missing_capacity_keep_pods_off_nodes(cluster: SimCluster, core: client.CoreV1Api) -> None:
    _capacity(cluster)
    core.patch_node("gpu-1", {"spec": {"unschedulable": True}})  # a cordon, as kubectl and k8s_drain send it
    cluster.create_object(_pod("wants-one", gpus=1))
    assert cluster.wait_for(lambda: _events(cluster, "wants-one", "FailedScheduling"))
    message = _events(cluster, "wants-one", "FailedScheduling")[0]
    # gpu-1 is cordoned, gpu-2 tainted for GPU pods only, cpu-1 has no GPU.
    assert "1 Insufficient nvidia.com/gpu" in message
    assert "1 node(s) were unschedulable" in message
    assert "1 node(s) had untolerated taint {nvidia.com/gpu: present}" in message
    tolerant = _pod(
        "tolerant", gpus=1, tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    )
    cluster.create_object(tolerant)
    assert cluster.wait_for(lambda: _phase(cluster, "tolerant") == ("gpu-2", "Running"))


def test_run_to_completion_pods_print_their_gpus(cluster: SimCluster, core: client.CoreV1Api) -> None:
    _capacity(cluster)
    smi = {"command": ["nvidia-smi", "-L"]}
    cluster.create_object(_pod("two", gpus=2, restartPolicy="Never", container=smi))
    cluster.create_object(_pod("none", restartPolicy="Never", container=smi))
    assert cluster.wait_for(lambda: _phase(cluster, "two")[1] == "Succeeded")
    assert cluster.wait_for(lambda: _phase(cluster, "none")[1] == "Failed")
    lines = core.read_namespaced_pod_log("two", "default").splitlines()
    assert [line.split(" (UUID: ")[0] for line in lines] == [
        "GPU 0: NVIDIA A100-SXM4-80GB",
        "GPU 1: NVIDIA A100-SXM4-80GB",
    ]
    assert core.read_namespaced_pod_log("none", "default").strip() == "No devices were found"
    status = core.read_namespaced_pod("none", "default").status
    assert status.container_statuses[0].state.terminated.exit_code == 6


def _budget(min_available: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "train", "namespace": "default"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "train"}}},
    }


def _evict(core: client.CoreV1Api, name: str) -> None:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default"))
    core.create_namespaced_pod_eviction(name, "default", body)


def test_eviction_honours_the_disruption_budget(cluster: SimCluster, core: client.CoreV1Api) -> None:
    for name in ("train-a", "train-b"):
        cluster.create_object(_pod(name, metadata={"labels": {"app": "train"}}, nodeName="cpu-1"))
    assert cluster.wait_for(lambda: all(_phase(cluster, n)[1] == "Running" for n in ("train-a", "train-b")))
    cluster.create_object(_budget(1))
    assert cluster.wait_for(
        lambda: (cluster.get_object("pdb", "train", "default") or {}).get("status", {}).get("disruptionsAllowed") == 1
    )
    _evict(core, "train-a")
    assert cluster.get_object("pod", "train-a", "default") is None
    with pytest.raises(ApiException) as refused:
        _evict(core, "train-b")
    assert refused.value.status == 429
    body = json.loads(refused.value.body)
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert (
        body["details"]["causes"][0]["message"]
        == "The disruption budget train needs 1 healthy pods and has 1 currently"
    )
    assert cluster.get_object("pod", "train-b", "default") is not None


def test_pods_on_a_node_by_field_selector(cluster: SimCluster, core: client.CoreV1Api) -> None:
    cluster.create_object(_pod("here", nodeName="cpu-1"))
    cluster.create_object(_pod("there", nodeName="gpu-1"))
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=cpu-1").items
    assert [p.metadata.name for p in pods] == ["here"]


def test_a_rebooted_node_is_not_ready_then_ready_with_a_new_boot_id(cluster: SimCluster) -> None:
    before = cluster.get_object("node", "gpu-1")["status"]["nodeInfo"]["bootID"]

    def ready() -> str:
        node = cluster.get_object("node", "gpu-1")
        return next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")

    started = time.monotonic()
    boot_id = cluster.reboot_node("gpu-1", down_seconds=0.5)
    assert boot_id != before
    assert cluster.wait_for(lambda: ready() == "Unknown", timeout=2)
    assert cluster.wait_for(lambda: ready() == "True", timeout=5)
    assert time.monotonic() - started >= 0.5
    assert cluster.get_object("node", "gpu-1")["status"]["nodeInfo"]["bootID"] == boot_id


def _kubectl(kubectl: str, kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_kubectl_drain_waits_for_the_budget_then_uncordon(cluster: SimCluster, kubectl: str, kubeconfig: str) -> None:
    owner = {
        "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train", "uid": "u1", "controller": True}
        ]
    }
    cluster.create_object(_pod("train-a", metadata={"labels": {"app": "train"}, **owner}, nodeName="gpu-1"))
    cluster.create_object(_pod("other", metadata=owner, nodeName="gpu-2"))
    assert cluster.wait_for(lambda: _phase(cluster, "train-a")[1] == "Running")
    cluster.create_object(_budget(1))

    blocked = _kubectl(kubectl, kubeconfig, "drain", "gpu-1", "--ignore-daemonsets", "--timeout=3s")
    assert blocked.returncode != 0
    assert "Cannot evict pod as it would violate the pod's disruption budget" in blocked.stderr
    assert "SchedulingDisabled" in _kubectl(kubectl, kubeconfig, "get", "node", "gpu-1").stdout
    assert cluster.get_object("pod", "train-a", "default") is not None

    cluster.delete_object("pdb", "train", "default")
    drained = _kubectl(kubectl, kubeconfig, "drain", "gpu-1", "--ignore-daemonsets", "--timeout=20s")
    assert drained.returncode == 0, drained.stderr
    assert "pod/train-a evicted" in drained.stdout and "node/gpu-1 drained" in drained.stdout
    assert cluster.get_object("pod", "train-a", "default") is None
    assert cluster.get_object("pod", "other", "default") is not None  # another node's pod stays
    assert cluster.request_counts()["by_verb_resource"].get(("create", "pods/eviction"), 0) >= 1

    assert _kubectl(kubectl, kubeconfig, "uncordon", "gpu-1").returncode == 0
    assert not cluster.get_object("node", "gpu-1")["spec"].get("unschedulable")
