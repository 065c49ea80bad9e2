"""The simulated cluster: plugin pods placed like the DaemonSet controller would, capacity, faults, accounting."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubesim import FAULTS, SimCluster, SimNode
from kubesim.resources import BY_PLURAL
from sim_objects import DAEMONSET, PLUGIN_IMAGE, daemonset, server_side_apply

GPU = "nvidia.com/gpu"


def _gpu(cluster: SimCluster, node: str, field: str = "capacity", resource: str = GPU) -> str | None:
    obj = cluster.get_object("node", node) or {}
    return obj.get("status", {}).get(field, {}).get(resource)


def _pod_on(core: client.CoreV1Api, node: str) -> Any:
    pods = core.list_namespaced_pod("kube-system", field_selector=f"spec.nodeName={node}").items
    return pods[0] if pods else None


def _plugin_config(replicas: int, rename: bool = False) -> str:
    return yaml.safe_dump(
        {
            "version": "v1",
            "flags": {"migStrategy": "none"},
            "sharing": {"timeSlicing": {"renameByDefault": rename, "resources": [{"name": GPU, "replicas": replicas}]}},
        }
    )


def _with_config(core: client.CoreV1Api, text: str) -> dict[str, Any]:
    core.create_namespaced_config_map(
        "kube-system", {"metadata": {"name": "nvidia-plugin-config"}, "data": {"config.yaml": text}}
    )
    ds = daemonset()
    spec = ds["spec"]["template"]["spec"]
    spec["containers"][0]["env"] = [{"name": "CONFIG_FILE", "value": "/config/config.yaml"}]
    spec["containers"][0]["volumeMounts"].append({"name": "config", "mountPath": "/config"})
    spec["volumes"].append({"name": "config", "configMap": {"name": "nvidia-plugin-config"}})
    return ds


def test_capacity_appears_where_the_plugin_runs(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    assert _gpu(cluster, "gpu-1") is None  # nothing before the plugin
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1") == "8" and _gpu(cluster, "gpu-2") == "4")
    assert _gpu(cluster, "gpu-2", "allocatable") == "4"
    cluster.settle()
    assert _gpu(cluster, "cpu-1") is None  # the plugin runs there but finds no GPU
    cpu_pod = _pod_on(core, "cpu-1")
    assert cpu_pod.status.phase == "Running"
    assert "No devices found. Waiting indefinitely." in cluster.pod_log("kube-system", cpu_pod.metadata.name)[-1]
    assert cluster.wait_for(
        lambda: (
            apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").status.number_ready == 3
        )
    )
    status = apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").status
    assert (
        status.desired_number_scheduled,
        status.current_number_scheduled,
        status.number_available,
        status.updated_number_scheduled,
        status.observed_generation,
    ) == (3, 3, 3, 3, 1)
    assert cluster.capacity_times().keys() == {"gpu-1", "gpu-2"}


def test_taints_selectors_and_affinity_decide_placement(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    no_toleration = daemonset(tolerations=[])
    server_side_apply(apps, no_toleration)
    cluster.settle()
    assert cluster.wait_for(lambda: len(core.list_namespaced_pod("kube-system").items) == 2)
    assert _pod_on(core, "gpu-2") is None  # tainted nvidia.com/gpu:NoSchedule

    selected = daemonset(nodeSelector={"nvidia.com/gpu.present": "true"})
    server_side_apply(apps, selected, force=True)
    assert cluster.wait_for(
        lambda: sorted(p.spec.node_name for p in core.list_namespaced_pod("kube-system").items) == ["gpu-1", "gpu-2"]
    )

    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-1"]},
                            {"key": "nvidia.com/gpu.present", "operator": "Exists"},
                        ]
                    }
                ]
            }
        }
    }
    server_side_apply(apps, daemonset(affinity=affinity), force=True)
    assert cluster.wait_for(
        lambda: [p.spec.node_name for p in core.list_namespaced_pod("kube-system").items] == ["gpu-2"]
    )
    status = apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").status
    assert cluster.wait_for(
        lambda: (
            apps.read_namespaced_daemon_set(
                "nvidia-device-plugin-daemonset", "kube-system"
            ).status.desired_number_scheduled
            == 1
        )
    ), status


def test_labelling_a_node_later_brings_the_plugin_to_it(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    cluster.add_node(SimNode("gpu-late", gpus=2))
    server_side_apply(apps, daemonset(nodeSelector={"nvidia.com/gpu.present": "true"}))
    cluster.settle()
    assert _pod_on(core, "gpu-late") is None
    core.patch_node("gpu-late", {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-late") == "2")


def test_time_slicing_replicas_multiply_capacity(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    server_side_apply(apps, _with_config(core, _plugin_config(4)))
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1") == "32" and _gpu(cluster, "gpu-2") == "16")


def test_rename_by_default_advertises_shared_resource(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    server_side_apply(apps, _with_config(core, _plugin_config(2, rename=True)))
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1", resource="nvidia.com/gpu.shared") == "16")
    assert _gpu(cluster, "gpu-1") is None


def test_missing_runtime_class_blocks_the_pods(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api, api_client: client.ApiClient
) -> None:
    server_side_apply(apps, daemonset(runtimeClassName="nvidia"))
    cluster.settle()
    assert core.list_namespaced_pod("kube-system").items == []
    events = core.list_namespaced_event("kube-system", field_selector="reason=FailedCreate").items
    assert 'RuntimeClass "nvidia" not found' in events[0].message
    node_api = client.NodeV1Api(api_client)
    node_api.create_runtime_class(
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "nvidia"}, "handler": "nvidia"}
    )
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1") == "8")


def test_missing_config_map_keeps_the_pod_creating(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    ds = _with_config(core, _plugin_config(2))
    core.delete_namespaced_config_map("nvidia-plugin-config", "kube-system")
    server_side_apply(apps, ds)
    assert cluster.wait_for(
        lambda: _pod_on(core, "gpu-1") is not None and _pod_on(core, "gpu-1").status.container_statuses is not None
    )
    waiting = _pod_on(core, "gpu-1").status.container_statuses[0].state.waiting
    assert waiting.reason == "ContainerCreating"


@pytest.mark.parametrize("fault", ["nvml", "no_devices", "never_reports"])
def test_faults_where_the_pod_runs_but_no_capacity_appears(fault: str) -> None:
    nodes = [SimNode("gpu-1", gpus=8, faults=[fault]), SimNode("gpu-2", gpus=8)]
    with SimCluster(nodes, tls=False, capacity_delay=0.05) as sim:
        sim.api.apply(BY_PLURAL["daemonsets"], "kube-system", DAEMONSET["metadata"]["name"], DAEMONSET, "test", True)
        assert sim.wait_for(lambda: _gpu(sim, "gpu-2") == "8")
        time.sleep(0.2)
        assert _gpu(sim, "gpu-1") is None
        pod = next(p for p in sim.list_objects("pods", "kube-system") if p["spec"]["nodeName"] == "gpu-1")
        assert pod["status"]["phase"] == "Running"
        log = "\n".join(sim.pod_log("kube-system", pod["metadata"]["name"]))
        if fault == "nvml":
            assert "Failed to initialize NVML: could not load NVML library." in log
            assert "did you set the docker default runtime to `nvidia`?" in log
        elif fault == "no_devices":
            assert log.endswith("No devices found. Waiting indefinitely.")
        else:
            # The plugin registered fine; the node's status simply never shows it.
            assert "Registered device plugin for 'nvidia.com/gpu' with Kubelet" in log


def test_unhealthy_devices_lower_allocatable(cluster: SimCluster, apps: client.AppsV1Api) -> None:
    cluster.set_fault("gpu-1", "unhealthy", devices=2)
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1") == "8" and _gpu(cluster, "gpu-1", "allocatable") == "6")


def test_not_ready_node(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    cluster.set_fault("gpu-1", "not_ready")
    cluster.settle()
    node = core.read_node("gpu-1")
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "Unknown"
    assert any(t.key == "node.kubernetes.io/unreachable" for t in node.spec.taints)
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-2") == "4")
    # Like the real DaemonSet controller: no new pod on a node tainted unreachable:NoSchedule.
    assert _pod_on(core, "gpu-1") is None
    assert (
        apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").status.desired_number_scheduled
        == 2
    )
    cluster.clear_fault("gpu-1")
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1") == "8")
    assert next(c for c in core.read_node("gpu-1").status.conditions if c.type == "Ready").status == "True"


def test_image_pull_failure(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    cluster.set_fault("gpu-1", "image_pull")
    server_side_apply(apps, DAEMONSET)

    def backing_off() -> bool:
        pod = _pod_on(core, "gpu-1")
        statuses = pod.status.container_statuses if pod else None
        return bool(statuses) and statuses[0].state.waiting.reason == "ImagePullBackOff"

    assert cluster.wait_for(backing_off)
    pod = _pod_on(core, "gpu-1")
    assert pod.status.phase == "Pending"
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod_log(pod.metadata.name, "kube-system")
    assert caught.value.status == 400 and "waiting to start" in json.loads(caught.value.body)["message"]
    events = core.list_namespaced_event("kube-system", field_selector=f"involvedObject.name={pod.metadata.name}")
    assert PLUGIN_IMAGE in events.items[0].message


def test_crash_loop(cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    cluster.set_fault("gpu-1", "crash_loop")
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(
        lambda: (
            _pod_on(core, "gpu-1") is not None
            and (_pod_on(core, "gpu-1").status.container_statuses or [None])[0] is not None
            and _pod_on(core, "gpu-1").status.container_statuses[0].restart_count >= 2
        )
    )
    status = _pod_on(core, "gpu-1").status.container_statuses[0]
    assert status.state.waiting.reason == "CrashLoopBackOff"
    assert status.last_state.terminated.exit_code == 1
    log = core.read_namespaced_pod_log(_pod_on(core, "gpu-1").metadata.name, "kube-system", previous=True, tail_lines=1)
    assert "nvml init failed: ERROR_LIBRARY_NOT_FOUND" in log
    assert _gpu(cluster, "gpu-1") is None
    ds = apps.read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "kube-system").status
    assert ds.number_unavailable >= 1


def test_faults_set_and_cleared_at_run_time(
    cluster: SimCluster, core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    server_side_apply(apps, DAEMONSET)
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1", "allocatable") == "8")
    cluster.set_fault("gpu-1", "nvml")
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1", "allocatable") == "0")
    pod = _pod_on(core, "gpu-1")
    assert cluster.wait_for(
        lambda: "Failed to initialize NVML" in "".join(cluster.pod_log("kube-system", pod.metadata.name))
    )
    cluster.clear_fault("gpu-1", "nvml")
    assert cluster.wait_for(lambda: _gpu(cluster, "gpu-1", "allocatable") == "8")
    with pytest.raises(ValueError):
        cluster.set_fault("gpu-1", "no-such-fault")
    assert set(FAULTS) == {
        "nvml",
        "no_devices",
        "unhealthy",
        "never_reports",
        "not_ready",
        "image_pull",
        "crash_loop",
        "mps_daemon_fails",
    }


def test_capacity_spread_over_a_window() -> None:
    nodes = [SimNode(f"gpu-node-{i}", gpus=1) for i in range(1, 11)]
    with SimCluster(nodes, tls=False, capacity_delay=0.0, capacity_spread=0.6) as sim:
        sim.api.apply(BY_PLURAL["daemonsets"], "kube-system", DAEMONSET["metadata"]["name"], DAEMONSET, "t", True)
        assert sim.wait_for(lambda: len(sim.capacity_times()) == 10)
        times = sim.capacity_times()
    assert 0.45 <= times["gpu-node-10"] - times["gpu-node-1"] <= 1.5


def _stream(url: str, path: str) -> tuple[list[dict[str, Any]], str]:
    """Read a watch stream to its end: (events, how it ended)."""
    http = urllib3.PoolManager(retries=False)
    answer = http.request("GET", url + path, headers={"Authorization": "Bearer test-token"}, preload_content=False)
    events, ending = [], "clean"
    try:
        for line in answer.stream(65536):
            events += [json.loads(part) for part in line.split(b"\n") if part.strip()]
    except urllib3.exceptions.ProtocolError:
        ending = "cut"
    return events, ending


def test_dropped_watches() -> None:
    with SimCluster([SimNode("a"), SimNode("b"), SimNode("c")], tls=False) as sim:
        sim.drop_watches(after_events=2)
        events, ending = _stream(sim.url, "/api/v1/nodes?watch=1&timeoutSeconds=5")
        assert (len(events), ending) == (2, "cut")
        sim.drop_watches(after_seconds=0.3, clean=True)
        started = time.monotonic()
        events, ending = _stream(sim.url, "/api/v1/nodes?watch=1&timeoutSeconds=5")
        assert (len(events), ending) == (3, "clean") and time.monotonic() - started < 2
        sim.drop_watches()
        events, ending = _stream(sim.url, "/api/v1/nodes?watch=1&timeoutSeconds=1")
        assert (len(events), ending) == (3, "clean")


def test_bookmarks_and_initial_events_end() -> None:
    with SimCluster([SimNode("a")], tls=False, bookmark_interval=0.2) as sim:
        events, _ending = _stream(
            sim.url,
            "/api/v1/nodes?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
            "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1",
        )
    assert events[0]["type"] == "ADDED"
    assert events[1]["type"] == "BOOKMARK"
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert any(e["type"] == "BOOKMARK" and "annotations" not in e["object"]["metadata"] for e in events[2:])


def test_injected_errors_and_latency(cluster: SimCluster, core: client.CoreV1Api) -> None:
    cluster.fail_requests(count=2, status=503, path_regex=r"/api/v1/nodes$")
    for _attempt in range(2):
        with pytest.raises(ApiException) as caught:
            core.list_node()
        assert caught.value.status == 503
        assert json.loads(caught.value.body)["reason"] == "ServiceUnavailable"
    core.read_namespace("default")  # other paths are untouched
    assert len(core.list_node().items) == 3
    cluster.fail_requests(count=1, status=500)
    with pytest.raises(ApiException) as internal:
        core.read_namespace("default")
    assert internal.value.status == 500
    cluster.set_latency(0.3)
    started = time.monotonic()
    core.read_namespace("default")
    assert time.monotonic() - started >= 0.3
    cluster.set_latency(0)


def test_request_accounting(cluster: SimCluster, core: client.CoreV1Api) -> None:
    cluster.reset_counts()
    core.list_node()
    core.list_node()
    core.read_node("gpu-1")
    list(watch.Watch().stream(core.list_node, resource_version="1", timeout_seconds=1))
    counts = cluster.request_counts()
    assert counts["by_verb_resource"] == {("list", "nodes"): 2, ("get", "nodes"): 1, ("watch", "nodes"): 1}
    assert counts["total"] == 4 and counts["by_token"] == {"test-token": 4}
    assert next(iter(counts["by_user_agent"])).startswith("OpenAPI-Generator/")
    cluster.reset_counts()
    assert cluster.request_counts()["total"] == 0


def test_command_line_serves_until_terminated(tmp_path: Path, kubectl: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubesim",
            "--node",
            "big=8",
            "--node",
            "small=2",
            "--tls",
            "--kubeconfig",
            str(kubeconfig),
            "--capacity-delay",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("https://127.0.0.1:")
        names = subprocess.run(
            [kubectl, "--kubeconfig", str(kubeconfig), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        assert names == ["node/big", "node/small"]
        authority = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority-data"]
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(base64.b64decode(authority))
        control = urllib3.PoolManager(ca_certs=str(ca_file))
        answer = control.request("GET", f"{url}/kubesim/counts", headers={"Authorization": "Bearer test-token"})
        assert json.loads(answer.data)["by_verb_resource"]["list nodes"] == 1
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
