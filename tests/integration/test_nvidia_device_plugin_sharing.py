"""GPU sharing through kubegpu.node.nvidia_device_plugin against the simulated API server (tests/kubesim, a stand-in
for kube-apiserver, the kubelets and the plugin's pods; see tests/README.md): MPS with NVIDIA's control daemon, MIG
layouts counted per resource, and two node pools (one MPS, one mixed MIG) each checked per resource name."""

from __future__ import annotations

import pytest
from kubesim import SimCluster, SimNode
from kubesim.resources import BY_PLURAL
from nvidia_device_plugin_harness import Api, auth_args, run_module

MPS_DAEMONSET = "/apis/apps/v1/namespaces/kube-system/daemonsets/nvidia-device-plugin-daemonset-mps-control-daemon"
MPS_CAPABLE = {"nvidia.com/mps.capable": "true"}


def mps(replicas=4, **section):
    return {
        "version": "v1",
        "sharing": {"mps": dict(section, resources=[{"name": "nvidia.com/gpu", "replicas": replicas}])},
    }


def args(cluster, **extra):
    values = dict(auth_args(cluster), wait_timeout=10)
    values.update(extra)
    return values


def daemon_pods(cluster):
    return [
        p
        for p in cluster.list_objects("pods", "kube-system")
        if p["metadata"]["labels"].get("name") == "nvidia-device-plugin-mps-control-daemon"
    ]


# MPS --------------------------------------------------------------------------------------------------------------


def test_mps_deploys_the_control_daemon_and_counts_gpus_times_replicas():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2, labels=MPS_CAPABLE)], capacity_delay=0.2) as cluster:
        first = run_module(args(cluster, config=mps(4), expected_gpus={"gpu-1": 2}))
        assert first.get("failed") is not True, first.get("msg")
        assert [(o["kind"], o["name"], o["action"]) for o in first["objects"]] == [
            ("ConfigMap", "nvidia-device-plugin-config", "created"),
            ("DaemonSet", "nvidia-device-plugin-daemonset-mps-control-daemon", "created"),
            ("DaemonSet", "nvidia-device-plugin-daemonset", "created"),
        ]
        assert first["nodes"]["gpu-1"]["capacity"] == 8
        assert first["nodes"]["gpu-1"]["expected"] == 8
        (daemon,) = daemon_pods(cluster)
        assert daemon["spec"]["nodeName"] == "gpu-1"
        assert daemon["status"]["phase"] == "Running"
        again = run_module(args(cluster, config=mps(4), expected_gpus={"gpu-1": 2}))
        assert again["changed"] is False
        assert {o["action"] for o in again["objects"]} == {"unchanged"}


def test_mps_with_rename_by_default_counts_the_shared_resource():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2, labels=MPS_CAPABLE)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=mps(3, renameByDefault=True), expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        assert result["nodes"]["gpu-1"]["resource"] == "nvidia.com/gpu.shared"
        assert result["nodes"]["gpu-1"]["capacity"] == 6
        node = cluster.get_object("node", "gpu-1")
        assert node["status"]["capacity"]["nvidia.com/gpu.shared"] == "6"


def test_a_node_without_the_mps_label_is_diagnosed():
    nodes = [SimNode("gpu-1", gpus=2, labels=MPS_CAPABLE), SimNode("gpu-2", gpus=2)]
    with SimCluster(nodes=nodes, capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=mps(4), expected_gpus={"gpu-1": 2, "gpu-2": 2}, wait_timeout=3))
        assert result["failed"] is True
        assert result["nodes"]["gpu-1"]["ready"] is True
        (message,) = result["diagnosis"]
        assert message.startswith("gpu-2: node reports no nvidia.com/gpu: no MPS control daemon on this node")
        assert "nvidia.com/mps.capable=true (the node has no such label)" in message


