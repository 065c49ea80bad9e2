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
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubesim import SimCluster, SimNode
from kubesim.resources import resource_for

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-playbook is not on PATH")


def _site(
    tmp_path: Path,
    hosts: dict,
    kubeconfig: str,
    tags: str = "device_plugin",
    extra_vars: dict | None = None,
    env_extra: dict | None = None,
    skip_tags: str = "nvidia_driver,nvidia_container_toolkit,container_runtime,kubelet",
    extra_args: tuple[str, ...] = (),
    inventory_name: str = "inventory.yml",
) -> tuple[list[str], dict[str, str]]:
    """The ansible-playbook command line and environment of one site.yml run over ``hosts``."""
    inventory = {
        "all": {
            "children": {"gpu_nodes": {"hosts": hosts}},
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                # The play asks for become; these hosts are this machine, already root or not, without sudo.
                "ansible_become": False,
                "kubegpu_device_plugin_wait_timeout": 30,
                "kubegpu_validation_timeout": 30,
                # Twice safe: the role chain must never run on this machine.
                "kubegpu_nvidia_driver": False,
                "kubegpu_nvidia_container_toolkit": False,
                "kubegpu_container_runtime": False,
                "kubegpu_kubelet": False,
                **(extra_vars or {}),
            },
        }
    }
    (tmp_path / inventory_name).write_text(yaml.safe_dump(inventory))
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.environ.get("ANSIBLE_COLLECTIONS_PATH") or str(REPO / ".tmp" / "collections"),
        ANSIBLE_NOCOLOR="true",
        ANSIBLE_STDOUT_CALLBACK="default",
        **(env_extra or {}),
    )
    argv = [
        "ansible-playbook",
        str(REPO / "playbooks" / "site.yml"),
        "-i",
        str(tmp_path / inventory_name),
        "--tags",
        tags,
        "--skip-tags",
        skip_tags,
        "-e",
        f"kubegpu_kubeconfig={kubeconfig}",
        *extra_args,
    ]
    return argv, env


def _run_site(tmp_path: Path, hosts: dict, kubeconfig: str, **options: Any) -> subprocess.CompletedProcess:
    argv, env = _site(tmp_path, hosts, kubeconfig, **options)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path)


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
        # The nodes' own checks need nvidia-smi: here the wait is what is tested (validation has its own tests).
        hosts["gpu-a"]["kubegpu_validate"] = False
        hosts["gpu-b.example.internal"]["kubegpu_validate"] = False
        hosts["this-host"]["kubegpu_validate"] = False
        completed = _run_site(tmp_path, hosts, kubeconfig)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        node_a = cluster.get_object("Node", "gpu-a")
        assert node_a["status"]["capacity"]["nvidia.com/gpu"] == "8"
        daemonset = cluster.get_object("DaemonSet", "nvidia-device-plugin-daemonset", "kube-system")
        assert daemonset is not None
        assert "failed=0" in output
        # kubegpu_validate: false (a boolean, deprecated) meant none: nothing was validated.
        assert "Validating" not in output and "is deprecated: it means none" in " ".join(output.split())
        # --skip-tags validate leaves the device plugin step with what it needs.
        for values in hosts.values():
            del values["kubegpu_validate"]
        # (The PCI count is tagged validate too: without it this host would be expected to report GPUs.)
        hosts["this-host"]["kubegpu_gpu_count"] = detected
        skipped = _run_site(
            tmp_path,
            hosts,
            kubeconfig,
            skip_tags="nvidia_driver,nvidia_container_toolkit,container_runtime,kubelet,validate",
        )
        assert skipped.returncode == 0, skipped.stdout
        assert "Validating" not in skipped.stdout and "changed=0" in skipped.stdout


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
    """A stand-in nvidia-smi on PATH (4 GPUs, or a failure) and a facts folder per host with nvidia.fact."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if smi_exit:
        smi.write_text(
            "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\n"
            f"exit {smi_exit}\n"
        )
    else:
        smi.write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "$i, NVIDIA A100-SXM4-80GB, GPU-$i"; done\n')
    smi.chmod(0o755)
    facts = {}
    for host in ("gpu-a", "gpu-b"):
        folder = tmp_path / f"facts-{host}"
        folder.mkdir(exist_ok=True)
        (folder / "nvidia.fact").write_text(json.dumps(NVIDIA_FACT))
        facts[host] = str(folder)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "facts": facts}


def _set_driver(standins: dict, host: str, version: str) -> None:
    """What the nvidia_driver role's facts say after a driver upgrade on ``host``."""
    path = Path(standins["facts"][host]) / "nvidia.fact"
    facts = json.loads(path.read_text())
    facts.update(installed_version=version, loaded_version=version)
    path.write_text(json.dumps(facts))


