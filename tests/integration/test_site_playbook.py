"""playbooks/site.yml run for real against the simulated API server: the device-plugin wait, GPU labels, validation.

The hosts are reached with the local connection and the role chain is skipped (driver, toolkit, container runtime and
kubelet have their own molecule scenarios, the whole chain runs in `make demo`; the drain window has
tests/integration/test_drain_window.py), so what is tested is how the playbook turns
inventory and the driver's facts into labels, the module's wait and the validation. nvidia-smi on the "hosts" is a
stand-in script written by the test (there is no GPU here); the validation pods run on kubesim's simulated kubelet.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kubesim import SimCluster, SimNode


def _run_site(
    ansible,
    hosts: dict,
    kubeconfig: str,
    tags: str = "device_plugin",
    extra_vars: dict | None = None,
    env_extra: dict | None = None,
):
    inventory = ansible.inventory(
        hosts, kubegpu_device_plugin_wait_timeout=30, kubegpu_validation_timeout=30, **(extra_vars or {})
    )
    return ansible.playbook(
        ansible.site,
        "--tags",
        tags,
        "-e",
        f"kubegpu_kubeconfig={kubeconfig}",
        inventory=inventory,
        env=env_extra,
        timeout=240,
    )


def _pci_gpus_here() -> int:
    count = 0
    for device in Path("/sys/bus/pci/devices").glob("*"):
        try:
            vendor = (device / "vendor").read_text().strip()
            klass = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith(("0x0300", "0x0302")):
            count += 1
    return count


def test_site_waits_for_each_nodes_count_and_reports_it(ansible, tmp_path):
    detected = _pci_gpus_here()
    nodes = [SimNode("gpu-a", gpus=8), SimNode("gpu-b", gpus=4), SimNode("this-host", gpus=detected)]
    with SimCluster(nodes=nodes, capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        hosts = {
            "gpu-a": {"kubegpu_gpu_count": 8},
            # The inventory name is not the node name here.
            "gpu-b.example.internal": {"kubegpu_gpu_count": "4", "kubegpu_node_name": "gpu-b"},
            # No count given: the play counts NVIDIA GPUs on this machine's PCI bus.
            "this-host": {},
        }
        # The nodes' own checks need nvidia-smi: here the wait is what is tested (validation has its own tests).
        hosts["gpu-a"]["kubegpu_validate"] = False
        hosts["gpu-b.example.internal"]["kubegpu_validate"] = False
        hosts["this-host"]["kubegpu_validate"] = False
        completed = _run_site(ansible, hosts, kubeconfig)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        node_a = cluster.get_object("Node", "gpu-a")
        assert node_a["status"]["capacity"]["nvidia.com/gpu"] == "8"
        daemonset = cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
        assert daemonset is not None
    assert "failed=0" in output


def test_site_refuses_a_gpu_count_that_is_not_a_number(ansible, tmp_path):
    with SimCluster(nodes=[SimNode("gpu-a", gpus=8)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = _run_site(ansible, {"gpu-a": {"kubegpu_gpu_count": "eight"}}, kubeconfig)
        daemonset = cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output
    assert "kubegpu_gpu_count of gpu-a is eight" in output
    # Refused before anything reached the cluster.
    assert daemonset is None


# ----- GPU labels and validation --------------------------------------------------------------------------------

# What the nvidia_driver role writes to /etc/ansible/facts.d/nvidia.fact (the shape site.yml reads).
NVIDIA_FACT = {
    "installed_version": "550.163.01",
    "loaded_version": "550.163.01",
    "branch": "550",
    "cuda_version": "12.4",
    "reboot_required": False,
    "gpus": [
        {
            "index": i,
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": f"GPU-{i}",
            "memory_total_mib": 81920,
            "compute_capability": "8.0",
        }
        for i in range(4)
    ],
}


def _standins(tmp_path: Path, smi_exit: int = 0) -> dict:
    """A stand-in nvidia-smi on PATH (4 GPUs, or a failure) and a facts folder with nvidia.fact."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    if smi_exit:
        smi.write_text(
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\n"
            f"exit {smi_exit}\n"
        )
    else:
        smi.write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "$i, NVIDIA A100-SXM4-80GB, GPU-$i"; done\n')
    smi.chmod(0o755)
    facts = tmp_path / "facts.d"
    facts.mkdir()
    (facts / "nvidia.fact").write_text(json.dumps(NVIDIA_FACT))
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "facts": str(facts)}