def test_a_crashing_mps_daemon_is_diagnosed_with_its_log():
    nodes = [SimNode("gpu-1", gpus=2, labels=MPS_CAPABLE, faults="mps_daemon_fails")]
    with SimCluster(nodes=nodes, capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=mps(2), expected_gpus={"gpu-1": 2}, wait_timeout=3))
        assert result["failed"] is True
        (message,) = result["diagnosis"]
        assert "the MPS control daemon pod nvidia-device-plugin-daemonset-mps-control-daemon-" in message
        assert "crash loop (CrashLoopBackOff" in message
        assert "last log lines of the daemon:" in message and "nvml init failed" in message


def test_the_plugin_waits_for_a_daemon_that_comes_later():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=mps(2), expected_gpus={"gpu-1": 1}, wait=False))
        assert result.get("failed") is not True, result.get("msg")
        assert daemon_pods(cluster) == []
        # The label arrives (GPU feature discovery, or site.yml's labels step): the daemon starts, then the plugin.
        cluster.sim.api.mutate(
            BY_PLURAL["nodes"], None, "gpu-1", lambda obj: obj["metadata"]["labels"].update(MPS_CAPABLE), "test"
        )
        waited = run_module(args(cluster, config=mps(2), expected_gpus={"gpu-1": 1}))
        assert waited.get("failed") is not True, waited.get("msg")
        assert waited["nodes"]["gpu-1"]["capacity"] == 2


def test_turning_mps_off_removes_the_control_daemon():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2, labels=MPS_CAPABLE)], capacity_delay=0.1) as cluster:
        run_module(args(cluster, config=mps(2), wait=False))
        assert Api(cluster).get(MPS_DAEMONSET) is not None
        preview = run_module(args(cluster, config={"version": "v1"}, wait=False), check_mode=True, diff=True)
        assert ("DaemonSet", "nvidia-device-plugin-daemonset-mps-control-daemon", "deleted") in [
            (o["kind"], o["name"], o["action"]) for o in preview["objects"]
        ]
        assert Api(cluster).get(MPS_DAEMONSET) is not None
        result = run_module(args(cluster, config={"version": "v1"}, expected_gpus={"gpu-1": 2}))
        assert result.get("failed") is not True, result.get("msg")
        assert Api(cluster).get(MPS_DAEMONSET) is None
        assert result["nodes"]["gpu-1"]["capacity"] == 2
        quiet = run_module(args(cluster, config={"version": "v1"}, wait=False))
        assert [o["kind"] for o in quiet["objects"]] == ["ConfigMap", "DaemonSet"]


def test_absent_removes_the_control_daemon_too():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2, labels=MPS_CAPABLE)], capacity_delay=0.1) as cluster:
        run_module(args(cluster, config=mps(2), wait=False))
        removed = run_module(args(cluster, state="absent"))
        assert [(o["name"], o["action"]) for o in removed["objects"]] == [
            ("nvidia-device-plugin-daemonset", "deleted"),
            ("nvidia-device-plugin-daemonset-mps-control-daemon", "deleted"),
            ("nvidia-device-plugin-config", "deleted"),
        ]
        assert Api(cluster).get(MPS_DAEMONSET) is None


def test_mps_refusals_come_before_any_api_call():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2)], capacity_delay=0.1) as cluster:
        cluster.reset_counts()
        config = mps(2)
        config["flags"] = {"migStrategy": "mixed"}
        result = run_module(args(cluster, config=config))
        assert result["failed"] is True
        assert "MPS cannot be combined with MIG" in result["msg"]
        assert cluster.request_counts()["total"] == 0


# MIG ---------------------------------------------------------------------------------------------------------------

MIXED = {"version": "v1", "flags": {"migStrategy": "mixed"}}
LAYOUT = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
EXPECTED = {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1}


def test_mixed_mig_is_counted_per_resource():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1, mig_devices=LAYOUT)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=MIXED, expected_resources={"gpu-1": EXPECTED}))
        assert result.get("failed") is not True, result.get("msg")
        report = result["nodes"]["gpu-1"]
        assert report["ready"] is True and report["expected"] == 4
        assert report["resources"]["nvidia.com/mig-3g.40gb"] == {"capacity": 1, "allocatable": 1, "expected": 1}


