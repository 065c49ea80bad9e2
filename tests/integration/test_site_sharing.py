"""playbooks/site.yml with GPU sharing, run for real against the simulated API server (tests/kubesim): a MIG layout
planned in the batch, applied in the node's drain window and waited for per resource; MPS with the node labelled for
NVIDIA's MPS control daemon; and the preflight refusals.

The hosts are reached with the local connection, and the role chain (driver, toolkit, runtime, kubelet) is skipped.
The MIG step runs for real: its nvidia-smi is the stand-in (tests/nvidia_smi_standin, see tests/README.md) keeping
the "GPUs" in a file under the test's folder, and the facts go to a folder of the test's too.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from kubesim import SimCluster, SimNode

STANDIN = Path(__file__).resolve().parents[1] / "nvidia_smi_standin" / "nvidia_smi_standin.py"

# The nvidia_driver role's facts for one A100-SXM4-40GB (the labels are worked out from them).
NVIDIA_FACT = {
    "loaded_version": "550.163.01",
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA A100-SXM4-40GB",
            "uuid": "GPU-0",
            "memory_total_mib": 40960,
            "compute_capability": "8.0",
        }
    ],
}
BALANCED = {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}


class Node:
    """One host of the inventory: its facts folder and, for MIG, the stand-in nvidia-smi and its state file."""

    def __init__(self, tmp_path: Path, name: str, mig_on: bool = False):
        self.dir = tmp_path / name
        self.facts = self.dir / "facts.d"
        self.facts.mkdir(parents=True)
        (self.facts / "nvidia.fact").write_text(json.dumps(NVIDIA_FACT))
        self.state = self.dir / "state.json"
        gpu = {
            "index": 0,
            "uuid": "GPU-0a0a0a0a-0000-4000-8000-000000000000",
            "model": "A100-SXM4-40GB",
            "mig": {"current": mig_on, "pending": mig_on},
            "gis": [],
        }
        self.state.write_text(json.dumps({"gpus": [gpu]}))
        self.smi = self.dir / "nvidia-smi"
        self.smi.write_text(f'#!/bin/sh\nNVIDIA_SMI_STANDIN_STATE={self.state} exec {sys.executable} {STANDIN} "$@"\n')
        self.smi.chmod(0o755)

    def host_vars(self, **extra: object) -> dict:
        return {
            "kubegpu_gpu_count": 1,
            "kubegpu_facts_dir": str(self.facts),
            "gpu_mig_facts_dir": str(self.facts),
            "gpu_mig_nvidia_smi": str(self.smi),
            **extra,
        }

    def instances(self) -> list:
        return sorted(gi["profile_id"] for gi in json.loads(self.state.read_text())["gpus"][0]["gis"])


def run_site(ansible, hosts: dict, kubeconfig: str, **extra_vars: object):
    # The role chain is off (the harness's inventory); the MIG step runs against the stand-in. No --skip-tags for the
    # chain: the drain window, where the layout is applied, carries the roles' tags.
    inventory = ansible.inventory(
        hosts,
        kubegpu_device_plugin_wait_timeout=30,
        kubegpu_validate=False,
        kubegpu_drain_timeout=30,
        kubegpu_node_ready_timeout=30,
        kubegpu_kubeconfig=kubeconfig,
        **extra_vars,
    )
    return ansible.playbook(ansible.site, inventory=inventory, skip_chain=False)


def test_a_mig_layout_is_held_for_the_drain_window_and_its_resources_waited_for(ansible, tmp_path):
    node = Node(tmp_path, "mig-1")
    # kubesim's node advertises the MIG devices the layout gives, once the plugin runs with the mixed strategy.
    with SimCluster(nodes=[SimNode("mig-1", gpus=1, mig_devices=BALANCED)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = run_site(ansible, {"mig-1": node.host_vars(gpu_mig_layout="all-balanced")}, kubeconfig)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        # Held back in the batch, applied inside the drain window (the node was cordoned and drained for it).
        assert "MIG layout all-balanced is not applied yet: gpu_mig_apply is false" in output
        assert "TASK [Cordon the node, with a record of why (annotation kubegpu.node/cordon), mig-1]" in output
        window = output.split("TASK [Apply the MIG layout (held back, or cleared by the reboot)]", 1)[1]
        assert re.search(
            r"TASK \[kubegpu.node.gpu_mig : Apply MIG layout all-balanced\] \**\nchanged: \[mig-1\]", window
        )
        assert node.instances() == [9, 14, 19, 19]
        # The plugin got the mixed strategy; the wait counted each MIG resource.
        config = cluster.get_object("ConfigMap", "nvidia-device-plugin-config", "kube-system")
        assert json.loads(config["data"]["config.yaml"])["flags"]["migStrategy"] == "mixed"
        capacity = cluster.get_object("Node", "mig-1")["status"]["capacity"]
        assert {k: v for k, v in capacity.items() if k.startswith("nvidia.com/")} == {
            "nvidia.com/mig-1g.5gb": "2",
            "nvidia.com/mig-2g.10gb": "1",
            "nvidia.com/mig-3g.20gb": "1",
        }
        labels = cluster.get_object("Node", "mig-1")["metadata"]["labels"]
        assert labels["nvidia.com/mig.capable"] == "true"
        assert labels["nvidia.com/mig.strategy"] == "mixed"
        assert labels["nvidia.com/mig-1g.5gb.count"] == "2"
        assert labels["nvidia.com/mig-3g.20gb.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
        assert labels["nvidia.com/mig-3g.20gb.multiprocessors"] == "42"
        assert not cluster.get_object("Node", "mig-1")["spec"].get("unschedulable")

        # A second run finds the layout there: nothing held back, no drain window.
        again = run_site(ansible, {"mig-1": node.host_vars(gpu_mig_layout="all-balanced")}, kubeconfig)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "TASK [Cordon the node" not in again.stdout and "TASK [Drain node" not in again.stdout
        assert node.instances() == [9, 14, 19, 19]


def test_mps_nodes_are_labelled_for_the_control_daemon_and_count_gpus_times_replicas(ansible, tmp_path):
    node = Node(tmp_path, "mps-1")
    mps = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}}}
    with SimCluster(nodes=[SimNode("mps-1", gpus=1)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = run_site(ansible, {"mps-1": node.host_vars()}, kubeconfig, kubegpu_device_plugin_config=mps)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        labels = cluster.get_object("Node", "mps-1")["metadata"]["labels"]
        assert labels["nvidia.com/mps.capable"] == "true"
        assert cluster.get_object("Node", "mps-1")["status"]["capacity"]["nvidia.com/gpu"] == "4"
        daemons = [
            p
            for p in cluster.list_objects("pods", "kube-system")
            if p["metadata"]["labels"].get("name") == "nvidia-device-plugin-mps-control-daemon"
        ]
        assert [p["spec"]["nodeName"] for p in daemons] == ["mps-1"]


def test_mps_with_a_mig_layout_is_refused_before_any_change(ansible, tmp_path):
    node = Node(tmp_path, "gpu-1")
    mps = {"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}}}
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = run_site(
            ansible,
            {"gpu-1": node.host_vars(gpu_mig_layout="all-1g.5gb")},
            kubeconfig,
            kubegpu_device_plugin_config=mps,
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        assert "NVIDIA's device plugin refuses MPS for MIG devices" in output
        assert cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system") is None
    assert node.instances() == []


def test_a_layout_the_gpu_cannot_take_is_refused_in_the_preflight(ansible, tmp_path):
    node = Node(tmp_path, "gpu-1")
    layouts = {
        "version": "v1",
        "mig-configs": {"big": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.20gb": 3}}]},
    }
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = run_site(
            ansible, {"gpu-1": node.host_vars(gpu_mig_layout="big", gpu_mig_layouts=layouts)}, kubeconfig
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        assert "holds at most 2 instances of 3g.20gb, not 3" in output
        assert not cluster.get_object("Node", "gpu-1")["spec"].get("unschedulable")
    assert json.loads(node.state.read_text())["gpus"][0]["mig"] == {"current": False, "pending": False}


def test_a_mig_strategy_that_cannot_serve_a_layout_is_refused_in_the_preflight(ansible, tmp_path):
    node = Node(tmp_path, "gpu-1")
    with SimCluster(nodes=[SimNode("gpu-1", gpus=1)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = run_site(
            ansible,
            {"gpu-1": node.host_vars(gpu_mig_layout="all-balanced")},
            kubeconfig,
            kubegpu_mig_strategy="single",
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        assert "gpu-1: the single MIG strategy needs one MIG profile per node" in output
    assert node.instances() == []