def _gpu_hosts(standins: dict, hosts: tuple[str, ...] = ("gpu-a", "gpu-b"), **extra: object) -> dict:
    return {
        host: {
            "kubegpu_gpu_count": 4,
            "kubegpu_facts_dir": standins["facts"][host],
            "kubegpu_validate_container": False,
            **extra,
        }
        for host in hosts
    }


def _table(output: str) -> dict[str, str]:
    """The validation table's rows by node, as the debug task prints them."""
    rows = {}
    for line in output.splitlines():
        if line.strip().startswith(('"gpu-a ', '"gpu-b ')):
            text = line.strip().strip('",')
            rows[text.split()[0]] = text
    return rows


def _validation_pods(cluster: SimCluster, since: int = 0) -> list[dict]:
    return [c for c in cluster.creations("pods")[since:] if c["namespace"] == "kubegpu-validation"]


def _pods_for(created: list[dict], node: str) -> list[dict]:
    return [c for c in created if c["name"].startswith(f"kubegpu-smi-{node}-")]


def _record(cluster: SimCluster, node: str) -> dict | None:
    text = (cluster.get_object("Node", node)["metadata"].get("annotations") or {}).get("kubegpu.node/validated")
    return json.loads(text) if text else None


def _left_in_namespace(cluster: SimCluster) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in cluster.list_objects("pods")
        if p["metadata"]["namespace"] == "kubegpu-validation"
    ]