def test_a_node_with_another_mig_layout_is_diagnosed_per_resource():
    other = {"1g.10gb": 7}
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1, mig_devices=other)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=MIXED, expected_resources={"gpu-1": EXPECTED}, wait_timeout=2))
        assert result["failed"] is True
        (message,) = result["diagnosis"]
        assert message.startswith(
            "gpu-1: node reports nvidia.com/mig-1g.10gb 7 (expected 2), nvidia.com/mig-2g.20gb 0 (expected 1), "
            "nvidia.com/mig-3g.40gb 0 (expected 1): its MIG layout is not the one expected"
        )


def test_time_sliced_mig_devices_are_counted_times_their_replicas():
    config = {
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
        "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.10gb", "replicas": 3}]}},
    }
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1, mig_devices=LAYOUT)], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=config, expected_resources={"gpu-1": EXPECTED}))
        assert result.get("failed") is not True, result.get("msg")
        assert result["nodes"]["gpu-1"]["resources"]["nvidia.com/mig-1g.10gb"]["capacity"] == 6


def test_single_strategy_counts_mig_devices_as_gpus():
    config = {"version": "v1", "flags": {"migStrategy": "single"}}
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2, mig_devices={"1g.10gb": 14})], capacity_delay=0.1) as cluster:
        result = run_module(args(cluster, config=config, expected_resources={"gpu-1": {"nvidia.com/gpu": 14}}))
        assert result.get("failed") is not True, result.get("msg")
        assert result["nodes"]["gpu-1"]["capacity"] == 14


@pytest.mark.parametrize(
    ("expected", "fragment"),
    [
        ({}, "expected_resources: must name at least one node"),
        ({"gpu-1": 3}, "must map resource names to counts"),
        ({"gpu-1": {"mig-1g.10gb": 1}}, "is not an NVIDIA resource name"),
        ({"gpu-1": {"nvidia.com/mig-1g.10gb": -1}}, "is not a whole number"),
    ],
)
def test_expected_resources_are_checked_before_any_api_call(expected, fragment):
    with SimCluster(nodes=[], capacity_delay=0.1) as cluster:
        cluster.reset_counts()
        result = run_module(args(cluster, config=MIXED, expected_resources=expected))
        assert result["failed"] is True
        assert fragment in result["msg"]
        assert cluster.request_counts()["total"] == 0


# Two node pools: one shares its GPUs with MPS (4 replicas), one has a mixed MIG layout -----------------------------


def test_an_mps_pool_and_a_mixed_mig_pool_each_report_their_resources():
    nodes = [
        SimNode("mps-1", gpus=2, labels={"pool": "mps", **MPS_CAPABLE}),
        SimNode("mig-1", gpus=1, labels={"pool": "mig"}, mig_devices=LAYOUT),
    ]
    with SimCluster(nodes=nodes, capacity_delay=0.2) as cluster:
        mps_pool = run_module(
            args(
                cluster,
                name="dp-mps",
                config_map_name="dp-mps-config",
                node_selector={"pool": "mps"},
                config=mps(4),
                expected_gpus={"mps-1": 2},
            )
        )
        assert mps_pool.get("failed") is not True, mps_pool.get("msg")
        mig_pool = run_module(
            args(
                cluster,
                name="dp-mig",
                config_map_name="dp-mig-config",
                node_selector={"pool": "mig"},
                config=MIXED,
                expected_resources={"mig-1": EXPECTED},
            )
        )
        assert mig_pool.get("failed") is not True, mig_pool.get("msg")
        capacity = {n: cluster.get_object("node", n)["status"]["capacity"] for n in ("mps-1", "mig-1")}
        assert {k: v for k, v in capacity["mps-1"].items() if k.startswith("nvidia.com/")} == {"nvidia.com/gpu": "8"}
        assert {k: v for k, v in capacity["mig-1"].items() if k.startswith("nvidia.com/")} == {
            k: str(v) for k, v in EXPECTED.items()
        }
        # The MPS daemon runs on the MPS pool only.
        assert [p["spec"]["nodeName"] for p in daemon_pods(cluster)] == ["mps-1"]