def _gpu_hosts(facts_dir: str, **extra: object) -> dict:
    common = {"kubegpu_gpu_count": 4, "kubegpu_facts_dir": facts_dir, "kubegpu_validate_container": False, **extra}
    return {"gpu-a": dict(common), "gpu-b": dict(common)}


def test_site_labels_nodes_and_validates_them(ansible, tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = _run_site(
            ansible,
            _gpu_hosts(standins["facts"]),
            kubeconfig,
            tags="all",
            env_extra={"PATH": standins["PATH"]},
            extra_vars={},
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        node = cluster.get_object("Node", "gpu-b")
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert labels["nvidia.com/gpu.count"] == "4"
        assert labels["nvidia.com/gpu.memory"] == "81920"
        assert labels["nvidia.com/gpu.family"] == "ampere"
        assert labels["nvidia.com/cuda.driver-version.major"] == "550"
        assert labels["kubernetes.io/hostname"] == "gpu-b"  # the kubelet's labels stay
        owner = [m for m in node["metadata"]["managedFields"] if m["manager"] == "kubegpu.node-gpu-labels"]
        assert owner and set(owner[0]["fieldsV1"]) == {"f:metadata"}
        assert set(owner[0]["fieldsV1"]["f:metadata"]) == {"f:labels"}
        # Validation left nothing behind.
        assert cluster.get_object("Namespace", "kubegpu-validation") is None
        assert not [p for p in cluster.list_objects("pods") if p["metadata"]["namespace"] == "kubegpu-validation"]
        # A pod ran nvidia-smi -L on each node, and the scheduler left exactly the surplus pod Pending.
        table = [
            line.strip().strip('",') for line in output.splitlines() if line.strip().startswith(('"gpu-a ', '"gpu-b '))
        ]
        assert len(table) == 2, output
        for line in table:
            assert "ok (4 GPUs)" in line and "ok: GPU 0: NVIDIA A100-SXM4-80GB" in line, line
            assert "ok: surplus pod Pending (Insufficient nvidia.com/gpu)" in line, line

        # A second run changes nothing: labels are applied as they are, validation leaves nothing behind.
        again = _run_site(
            ansible, _gpu_hosts(standins["facts"]), kubeconfig, tags="all", env_extra={"PATH": standins["PATH"]}
        )
        assert again.returncode == 0, again.output
        assert again.unchanged(["gpu-a", "gpu-b"]) == [], again.stdout


def test_labels_auto_leaves_gpu_feature_discovery_nodes_alone_static_takes_over(ansible, tmp_path):
    standins = _standins(tmp_path)
    gfd = {"nvidia.com/gfd.timestamp": "1700000000", "nvidia.com/gpu.product": "Tesla-T4"}
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4, labels=gfd)]) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = _run_site(ansible, _gpu_hosts(standins["facts"]), kubeconfig, tags="labels")
        assert completed.returncode == 0, completed.stdout
        assert (
            cluster.get_object("Node", "gpu-a")["metadata"]["labels"]["nvidia.com/gpu.product"]
            == "NVIDIA-A100-SXM4-80GB"
        )
        assert cluster.get_object("Node", "gpu-b")["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
        assert "GPU feature discovery labels it" in completed.stdout

        static = _run_site(
            ansible,
            _gpu_hosts(standins["facts"]),
            kubeconfig,
            tags="labels",
            extra_vars={"kubegpu_gpu_labels": "static"},
        )
        assert static.returncode == 0, static.stdout
        assert (
            cluster.get_object("Node", "gpu-b")["metadata"]["labels"]["nvidia.com/gpu.product"]
            == "NVIDIA-A100-SXM4-80GB"
        )


def test_validation_failure_names_the_node_and_cleans_up(ansible, tmp_path):
    standins = _standins(tmp_path, smi_exit=9)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = _run_site(
            ansible,
            _gpu_hosts(standins["facts"]),
            kubeconfig,
            tags="device_plugin",
            env_extra={"PATH": standins["PATH"]},
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        assert "GPU validation failed. Nodes that did not pass: gpu-a, gpu-b." in output
        assert "FAILED: exit 9: NVIDIA-SMI has failed" in output
        assert cluster.get_object("Namespace", "kubegpu-validation") is None
