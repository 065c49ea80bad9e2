"""Sharing in the capacity wait: per-resource expectations (MIG layouts, shared MIG devices) and MPS diagnosis."""

from __future__ import annotations

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.plugin_config import advertised, capacity_plan
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.readiness import (
    diagnose,
    mps_daemon_problem,
    node_state,
    resources_mismatch,
)

MIXED = capacity_plan({"version": "v1", "flags": {"migStrategy": "mixed"}})
# node_mig_mixed.json: an H100 node with nvidia.com/gpu 1, mig-1g.10gb 7, mig-3g.40gb 2 (one GPU without MIG, one
# GPU as 7 x 1g.10gb, one as 2 x 3g.40gb).
LAYOUT = {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2}
POD_SPEC = {"tolerations": []}
RUNNING = {"metadata": {"name": "mps-x"}, "status": {"phase": "Running", "containerStatuses": [{"state": {}}]}}


def test_a_node_with_its_mig_layout_is_done(fixture):
    state = node_state(fixture("node_mig_mixed.json"), "gpu-h100-1", MIXED, resources=LAYOUT)
    assert state["done"] is True
    assert (state["capacity"], state["expected"]) == (10, 10)
    assert state["resources"]["nvidia.com/mig-3g.40gb"] == {"capacity": 2, "allocatable": 2, "expected": 2}


def test_the_same_total_in_another_layout_is_not_done(fixture):
    other = {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 5, "nvidia.com/mig-3g.40gb": 4}
    state = node_state(fixture("node_mig_mixed.json"), "gpu-h100-1", MIXED, resources=other)
    assert state["done"] is False
    assert resources_mismatch(state) == [
        "nvidia.com/mig-1g.10gb 7 (expected 5)",
        "nvidia.com/mig-3g.40gb 2 (expected 4)",
    ]
    message = diagnose(state, fixture("node_mig_mixed.json"), RUNNING, POD_SPEC)
    assert message.startswith("gpu-h100-1: node reports nvidia.com/mig-1g.10gb 7 (expected 5), nvidia.com/mig-3g")
    assert "its MIG layout is not the one expected" in message


def test_an_unhealthy_mig_device_keeps_the_node_pending(fixture):
    node = fixture("node_mig_mixed.json")
    node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "6"
    assert node_state(node, "gpu-h100-1", MIXED, resources=LAYOUT)["done"] is False


def test_shared_resources_are_expected_times_their_replicas_under_their_shared_name():
    plan = capacity_plan(
        {
            "version": "v1",
            "flags": {"migStrategy": "mixed"},
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 2}, {"name": "gpu", "replicas": 3}],
                }
            },
        }
    )
    assert advertised(plan, LAYOUT) == {
        "nvidia.com/gpu.shared": 3,
        "nvidia.com/mig-1g.10gb.shared": 14,
        "nvidia.com/mig-3g.40gb": 2,
    }


def test_mps_daemon_problems(fixture):
    node = fixture("node_gpu_ready.json")
    assert "labelled nvidia.com/mps.capable=true (the node has no such label)" in mps_daemon_problem(node, None)
    node["metadata"]["labels"]["nvidia.com/mps.capable"] = "false"
    assert "(the node has nvidia.com/mps.capable=false)" in mps_daemon_problem(node, None)
    node["metadata"]["labels"]["nvidia.com/mps.capable"] = "true"
    assert "has not scheduled one" in mps_daemon_problem(node, None)
    crashing = fixture("pod_crash_loop.json")
    assert "is not running: crash loop" in mps_daemon_problem(node, crashing)
    assert mps_daemon_problem(node, fixture("pod_running.json")) is None
