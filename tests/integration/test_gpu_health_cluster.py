"""kubegpu.node.gpu_health_node and kubegpu.node.dcgm_exporter against the simulated API server (tests/kubesim, a
stand-in for kube-apiserver and the kubelets; see tests/README.md), run in-process exactly as Ansible runs them."""

from __future__ import annotations

import copy

import pytest
from ansible_collections.kubegpu.node.plugins.modules import dcgm_exporter, gpu_health_node
from kubesim import SimCluster, SimNode
from nvidia_device_plugin_harness import Api, auth_args, run_module

GPU_LABELS = {"nvidia.com/gpu.present": "true"}
FAILED = {
    "verdict": "failed",
    "action": "reset",
    "summary": "failed (reset): 1 of 4 GPU(s): GPU 2 (00000000:47:00.0): 2 uncorrectable ECC error(s) since the "
    "driver loaded (volatile) -> reset",
}
DEGRADED = {"verdict": "degraded", "action": "watch", "summary": "degraded (watch): 1 of 4 GPU(s): ..."}
HEALTHY = {"verdict": "healthy", "action": "none", "summary": "healthy: 4 GPU(s)"}
TAINT = {"key": "kubegpu.node/gpu-unhealthy", "value": "failed", "effect": "NoSchedule"}
EXPORTER_DS = "/apis/apps/v1/namespaces/kube-system/daemonsets/dcgm-exporter"
EXPORTER_SVC = "/api/v1/namespaces/kube-system/services/dcgm-exporter"
EXPORTER_SMON = "/apis/monitoring.coreos.com/v1/namespaces/kube-system/servicemonitors/dcgm-exporter"


@pytest.fixture
def cluster():
    nodes = [
        SimNode("gpu-1", gpus=8, labels=dict(GPU_LABELS)),
        SimNode("gpu-2", gpus=4, labels=dict(GPU_LABELS), taints=["nvidia.com/gpu=present:NoSchedule"]),
        SimNode("cpu-1"),
    ]
    with SimCluster(nodes=nodes, capacity_delay=0.1) as sim:
        yield sim


def marks(cluster, name, verdict, check_mode=False, diff=False, **extra):
    args = dict(auth_args(cluster), name=name, verdict=verdict, **extra)
    return run_module(args, check_mode=check_mode, diff=diff, module=gpu_health_node)


def node(cluster, name):
    return Api(cluster).get(f"/api/v1/nodes/{name}")


def taint_keys(cluster, name):
    return [t["key"] for t in (node(cluster, name)["spec"].get("taints") or [])]


# ----- labels, annotation, taint ------------------------------------------------------------------------------------


def test_a_failed_node_is_labelled_and_annotated_and_a_second_run_changes_nothing(cluster):
    first = marks(cluster, "gpu-2", FAILED)
    assert first.get("failed") is not True, first.get("msg")
    assert first["changed"] is True
    live = node(cluster, "gpu-2")
    assert live["metadata"]["labels"]["kubegpu.node/gpu-health"] == "failed"
    assert live["metadata"]["labels"]["kubegpu.node/gpu-health-action"] == "reset"
    assert live["metadata"]["annotations"]["kubegpu.node/gpu-health"] == FAILED["summary"]
    managers = {m["manager"] for m in live["metadata"]["managedFields"]}
    assert "kubegpu.node-gpu-health" in managers
    # No taint unless asked for: only the taint the node had.
    assert taint_keys(cluster, "gpu-2") == ["nvidia.com/gpu"]
    version = live["metadata"]["resourceVersion"]
    second = marks(cluster, "gpu-2", FAILED)
    assert second["changed"] is False
    assert node(cluster, "gpu-2")["metadata"]["resourceVersion"] == version


def test_the_opt_in_taint_is_added_beside_other_taints_and_removed_when_healthy(cluster):
    result = marks(cluster, "gpu-2", FAILED, taint="failed", diff=True)
    assert result["changed"] is True
    taints = node(cluster, "gpu-2")["spec"]["taints"]
    assert [t["key"] for t in taints] == ["nvidia.com/gpu", "kubegpu.node/gpu-unhealthy"]
    assert taints[1] == TAINT
    assert result["marks"]["taint"] == TAINT
    assert result["diff"]["before"]["taint"] is None
    assert result["diff"]["after"]["other_taints"] == ["nvidia.com/gpu"]
    assert marks(cluster, "gpu-2", FAILED, taint="failed")["changed"] is False
    # Degraded with taint=failed: no taint; the labels follow the verdict.
    result = marks(cluster, "gpu-2", DEGRADED, taint="failed")
    assert result["changed"] is True
    assert taint_keys(cluster, "gpu-2") == ["nvidia.com/gpu"]
    assert node(cluster, "gpu-2")["metadata"]["labels"]["kubegpu.node/gpu-health"] == "degraded"
    # taint=degraded taints a degraded node, with the verdict as the taint's value.
    marks(cluster, "gpu-2", DEGRADED, taint="degraded")
    assert node(cluster, "gpu-2")["spec"]["taints"][-1]["value"] == "degraded"
    # Healthy again: every mark goes, the other taint stays.
    result = marks(cluster, "gpu-2", HEALTHY, taint="degraded")
    assert result["changed"] is True
    live = node(cluster, "gpu-2")
    assert "kubegpu.node/gpu-health" not in live["metadata"].get("labels", {})
    assert "kubegpu.node/gpu-health-action" not in live["metadata"].get("labels", {})
    assert "kubegpu.node/gpu-health" not in (live["metadata"].get("annotations") or {})
    assert taint_keys(cluster, "gpu-2") == ["nvidia.com/gpu"]
    assert marks(cluster, "gpu-2", HEALTHY, taint="degraded")["changed"] is False


