"""playbooks/site.yml's batches against kubesim: a host that becomes unreachable in its batch stops the roll-out (or,
with kubegpu_unreachable: continue, is left behind), and a cordon an earlier run left is finished.

The hosts are reached with the local connection and the role chain is off (as in test_site_playbook.py): what is tested
is the batch play's own handling. GPU labels, applied from a facts file the test writes, show which batches ran.

How a host becomes unreachable in its batch, and only there: its ansible_connection is `local` in the preflight play and
`ssh` to 127.0.0.1 port 1 in the other plays (an inventory variable templated on ansible_play_name). Nothing listens on
port 1, so the first task that reaches the host in its batch (reading its local facts for the labels) gets "Connection
refused" at once: UNREACHABLE, the same result a node that dropped off the network gives, with no timing involved.
"""

from __future__ import annotations

import json

from kubesim import SimCluster, SimNode
from kubesim.resources import BY_PLURAL
from test_site_playbook import NVIDIA_FACT  # what the nvidia_driver role writes

RECORD = "kubegpu.node/cordon"

# Reachable in the preflight play only.
UNREACHABLE_IN_ITS_BATCH = {
    "ansible_connection": "{{ 'local' if ansible_play_name is match('Preflight') else 'ssh' }}",
    "ansible_host": "127.0.0.1",
    "ansible_port": 1,
}


def _run_site(ansible, cluster: SimCluster, hosts: dict, extra_vars: dict | None = None):
    facts = ansible.workdir / "facts.d"
    facts.mkdir(exist_ok=True)
    (facts / "nvidia.fact").write_text(json.dumps(NVIDIA_FACT))
    inventory = ansible.inventory(
        hosts,
        kubegpu_kubeconfig=cluster.write_kubeconfig(str(ansible.workdir / "kubeconfig")),
        kubegpu_facts_dir=str(facts),
        kubegpu_gpu_labels="static",
        kubegpu_device_plugin=False,
        kubegpu_validate=False,
    )
    # No --skip-tags for the role chain (its variables turn it off): it would also skip the drain window, whose tasks
    # carry the roles' tags. Playbook variables go in with -e: serial is decided before any host's variables are read.
    return ansible.playbook(ansible.site, "-e", json.dumps(extra_vars or {}), inventory=inventory, skip_chain=False)


def _labelled(cluster: SimCluster, node: str) -> bool:
    return "nvidia.com/gpu.product" in (cluster.get_object("node", node)["metadata"].get("labels") or {})


def _cluster() -> SimCluster:
    return SimCluster(nodes=[SimNode(f"gpu-{x}", gpus=1) for x in "abcd"])


def _hosts() -> dict:
    # Two batches of two (kubegpu_serial: 2): gpu-b becomes unreachable in the first, beside gpu-a which finishes.
    return {"gpu-a": {}, "gpu-b": dict(UNREACHABLE_IN_ITS_BATCH), "gpu-c": {}, "gpu-d": {}}


def test_a_host_unreachable_in_its_batch_stops_the_roll_out(ansible):
    with _cluster() as cluster:
        completed = _run_site(ansible, cluster, _hosts(), {"kubegpu_serial": 2})
    output = completed.stdout + completed.stderr
    # Before: Ansible dropped gpu-b, max_fail_percentage did not count it, and gpu-c and gpu-d were configured.
    assert completed.returncode != 0, output
    assert "UNREACHABLE!" in output
    assert (
        "gpu-b became unreachable during GPU labels; not finished on it: GPU labels. The roll-out stops after this"
        " batch: the later batches (gpu-c, gpu-d) were not started, and the device plugin and validation do not run."
    ) in output
    labelled = {node: _labelled(cluster, node) for node in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")}
    assert labelled == {"gpu-a": True, "gpu-b": False, "gpu-c": False, "gpu-d": False}, output
    assert "PLAY [Deploy NVIDIA's device plugin" not in output


def test_kubegpu_unreachable_continue_carries_on_without_the_host(ansible):
    with _cluster() as cluster:
        completed = _run_site(ansible, cluster, _hosts(), {"kubegpu_serial": 2, "kubegpu_unreachable": "continue"})
    output = completed.stdout + completed.stderr
    # ansible-playbook's own exit status for a run with an unreachable host.
    assert completed.returncode == 4, output
    assert "gpu-b became unreachable during GPU labels" in output
    assert "Carrying on without it (kubegpu_unreachable: continue)" in output
    labelled = {node: _labelled(cluster, node) for node in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")}
    assert labelled == {"gpu-a": True, "gpu-b": False, "gpu-c": True, "gpu-d": True}, output
    assert "failed=0" in output.split("PLAY RECAP")[1]


def test_kubegpu_unreachable_is_checked_before_any_host_changes(ansible):
    with _cluster() as cluster:
        completed = _run_site(ansible, cluster, {"gpu-a": {}}, {"kubegpu_unreachable": "skip"})
        assert not _labelled(cluster, "gpu-a")
    assert completed.returncode != 0
    # site.yml's argument specs (playbooks/vars/site_argument_specs.yml), checked on every host in the preflight play.
    assert "value of kubegpu_unreachable must be one of: stop, continue, got: skip" in completed.stdout


def test_site_finishes_a_cordon_an_earlier_run_left_and_leaves_an_operators_alone(ansible):
    with _cluster() as cluster:
        record = {"by": "kubegpu.node site.yml", "reason": "held back for a drain window: reboot", "at": "T"}

        def recorded(node):
            node["spec"]["unschedulable"] = True
            node["metadata"].setdefault("annotations", {})[RECORD] = json.dumps(record)

        cluster.api.mutate(BY_PLURAL["nodes"], None, "gpu-a", recorded, "kubegpu.node")
        cluster.api.mutate(BY_PLURAL["nodes"], None, "gpu-b", lambda n: n["spec"].update(unschedulable=True), "ops")
        # Nothing is held back any more (the role chain is off): only the record opens gpu-a's window.
        completed = _run_site(ansible, cluster, {"gpu-a": {}, "gpu-b": {}})
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output
        node_a = cluster.get_object("node", "gpu-a")
        assert not node_a["spec"].get("unschedulable")
        assert RECORD not in (node_a["metadata"].get("annotations") or {})
        assert (
            "Drain node gpu-a" in output
            and "changed: [gpu-a -> localhost]" not in output.split("TASK [Drain node gpu-a]")[1].split("TASK [")[0]
        )
        assert cluster.get_object("node", "gpu-b")["spec"]["unschedulable"] is True