def test_site_labels_nodes_and_validates_them_then_a_second_run_starts_no_pod(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        # Check mode first: the node checks read, nothing reaches the cluster, no node fails for the GPUs that the
        # device plugin (not applied) does not report yet.
        checked = _run_site(
            tmp_path,
            _gpu_hosts(standins),
            kubeconfig,
            tags="all",
            env_extra={"PATH": standins["PATH"]},
            extra_args=("--check",),
        )
        assert checked.returncode == 0, checked.stdout
        assert "not run (check mode)" in _table(checked.stdout)["gpu-a"], checked.stdout
        assert cluster.creations("pods") == [] and cluster.get_object("Namespace", "kubegpu-validation") is None
        completed = _run_site(
            tmp_path, _gpu_hosts(standins), kubeconfig, tags="all", env_extra={"PATH": standins["PATH"]}
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
        # A pod ran nvidia-smi -L on each node, and the scheduler left exactly the surplus pod Pending.
        table = _table(output)
        assert set(table) == {"gpu-a", "gpu-b"}, output
        for line in table.values():
            assert "ok (4 GPUs)" in line and "ok: GPU 0: NVIDIA A100-SXM4-80GB" in line, line
            assert "ok: surplus pod Pending (Insufficient nvidia.com/gpu)" in line, line
        # The run's pods passed Pod Security's restricted profile (the namespace enforces it; kubesim refuses
        # others), had the lowest priority, never preempting, and are gone; the shared namespace and class stay.
        namespace = cluster.get_object("Namespace", "kubegpu-validation")
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        priority = cluster.get_object("PriorityClass", "kubegpu-validation")
        assert priority["value"] < 0 and priority["preemptionPolicy"] == "Never"
        assert _left_in_namespace(cluster) == []
        created = _validation_pods(cluster)
        assert len(created) == 6 and len({c["labels"]["kubegpu.node/run"] for c in created}) == 1
        # Each node carries what it passed with.
        assert _record(cluster, "gpu-a")["driver"] == "550.163.01"

        # A second run changes nothing and starts no pod: both nodes passed with the driver and toolkit they run.
        before = len(cluster.creations("pods"))
        again = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, tags="all", env_extra={"PATH": standins["PATH"]})
        assert again.returncode == 0, again.stdout
        assert "changed=0" in again.stdout and "changed=1" not in again.stdout, again.stdout
        assert cluster.creations("pods")[before:] == []
        assert "Validating 0 of 2 nodes" in again.stdout
        assert "gpu-a: not validated: validated with driver 550.163.01" in again.stdout


def test_a_changed_run_validates_only_the_node_whose_driver_changed(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        first = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, tags="all", env_extra={"PATH": standins["PATH"]})
        assert first.returncode == 0, first.stdout
        record_a = _record(cluster, "gpu-a")
        before = len(cluster.creations("pods"))
        _set_driver(standins, "gpu-b", "580.95.05")
        second = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, tags="all", env_extra={"PATH": standins["PATH"]})
        output = second.stdout + second.stderr
        assert second.returncode == 0, output
        created = _validation_pods(cluster, before)
        assert _pods_for(created, "gpu-b") and not _pods_for(created, "gpu-a"), created
        assert set(_table(output)) == {"gpu-b"}, output
        assert "gpu-b: validated: validated with driver 550.163.01, toolkit none; it runs driver 580.95.05" in output
        assert _record(cluster, "gpu-b")["driver"] == "580.95.05"
        assert _record(cluster, "gpu-a") == record_a

        # kubegpu_validate as AWX and -e pass it, a string: "true" still means every node (deprecated), "all" too.
        before = len(cluster.creations("pods"))
        forced = _run_site(
            tmp_path,
            _gpu_hosts(standins),
            kubeconfig,
            env_extra={"PATH": standins["PATH"]},
            extra_args=("-e", "kubegpu_validate=true"),
        )
        output = forced.stdout + forced.stderr
        assert forced.returncode == 0, output
        assert "kubegpu_validate: 'true' is deprecated: it means all" in " ".join(output.split()), output
        created = _validation_pods(cluster, before)
        assert _pods_for(created, "gpu-a") and _pods_for(created, "gpu-b")
        # Validating again with the same versions rewrites no record.
        assert "changed=0" in forced.stdout, forced.stdout

        refused = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, extra_args=("-e", "kubegpu_validate=sometimes"))
        assert refused.returncode != 0
        assert "kubegpu_validate must be all, changed or none" in " ".join(refused.stdout.split()), refused.stdout
        refused = _run_site(
            tmp_path, _gpu_hosts(standins), kubeconfig, extra_args=("-e", "kubegpu_validation_namespace=default")
        )
        assert refused.returncode != 0
        assert "kubegpu_validation_namespace is default: the validation needs a namespace of its own" in " ".join(
            refused.stdout.split()
        ), refused.stdout
        assert "pod-security.kubernetes.io/enforce" not in (
            cluster.get_object("Namespace", "default")["metadata"].get("labels") or {}
        )