def test_turning_the_taint_off_removes_ours(cluster):
    marks(cluster, "gpu-1", FAILED, taint="failed")
    assert taint_keys(cluster, "gpu-1") == ["kubegpu.node/gpu-unhealthy"]
    result = marks(cluster, "gpu-1", FAILED, taint="none")
    assert result["changed"] is True
    assert "taints" not in node(cluster, "gpu-1")["spec"]
    assert node(cluster, "gpu-1")["metadata"]["labels"]["kubegpu.node/gpu-health"] == "failed"


def test_check_mode_changes_nothing_but_says_what_would_change(cluster):
    before = node(cluster, "gpu-2")
    result = marks(cluster, "gpu-2", FAILED, taint="failed", check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["marks"]["taint"] == TAINT
    assert result["diff"]["after"]["labels"]["kubegpu.node/gpu-health"] == "failed"
    after = node(cluster, "gpu-2")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert taint_keys(cluster, "gpu-2") == ["nvidia.com/gpu"]


def test_labels_of_other_managers_are_left_alone(cluster):
    cluster.api.mutate(
        cluster.api.store and __import__("kubesim.resources", fromlist=["BY_PLURAL"]).BY_PLURAL["nodes"],
        None,
        "gpu-1",
        lambda n: n["metadata"]["labels"].update({"team": "vision"}),
        "kubectl-label",
    )
    marks(cluster, "gpu-1", FAILED)
    marks(cluster, "gpu-1", HEALTHY)
    assert node(cluster, "gpu-1")["metadata"]["labels"]["team"] == "vision"


def test_a_taint_written_by_someone_else_meanwhile_is_kept(cluster, monkeypatch):
    """Another writer (kubectl taint, a controller) changes the taints between the module's read and its patch: the
    tested JSON patch fails, the module reads again and keeps that taint."""
    from kubesim.resources import BY_PLURAL

    real = cluster.before_request
    seen = {"node": 0}

    def racing(path):
        if path == "/api/v1/nodes/gpu-2":
            seen["node"] += 1
            if seen["node"] == 3:  # GET, the apply of the labels, then the taint patch
                cluster.api.mutate(
                    BY_PLURAL["nodes"],
                    None,
                    "gpu-2",
                    lambda n: n["spec"]["taints"].append({"key": "example.com/maintenance", "effect": "NoSchedule"}),
                    "kubectl-taint",
                )
        real(path)

    monkeypatch.setattr(cluster, "before_request", racing)
    result = marks(cluster, "gpu-2", FAILED, taint="failed")
    assert result.get("failed") is not True, result.get("msg")
    assert taint_keys(cluster, "gpu-2") == ["nvidia.com/gpu", "example.com/maintenance", "kubegpu.node/gpu-unhealthy"]


def test_an_unknown_node_and_a_bad_verdict_fail_with_a_message(cluster):
    missing = marks(cluster, "gpu-9", FAILED)
    assert missing["failed"] is True
    assert "node gpu-9 is not in the cluster" in missing["msg"]
    bad = marks(cluster, "gpu-1", {"verdict": "sick"})
    assert bad["failed"] is True
    assert "verdict.verdict must be one of" in bad["msg"]


# ----- the DCGM exporter --------------------------------------------------------------------------------------------


def exporter(cluster, check_mode=False, diff=False, **extra):
    args = dict(auth_args(cluster), wait_timeout=10)
    args.update(extra)
    return run_module(args, check_mode=check_mode, diff=diff, module=dcgm_exporter)


def test_the_exporter_runs_on_every_gpu_node_and_a_second_run_changes_nothing(cluster):
    first = exporter(cluster)
    assert first.get("failed") is not True, first.get("msg")
    assert first["changed"] is True
    assert [(o["kind"], o["action"]) for o in first["objects"]] == [("DaemonSet", "created"), ("Service", "created")]
    assert first["service_monitor"] is False
    assert first["nodes"] == {"gpu-1": {"ready": True, "reason": ""}, "gpu-2": {"ready": True, "reason": ""}}
    ds = Api(cluster).get(EXPORTER_DS)
    spec = ds["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["image"] == "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
    assert {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"} in container["env"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert container["volumeMounts"] == [
        {"name": "pod-gpu-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True}
    ]
    assert spec["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert spec["nodeSelector"] == GPU_LABELS
    assert {"key": "kubegpu.node/gpu-unhealthy", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert Api(cluster).get(EXPORTER_SVC)["spec"]["ports"][0]["port"] == 9400
    # The plugin's capacity is not the exporter's business: no device plugin here, no capacity.
    assert "nvidia.com/gpu" not in node(cluster, "gpu-1")["status"]["capacity"]
    second = exporter(cluster)
    assert second["changed"] is False
    assert [o["action"] for o in second["objects"]] == ["unchanged", "unchanged"]


def test_check_mode_creates_nothing_and_diff_shows_the_objects(cluster):
    result = exporter(cluster, check_mode=True, diff=True)
    assert result["changed"] is True
    assert [d["before_header"] for d in result["diff"]] == [
        "DaemonSet kube-system/dcgm-exporter",
        "Service kube-system/dcgm-exporter",
    ]
    assert result["diff"][0]["after"]["spec"]["template"]["spec"]["containers"][0]["name"] == "exporter"
    assert Api(cluster).get(EXPORTER_DS) is None
    assert "nodes" not in result


def test_a_service_monitor_when_the_crd_is_there(cluster):
    refused = exporter(cluster, service_monitor="true")
    assert refused["failed"] is True
    assert "no ServiceMonitor API" in refused["msg"]
    cluster.install_crd("servicemonitors")
    result = exporter(cluster, service_monitor_labels={"release": "prometheus"})
    assert result["service_monitor"] is True
    monitor = Api(cluster).get(EXPORTER_SMON)
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    # Turned off: the ServiceMonitor this collection made goes.
    off = exporter(cluster, service_monitor="false")
    assert ("ServiceMonitor", "deleted") in [(o["kind"], o["action"]) for o in off["objects"]]
    assert Api(cluster).get(EXPORTER_SMON) is None


def test_the_wait_says_per_node_why_not(cluster):
    cluster.set_fault("gpu-2", "image_pull", daemonset="dcgm-exporter")
    result = exporter(cluster, wait_timeout=5, nodes=["gpu-1", "gpu-2", "cpu-1"])
    assert result["failed"] is True
    assert result["nodes"]["gpu-1"] == {"ready": True, "reason": ""}
    diagnosis = dict(line.split(": ", 1) for line in result["diagnosis"])
    assert "cannot start: image pull error (ImagePullBackOff)" in diagnosis["gpu-2"]
    assert diagnosis["cpu-1"] == (
        "no exporter pod on this node: node_selector does not match: needs nvidia.com/gpu.present=true "
        "(node has no such label)"
    )
    assert "1 of 3 nodes ready" in result["msg"]


def test_a_registry_mirror_and_absent(cluster):
    result = exporter(cluster, registry="registry.example.internal/nvidia/k8s", version="4.5.3-4.8.2-ubuntu22.04")
    image = Api(cluster).get(EXPORTER_DS)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.internal/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-ubuntu22.04"
    assert result["changed"] is True
    gone = exporter(cluster, state="absent")
    assert [(o["kind"], o["action"]) for o in gone["objects"]] == [("DaemonSet", "deleted"), ("Service", "deleted")]
    assert Api(cluster).get(EXPORTER_DS) is None
    assert exporter(cluster, state="absent")["changed"] is False


def test_the_exporter_runs_on_a_node_tainted_for_its_gpu_health(cluster):
    marks(cluster, "gpu-1", FAILED, taint="failed")
    result = exporter(cluster)
    assert result.get("failed") is not True, result.get("msg")
    assert result["nodes"]["gpu-1"]["ready"] is True


def test_the_verdict_passed_is_not_modified(cluster):
    verdict = copy.deepcopy(FAILED)
    marks(cluster, "gpu-1", verdict)
    assert verdict == FAILED


# ----- the capacity wait names a known unhealthy GPU ---------------------------------------------------------------


def test_the_capacity_wait_diagnosis_names_the_known_unhealthy_gpu(cluster):
    """kubesim's unhealthy fault stands in for the plugin marking a GPU unhealthy after Xid 48; the GPU health check
    knew which GPU and why, and the diagnosis says so."""
    cluster.set_fault("gpu-2", "unhealthy", devices=1, xid=48)
    result = run_module(
        dict(
            auth_args(cluster),
            expected_gpus={"gpu-1": 8, "gpu-2": 4},
            wait_timeout=4,
            tolerations=[{"key": "kubegpu.node/gpu-unhealthy", "operator": "Exists", "effect": "NoSchedule"}],
            known_unhealthy={"gpu-2": FAILED["summary"]},
        )
    )
    assert result["failed"] is True
    assert len(result["diagnosis"]) == 1
    line = result["diagnosis"][0]
    assert line.startswith("gpu-2: 1 of 4 nvidia.com/gpu unhealthy")
    assert line.endswith("; GPU health check: " + FAILED["summary"])
