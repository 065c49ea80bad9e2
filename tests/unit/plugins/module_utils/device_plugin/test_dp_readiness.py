"""Readiness and diagnosis over captured Node and Pod objects."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import capacity_plan
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.readiness import (
    NVML_HINT,
    affinity_matches,
    classify_logs,
    diagnose,
    needs_logs,
    node_state,
    plugin_would_run,
    pod_problem,
    untolerated_taints,
)

PLAN = capacity_plan(None)
POD_SPEC = {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
TIME_SLICED = capacity_plan(
    {
        "version": "v1",
        "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "gpu", "replicas": 2}]}},
    }
)


def test_node_with_expected_gpus_is_done(fixture):
    state = node_state(fixture("node_gpu_ready.json"), "gpu-a100-1", PLAN, 8)
    assert state["done"] is True
    assert (state["capacity"], state["allocatable"], state["expected"]) == (8, 8, 8)


def test_node_with_fewer_gpus_than_expected_is_not_done(fixture):
    state = node_state(fixture("node_gpu_ready.json"), "gpu-a100-1", PLAN, 10)
    assert state["done"] is False


def test_without_expected_count_any_capacity_counts(fixture):
    assert node_state(fixture("node_gpu_ready.json"), "gpu-a100-1", PLAN)["done"] is True
    assert node_state(fixture("node_no_capacity.json"), "gpu-a100-2", PLAN)["done"] is False
    assert node_state(fixture("node_zero_capacity.json"), "gpu-a100-3", PLAN)["done"] is False


def test_node_expected_without_gpus_is_done_with_zero(fixture):
    assert node_state(fixture("node_no_capacity.json"), "gpu-a100-2", PLAN, 0)["done"] is True
    assert node_state(fixture("node_gpu_ready.json"), "gpu-a100-1", PLAN, 0)["done"] is False


def test_unhealthy_devices_keep_node_pending(fixture):
    state = node_state(fixture("node_unhealthy.json"), "gpu-a100-4", PLAN, 8)
    assert (state["capacity"], state["allocatable"], state["done"]) == (8, 6, False)


def test_not_ready_node_is_never_done(fixture):
    node = fixture("node_not_ready.json")
    node["status"]["capacity"]["nvidia.com/gpu"] = "8"
    node["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    state = node_state(node, "gpu-a100-5", PLAN, 8)
    assert state["node_ready"] is False
    assert state["done"] is False


def test_time_slicing_multiplies_and_renames(fixture):
    node = fixture("node_timesliced.json")
    state = node_state(
        node,
        "gpu-l4-1",
        capacity_plan(
            {
                "version": "v1",
                "sharing": {"timeSlicing": {"renameByDefault": True, "resources": [{"name": "gpu", "replicas": 4}]}},
            }
        ),
        4,
    )
    assert (state["resource"], state["capacity"], state["expected"], state["done"]) == (
        "nvidia.com/gpu.shared",
        16,
        16,
        True,
    )
    assert node_state(node, "gpu-l4-1", TIME_SLICED, 4)["done"] is False


def test_mixed_mig_counts_mig_resources_without_exact_count(fixture):
    plan = capacity_plan({"version": "v1", "flags": {"migStrategy": "mixed"}})
    state = node_state(fixture("node_mig_mixed.json"), "gpu-h100-1", plan, 2)
    assert state["expected"] is None
    assert state["capacity"] == 10
    assert set(state["resources"]) == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"}
    assert state["done"] is True


def test_missing_node_state():
    state = node_state(None, "ghost", PLAN, 4)
    assert state["found"] is False
    assert state["done"] is False


def test_taints_not_tolerated(fixture):
    node = fixture("node_tainted.json")
    assert untolerated_taints(node, POD_SPEC["tolerations"]) == ["dedicated=training:NoSchedule"]
    tolerations = POD_SPEC["tolerations"] + [{"key": "dedicated", "operator": "Equal", "value": "training"}]
    assert untolerated_taints(node, tolerations) == []
    assert untolerated_taints(node, [{"operator": "Exists"}]) == []


def test_selection_skips_control_plane_and_tainted_nodes(fixture):
    nodes = {
        "gpu-a100-1": fixture("node_gpu_ready.json"),
        "gpu-a100-6": fixture("node_tainted.json"),
        "cp-1": fixture("node_control_plane.json"),
    }
    assert sorted(name for name, node in nodes.items() if plugin_would_run(node, POD_SPEC)) == ["gpu-a100-1"]


def test_node_selector_and_affinity_matching(fixture):
    node = fixture("node_timesliced.json")
    assert plugin_would_run(node, dict(POD_SPEC, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-L4"}))
    assert not plugin_would_run(node, dict(POD_SPEC, nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100"}))
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}
                        ]
                    }
                ]
            }
        }
    }
    assert affinity_matches(node, affinity)
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"
    ][0]["operator"] = "DoesNotExist"
    assert not affinity_matches(node, affinity)


def test_pod_problems(fixture):
    assert pod_problem(fixture("pod_running.json")) == (None, "")
    kind, text = pod_problem(fixture("pod_image_pull.json"))
    assert kind == "image_pull"
    assert "ImagePullBackOff" in text
    kind, text = pod_problem(fixture("pod_crash_loop.json"))
    assert (kind, text) == ("crash_loop", "crash loop (CrashLoopBackOff, 6 restarts, last exit code 1)")
    kind, text = pod_problem(fixture("pod_pending.json"))
    assert kind == "pending"
    assert "ContainersNotReady" in text


def test_log_classification(fixture):
    assert classify_logs(fixture("log_nvml.txt")) == "nvml"
    assert classify_logs(fixture("log_no_devices.txt")) == "no_devices"
    assert classify_logs("I1120 plugin registered") is None
    assert classify_logs(None) is None


def _state(fixture, node_file, name, expected=None, plan=None):
    node = fixture(node_file)
    return node, node_state(node, name, plan or PLAN, expected)


def test_diagnose_missing_node():
    message = diagnose(node_state(None, "gpu-x", PLAN, 8), None, None, POD_SPEC)
    assert message == "gpu-x: node not found in the cluster (check the name in expected_gpus or nodes)"


def test_diagnose_not_ready(fixture):
    node, state = _state(fixture, "node_not_ready.json", "gpu-a100-5")
    message = diagnose(state, node, None, POD_SPEC)
    assert message.startswith("gpu-a100-5: node is not Ready (Ready=False KubeletNotReady")
    assert "cni plugin not initialized" in message


def test_diagnose_taint_mismatch(fixture):
    node, state = _state(fixture, "node_tainted.json", "gpu-a100-6")
    message = diagnose(state, node, None, POD_SPEC)
    assert message == (
        "gpu-a100-6: no device plugin pod on this node: taint not tolerated: dedicated=training:NoSchedule "
        "(add a toleration)"
    )


def test_diagnose_selector_mismatch(fixture):
    node, state = _state(fixture, "node_no_capacity.json", "gpu-a100-2")
    spec = dict(POD_SPEC, nodeSelector={"nvidia.com/gpu.present": "true"})
    message = diagnose(state, node, None, spec)
    assert "node_selector does not match: needs nvidia.com/gpu.present=true (node has no such label)" in message


def test_diagnose_image_pull(fixture):
    node, state = _state(fixture, "node_no_capacity.json", "gpu-a100-2")
    message = diagnose(state, node, fixture("pod_image_pull.json"), POD_SPEC)
    assert "cannot start: image pull error (ImagePullBackOff)" in message
    assert "image_pull_secrets" in message


def test_diagnose_crash_loop_with_logs(fixture):
    node, state = _state(fixture, "node_no_capacity.json", "gpu-a100-2")
    pod = fixture("pod_crash_loop.json")
    assert needs_logs(state, pod)
    message = diagnose(state, node, pod, POD_SPEC, fixture("log_nvml.txt"))
    assert "crash loop (CrashLoopBackOff, 6 restarts" in message
    assert NVML_HINT in message
    assert "last log lines:" in message
    assert "No devices found. Waiting indefinitely." in message


def test_diagnose_nvml_on_running_pod(fixture):
    node, state = _state(fixture, "node_no_capacity.json", "gpu-a100-2", 8)
    message = diagnose(state, node, fixture("pod_running.json"), POD_SPEC, fixture("log_nvml.txt"))
    assert message.startswith("gpu-a100-2: node reports no nvidia.com/gpu: the plugin cannot load NVML")
    assert "default runtime is not nvidia" in message


def test_diagnose_no_devices(fixture):
    node, state = _state(fixture, "node_no_capacity.json", "gpu-a100-2", 8)
    message = diagnose(state, node, fixture("pod_running.json"), POD_SPEC, fixture("log_no_devices.txt"))
    assert "found no GPU ('No devices found')" in message


def test_diagnose_unhealthy(fixture):
    node, state = _state(fixture, "node_unhealthy.json", "gpu-a100-4", 8)
    message = diagnose(state, node, fixture("pod_running.json"), POD_SPEC)
    assert message.startswith("gpu-a100-4: 2 of 8 nvidia.com/gpu unhealthy (allocatable 6 < capacity 8)")


@pytest.mark.parametrize(("expected", "fragment"), [(10, "expected 10 ("), (4, "expected 4 (")])
def test_diagnose_count_mismatch(fixture, expected, fragment):
    node, state = _state(fixture, "node_gpu_ready.json", "gpu-a100-1", expected)
    message = diagnose(state, node, fixture("pod_running.json"), POD_SPEC)
    assert "node reports 8 nvidia.com/gpu, " + fragment in message


def test_diagnose_count_mismatch_names_replicas(fixture):
    node, state = _state(fixture, "node_timesliced.json", "gpu-l4-1", 4, TIME_SLICED)
    message = diagnose(state, node, fixture("pod_running.json"), POD_SPEC)
    assert "node reports 16 nvidia.com/gpu.shared, expected 8 = 4 GPUs x 2 replicas" in message


def test_logs_are_not_needed_for_image_pull_or_done_nodes(fixture):
    _node, pending = _state(fixture, "node_no_capacity.json", "gpu-a100-2")
    _node, done = _state(fixture, "node_gpu_ready.json", "gpu-a100-1")
    assert not needs_logs(pending, fixture("pod_image_pull.json"))
    assert not needs_logs(done, fixture("pod_running.json"))
    assert not needs_logs(pending, None)
