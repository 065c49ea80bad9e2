"""playbooks/site.yml's device-plugin play, run for real against the simulated API server.

The hosts are reached with the local connection and only the `device_plugin` tag runs (the container_runtime role
has its own molecule scenarios), so what is tested is how the playbook turns inventory into the module's wait.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubesim import SimCluster, SimNode

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook is not on PATH")


def _run_site(tmp_path: Path, hosts: dict, kubeconfig: str) -> subprocess.CompletedProcess:
    inventory = {
        "all": {
            "children": {"gpu_nodes": {"hosts": hosts}},
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                # The play asks for become; these hosts are this machine, already root or not, without sudo.
                "ansible_become": False,
                "kubegpu_device_plugin_wait_timeout": 30,
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.environ.get("ANSIBLE_COLLECTIONS_PATH") or str(REPO / ".tmp" / "collections"),
        ANSIBLE_NOCOLOR="true",
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    return subprocess.run(
        [
            "ansible-playbook",
            str(REPO / "playbooks" / "site.yml"),
            "-i",
            str(tmp_path / "inventory.yml"),
            "--tags",
            "device_plugin",
            "-e",
            f"kubegpu_kubeconfig={kubeconfig}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        check=False,
        cwd=tmp_path,
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


def test_site_waits_for_each_nodes_count_and_reports_it(tmp_path):
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
        completed = _run_site(tmp_path, hosts, kubeconfig)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        node_a = cluster.get_object("Node", "gpu-a")
        assert node_a["status"]["capacity"]["nvidia.com/gpu"] == "8"
        daemonset = cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
        assert daemonset is not None
    assert "failed=0" in output


def test_site_refuses_a_gpu_count_that_is_not_a_number(tmp_path):
    with SimCluster(nodes=[SimNode("gpu-a", gpus=8)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = _run_site(tmp_path, {"gpu-a": {"kubegpu_gpu_count": "eight"}}, kubeconfig)
        daemonset = cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output
    assert "kubegpu_gpu_count of gpu-a is eight" in output
    # Refused before anything reached the cluster.
    assert daemonset is None
