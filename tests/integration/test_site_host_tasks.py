"""What site.yml's no-op run costs each host in host-tasks, and the messages and failures of the steps cut for it.

Ansible's main process spends about as much on a host-task that a `when` skips as on one that runs (bench/RESULTS.md,
"After the round-trip work": 8.5 ms each, a worker forked either way), so a 1,000-node drift check (issue 18,
"Performance") is bound by the host-tasks per host. The first test counts them on a second, no-op run of site.yml
against kubesim (the role chain off through its switches, as everywhere here: its includes still count) with a test
callback (tests/integration/host_tasks/host_tasks.py) that writes a line per host-task Ansible starts, and holds each
play to what it costs now. A step added to a no-op run is paid for elsewhere, or the bound is raised on purpose, with
the projection of bench/RESULTS.md in mind. The other tests keep what the cut folded together: the gpu_health role's
report and its failure (gpu_health_fail_on), its facts written only when the verdict changes, and the labels step's
reasons and its failure for static labels without facts.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from kubesim import SimCluster, SimNode
from test_gpu_health_site import _host
from test_site_playbook import _gpu_hosts, _run_site, _standins

CALLBACKS = Path(__file__).resolve().parent / "host_tasks"
# Host-tasks each host costs on a no-op run, per play, its run_once tasks left out (they cost once a play or a batch):
# preflight 13 and batch 29 before the site's own steps were cut (2026-11-26: the labels' and gpu_health's includes,
# set_facts and guards; 33 of the site's own steps, 21 after), with the chain's includes (5 in each play) and
# gpu_health's role included; 10 and 17 after the second cut (2026-11-28: the kubelet's preflight and plan in one
# include, the PCI GPU count by kubegpu.node.nvidia_pci_gpus without a set_fact, gpu_health's note gone). Then
# (2026-11-29) preflight 12 and batch 15: the preflight's node layer is one call for every role of the chain, with
# the facts gathered in it (its action, its files' include_vars, its renamed variables' set_fact: two more here, where
# the chain is off and no role's layer ran before; on the fleet, with the chain on, seven fewer: bench/RESULTS.md),
# and the batch reads the chain once (kubegpu.node.chain_plan) and includes only its steps with anything to do, in
# one include of playbooks/tasks/chain.yml (here two host-tasks where the four roles' includes were four; with the
# chain on, 2 for 32).
BOUNDS = {"preflight": 12, "batch": 15}
PLAYS = {"Preflight": "preflight", "Make GPU nodes ready": "batch", "Deploy NVIDIA's device plugin": "cluster"}


def _play(name: str) -> str:
    return next(label for prefix, label in PLAYS.items() if name.startswith(prefix))


def test_a_no_op_run_costs_each_host_at_most_the_host_tasks_it_costs_now(ansible, tmp_path):
    standins = _standins(tmp_path)
    record = tmp_path / "host_tasks.jsonl"
    env = {
        "PATH": standins["PATH"],
        "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
        "ANSIBLE_CALLBACKS_ENABLED": "host_tasks",
        "KUBEGPU_HOST_TASKS_FILE": str(record),
    }
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)], capacity_delay=0.2) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        first = _run_site(ansible, _gpu_hosts(standins), kubeconfig, tags="all", skip_tags="none", env_extra=env)
        assert first.returncode == 0, first.stdout
        record.unlink()
        again = _run_site(ansible, _gpu_hosts(standins), kubeconfig, tags="all", skip_tags="none", env_extra=env)
        assert again.returncode == 0, again.stdout
        assert again.unchanged(["gpu-a", "gpu-b"]) == [], again.stdout
    tasks = [json.loads(line) for line in record.read_text().splitlines()]
    per_host = Counter((_play(t["play"]), t["host"]) for t in tasks if not t["run_once"])
    for host in ("gpu-a", "gpu-b"):
        for play, bound in BOUNDS.items():
            names = [t["task"] for t in tasks if _play(t["play"]) == play and t["host"] == host and not t["run_once"]]
            assert per_host[(play, host)] <= bound, f"{host}, {play} play: {len(names)} host-tasks: {names}"


def _role_play(tmp_path: Path, **options: object) -> Path:
    """A playbook of the gpu_health role alone (include_role: rolespec_validate false shows the action's own check)."""
    play = [
        {
            "hosts": "gpu_nodes",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "GPU health",
                    "ansible.builtin.include_role": {"name": "kubegpu.node.gpu_health", **options},
                }
            ],
        }
    ]
    path = tmp_path / "gpu_health.yml"
    path.write_text(json.dumps(play))
    return path


def _role_vars(host: dict) -> dict:
    return {
        "gpu_health_nvidia_smi": host["gpu_health_nvidia_smi"],
        "gpu_health_kernel_log_file": host["gpu_health_kernel_log_file"],
        "gpu_health_pci_devices_dir": host["gpu_health_pci_devices_dir"],
        "gpu_health_facts_dir": host["kubegpu_facts_dir"],
    }