def _workload(name: str, node: str, gpus: int, priority_class: str | None = None) -> dict:
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [
            {
                "name": "train",
                "image": "registry.example/train:1",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _running(cluster: SimCluster, name: str) -> dict | None:
    pod = cluster.get_object("Pod", name, "default")
    return pod if pod and pod["status"].get("phase") == "Running" else None


def test_a_busy_node_is_skipped_its_idle_neighbour_passes_and_the_workload_is_untouched(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        # The device plugin first (no validation), so that the workload can take gpu-b's four GPUs.
        ready = _run_site(tmp_path, _gpu_hosts(standins, kubegpu_validate="none"), kubeconfig)
        assert ready.returncode == 0, ready.stdout
        cluster.create_object(_workload("train-0", "gpu-b", 4))
        assert cluster.wait_for(lambda: _running(cluster, "train-0"))
        uid = cluster.get_object("Pod", "train-0", "default")["metadata"]["uid"]
        before = len(cluster.creations("pods"))

        completed = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, env_extra={"PATH": standins["PATH"]})
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        table = _table(output)
        assert "skipped: 4/4 in use" in table["gpu-b"] and "FAILED" not in table["gpu-b"], output
        assert "4 (4 in use)" in table["gpu-b"]
        assert "ok: GPU 0" in table["gpu-a"] and "ok: surplus pod Pending" in table["gpu-a"], output
        # The workload kept running, as the same pod; nothing was preempted; no validation pod went to gpu-b.
        assert _running(cluster, "train-0")["metadata"]["uid"] == uid
        assert cluster.preemptions() == []
        assert not _pods_for(_validation_pods(cluster, before), "gpu-b")
        # gpu-a passed and carries its record; gpu-b was not validated, so it has none (the next run tries again).
        assert _record(cluster, "gpu-a") is not None and _record(cluster, "gpu-b") is None


def test_a_partly_busy_node_is_checked_with_its_free_gpus_and_never_preempts_even_lower_priority_work(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        ready = _run_site(tmp_path, _gpu_hosts(standins, kubegpu_validate="none"), kubeconfig)
        assert ready.returncode == 0, ready.stdout
        # A batch class below even the validation's: only preemptionPolicy Never keeps the surplus pod from evicting it.
        cluster.create_object(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": "scavenger"},
                "value": -2_000_000_000,
            }
        )
        cluster.create_object(_workload("scavenger-0", "gpu-b", 2, priority_class="scavenger"))
        assert cluster.wait_for(lambda: _running(cluster, "scavenger-0"))
        uid = cluster.get_object("Pod", "scavenger-0", "default")["metadata"]["uid"]

        completed = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, env_extra={"PATH": standins["PATH"]})
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        row = _table(output)["gpu-b"]
        # The workload holds GPUs 0 and 1: the nvidia-smi pod gets one of the others.
        assert "4 (2 in use)" in row and "ok: GPU 2" in row and "ok: surplus pod Pending" in row, output
        assert _running(cluster, "scavenger-0")["metadata"]["uid"] == uid
        assert cluster.preemptions() == []


def _spawn(tmp_path: Path, hosts: dict, kubeconfig: str, name: str, **options: Any) -> subprocess.Popen:
    argv, env = _site(tmp_path, hosts, kubeconfig, inventory_name=f"{name}.yml", **options)
    log = (tmp_path / f"{name}.log").open("w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)


def _finish(tmp_path: Path, process: subprocess.Popen, name: str) -> tuple[int, str]:
    code = process.wait(timeout=300)
    return code, (tmp_path / f"{name}.log").read_text()


def test_two_runs_at_once_on_two_node_pools_both_pass_and_keep_to_their_own_pods(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        env = {"PATH": standins["PATH"]}
        runs = {
            name: _spawn(tmp_path, _gpu_hosts(standins, (host,)), kubeconfig, name, env_extra=env)
            for name, host in (("pool-a", "gpu-a"), ("pool-b", "gpu-b"))
        }
        results = {name: _finish(tmp_path, process, name) for name, process in runs.items()}
        for name, (code, output) in results.items():
            assert code == 0, f"{name}:\n{output}"
        created = _validation_pods(cluster)
        run_of = {
            node: {c["labels"]["kubegpu.node/run"] for c in created if f"-{node}-" in c["name"]}
            for node in ("gpu-a", "gpu-b")
        }
        # One run per pool, each with its own id; every pod of a run is on its own pool's node.
        assert len(run_of["gpu-a"]) == 1 and len(run_of["gpu-b"]) == 1 and run_of["gpu-a"] != run_of["gpu-b"]
        assert _left_in_namespace(cluster) == []
        assert "ok: surplus pod Pending" in _table(results["pool-a"][1])["gpu-a"]
        assert "ok: surplus pod Pending" in _table(results["pool-b"][1])["gpu-b"]


def test_two_awx_job_slices_at_once_each_validate_their_own_hosts(tmp_path):
    # AWX job slicing runs the same job template on disjoint slices of the inventory at once, one job each (so one
    # awx_job_id each); here, one inventory and --limit per slice.
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        hosts = _gpu_hosts(standins)
        env = {"PATH": standins["PATH"]}
        runs = {
            f"slice-{job}": _spawn(
                tmp_path,
                hosts,
                kubeconfig,
                f"slice-{job}",
                env_extra=env,
                extra_args=("--limit", host, "-e", f"awx_job_id={job}"),
            )
            for job, host in ((101, "gpu-a"), (102, "gpu-b"))
        }
        results = {name: _finish(tmp_path, process, name) for name, process in runs.items()}
        for name, (code, output) in results.items():
            assert code == 0, f"{name}:\n{output}"
            # Each slice preflights and validates only its own hosts.
            assert "Validating 1 of 1 nodes" in output, output
        created = _validation_pods(cluster)
        assert {c["name"] for c in created if c["labels"]["kubegpu.node/run"] == "awx-101"} == {
            f"kubegpu-{check}-gpu-a-awx-101" for check in ("smi", "holder", "surplus")
        }
        assert {c["name"] for c in created if c["labels"]["kubegpu.node/run"] == "awx-102"} == {
            f"kubegpu-{check}-gpu-b-awx-102" for check in ("smi", "holder", "surplus")
        }
        assert _left_in_namespace(cluster) == []


def test_labels_auto_leaves_gpu_feature_discovery_nodes_alone_static_takes_over(tmp_path):
    standins = _standins(tmp_path)
    gfd = {"nvidia.com/gfd.timestamp": "1700000000", "nvidia.com/gpu.product": "Tesla-T4"}
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4, labels=gfd)]) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        completed = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, tags="labels")
        assert completed.returncode == 0, completed.stdout
        assert (
            cluster.get_object("Node", "gpu-a")["metadata"]["labels"]["nvidia.com/gpu.product"]
            == "NVIDIA-A100-SXM4-80GB"
        )
        assert cluster.get_object("Node", "gpu-b")["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
        assert "GPU feature discovery labels it" in completed.stdout

        static = _run_site(
            tmp_path,
            _gpu_hosts(standins),
            kubeconfig,
            tags="labels",
            extra_vars={"kubegpu_gpu_labels": "static"},
        )
        assert static.returncode == 0, static.stdout
        assert (
            cluster.get_object("Node", "gpu-b")["metadata"]["labels"]["nvidia.com/gpu.product"]
            == "NVIDIA-A100-SXM4-80GB"
        )


def test_validation_failure_names_the_nodes_removes_their_records_and_its_pods(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        passed = _run_site(tmp_path, _gpu_hosts(standins), kubeconfig, env_extra={"PATH": standins["PATH"]})
        assert passed.returncode == 0, passed.stdout
        assert _record(cluster, "gpu-a") is not None
        (tmp_path / "broken").mkdir()
        broken = _standins(tmp_path / "broken", smi_exit=9)
        completed = _run_site(
            tmp_path,
            _gpu_hosts(standins),
            kubeconfig,
            env_extra={"PATH": broken["PATH"]},
            extra_args=("-e", "kubegpu_validate=all"),
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        assert "GPU validation failed. Nodes that did not pass: gpu-a, gpu-b." in output
        assert "FAILED: exit 9: NVIDIA-SMI has failed" in output
        assert "Unknown error" not in output
        assert _left_in_namespace(cluster) == []
        # A node that failed loses its record: the next run validates it again.
        assert _record(cluster, "gpu-a") is None and _record(cluster, "gpu-b") is None


def test_an_api_refusal_is_reported_with_the_servers_message(tmp_path):
    standins = _standins(tmp_path)
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        # The validation namespace exists already, with a Pod Security level a platform team owns.
        namespace = {
            "metadata": {"name": "kubegpu-validation", "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}
        }
        cluster.api.apply(resource_for("namespace"), None, "kubegpu-validation", namespace, "platform-team", False)
        completed = _run_site(
            tmp_path, _gpu_hosts(standins, ("gpu-a",)), kubeconfig, env_extra={"PATH": standins["PATH"]}
        )
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        assert "Unknown error" not in output
        assert 'conflict with "platform-team"' in output, output
        assert "GPU validation failed: The validation pods' PriorityClass" in " ".join(output.split()), output
        assert "Namespace kubegpu-validation: Failed to apply object: Apply failed with 1 conflict" in output