def test_the_role_reports_records_then_fails_for_gpu_health_fail_on_and_a_no_op_writes_nothing(ansible, tmp_path):
    xid = "kernel: NVRM: Xid (PCI:0000:47:00): 48, pid=1, name=python3, An uncorrectable double bit error (DBE)\n"
    host = _role_vars(_host(tmp_path, "gpu-b", "smi_ecc.xml", kernel=xid))
    fact = Path(host["gpu_health_facts_dir"]) / "nvidia_health.fact"
    playbook = _role_play(tmp_path)

    failing = ansible.playbook(
        playbook, inventory=ansible.inventory({"gpu-b": {**host, "gpu_health_fail_on": "failed"}})
    )
    assert failing.returncode != 0, failing.output
    # The failure says why, with every reason; the verdict was recorded first.
    assert "gpu-b's GPUs are failed (gpu_health_fail_on is failed): failed (reset): 2 of 4 GPU(s)" in failing.stdout
    assert "uncorrectable ECC error(s) since the driver loaded (volatile) -> reset" in failing.stdout
    assert "Xid 48: Double bit ECC error (uncorrectable memory error)" in failing.stdout
    assert json.loads(fact.read_text())["verdict"] == "failed"
    written = fact.stat()

    reporting = ansible.playbook(playbook, inventory=ansible.inventory({"gpu-b": host}))
    assert reporting.returncode == 0, reporting.output
    assert reporting.unchanged(["gpu-b"]) == [], reporting.stdout
    # The report at the default verbosity, and the file the verdict is already in left as it was.
    assert '"msg": [\n        "failed (reset): 2 of 4 GPU(s)' in reporting.stdout, reporting.stdout
    assert "Write the verdict" not in reporting.stdout
    after = fact.stat()
    assert (after.st_ino, after.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)

    # A setting the role does not know is refused before the node is read: by the argument specs, and by the action
    # itself where they are not checked.
    for options, said in (
        ({}, "value of gpu_health_fail_on must be one of: none, degraded, failed, got: sometimes"),
        ({"rolespec_validate": False}, "gpu_health_fail_on must be none, degraded or failed, not sometimes."),
    ):
        refused = ansible.playbook(
            _role_play(tmp_path, **options),
            inventory=ansible.inventory({"gpu-b": {**host, "gpu_health_fail_on": "sometimes"}}),
        )
        assert refused.returncode != 0 and said in refused.stdout, refused.output


def test_the_labels_step_says_why_a_node_gets_none_and_fails_static_labels_without_facts(ansible, tmp_path):
    standins = _standins(tmp_path)
    hosts = _gpu_hosts(standins)
    (Path(standins["facts"]["gpu-b"]) / "nvidia.fact").unlink()  # gpu-b: the driver role never ran
    hosts["gpu-c"] = {**hosts["gpu-a"]}  # gpu-c: not a node of the cluster yet
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)]) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        auto = _run_site(ansible, hosts, kubeconfig, tags="labels")
        assert auto.returncode == 0, auto.output
        assert cluster.get_object("Node", "gpu-a")["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"
        assert "nvidia.com/gpu.count" not in cluster.get_object("Node", "gpu-b")["metadata"]["labels"]
        assert (
            "gpu-b: no GPU labels applied, the nvidia facts (ansible_local.nvidia, written by the nvidia_driver role)"
            " show no GPU." in auto.stdout
        ), auto.stdout
        assert "gpu-c: no GPU labels applied, it is not a node of the cluster yet." in auto.stdout
        assert "gpu-c is not a node of the cluster (no Node named gpu-c)" in auto.stdout

        static = _run_site(ansible, hosts, kubeconfig, tags="labels", extra_vars={"kubegpu_gpu_labels": "static"})
        assert static.returncode != 0, static.output
        assert "kubegpu_gpu_labels is static but gpu-b has no GPU in its nvidia facts" in static.stdout, static.stdout
        assert static.recap["gpu-b"]["failed"] == 1, static.stdout


def test_site_refuses_a_gpu_health_setting_in_its_preflight_before_any_host_changes(ansible, tmp_path):
    # The gpu_health role's variables are checked with the playbook's, once, in the preflight play (the batch's import
    # of the role skips its own check).
    standins = _standins(tmp_path)
    hosts = _gpu_hosts(standins)
    hosts["gpu-b"]["gpu_health_fail_on"] = "sometimes"
    with SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4)]) as cluster:
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"))
        refused = _run_site(ansible, hosts, kubeconfig, tags="gpu_health,labels")
        assert refused.returncode != 0, refused.output
        assert "value of gpu_health_fail_on must be one of: none, degraded, failed, got: sometimes" in refused.stdout
        assert "PLAY [Make GPU nodes ready" not in refused.stdout, refused.stdout
        assert "nvidia.com/gpu.count" not in cluster.get_object("Node", "gpu-a")["metadata"]["labels"]
