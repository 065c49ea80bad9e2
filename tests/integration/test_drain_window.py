"""site.yml's drain window (playbooks/tasks/drain_window.yml) against kubesim, through kubernetes.core.k8s_drain.

The harness (drain_window/harness.yml) runs site.yml's preflight and drain window for hosts reached with the local
connection; its steps inside the window note that they ran, reboot the node in kubesim, or fail. What a user would
notice is asserted: which pods were evicted, whether PodDisruptionBudgets held, whether the node was waited on,
whether it ends cordoned, and the message of a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubesim import SimCluster, SimNode

HARNESS = Path(__file__).resolve().parent / "drain_window" / "harness.yml"


def _run(ansible, cluster: SimCluster, hosts: dict, *args: str, **variables: Any):
    kubeconfig = cluster.write_kubeconfig(str(ansible.workdir / "kubeconfig"))
    inventory = ansible.inventory(
        hosts,
        kubegpu_kubeconfig=kubeconfig,
        harness_dir=str(ansible.workdir),
        harness_sim_url=cluster.url,
        harness_token=cluster.token,
        **variables,
    )
    # The role chain never runs on this machine (local connection): only site.yml's own tasks are tested.
    return ansible.playbook(HARNESS, *args, inventory=inventory)


def _pod(cluster: SimCluster, name: str, node: str) -> None:
    cluster.create_object(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"app": "train"},
                "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train", "uid": "u1", "controller": True}
                ],
            },
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "trainer", "command": ["train"]}]},
        }
    )


def _budget(cluster: SimCluster, min_available: int) -> None:
    cluster.create_object(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "train"}}},
        }
    )


def _cordoned(cluster: SimCluster, node: str) -> bool:
    return bool(cluster.get_object("node", node)["spec"].get("unschedulable"))


def _cluster() -> SimCluster:
    return SimCluster(nodes=[SimNode("gpu-a", gpus=4), SimNode("gpu-b", gpus=4), SimNode("gpu-c", gpus=4)])


def test_drain_reboot_wait_and_uncordon_only_what_this_run_cordoned(ansible, tmp_path):
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        _pod(cluster, "train-b", "gpu-b")
        _pod(cluster, "train-c", "gpu-c")
        _budget(cluster, 1)  # three healthy pods, one needed: the two evictions (gpu-a, gpu-c) are allowed
        assert cluster.wait_for(
            lambda: all(
                cluster.get_object("pod", f"train-{x}", "default")["status"]["phase"] == "Running" for x in "abc"
            )
        )
        cluster.api.mutate(
            __import__("kubesim.resources", fromlist=["BY_PLURAL"]).BY_PLURAL["nodes"],
            None,
            "gpu-c",
            lambda node: node["spec"].update(unschedulable=True),
            "an-operator",
        )
        boot_before = cluster.get_object("node", "gpu-a")["status"]["nodeInfo"]["bootID"]
        hosts = {"gpu-a": {"harness_reboot": True}, "gpu-c": {}, "new-host": {}}
        completed = _run(ansible, cluster, hosts, kubegpu_drain_timeout=60)
        output = completed.stdout + completed.stderr
        assert completed.returncode == 0, output

        # gpu-a: its pod was evicted (the budget allowed one), the node rebooted, was waited on, and uncordoned.
        assert cluster.get_object("pod", "train-a", "default") is None
        assert cluster.get_object("pod", "train-b", "default") is not None
        assert "FAILED - RETRYING: [gpu-a -> localhost]: Wait until the node is Ready in the API, gpu-a" in output
        node_a = cluster.get_object("node", "gpu-a")
        assert node_a["status"]["nodeInfo"]["bootID"] != boot_before
        assert next(c for c in node_a["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
        assert not _cordoned(cluster, "gpu-a")
        # gpu-c was cordoned by someone else before the run: drained, but it stays cordoned.
        assert _cordoned(cluster, "gpu-c")
        assert "Node gpu-c was cordoned before this run, so it stays cordoned" in output
        # new-host is not a node yet: its steps ran without any drain.
        assert "new-host is not a node of the cluster" in output
        assert {p.name for p in tmp_path.glob("ran-*")} == {"ran-gpu-a", "ran-gpu-c", "ran-new-host"}


def test_a_budget_that_never_allows_it_stops_the_drain_and_leaves_the_node_cordoned(ansible, tmp_path):
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        _budget(cluster, 1)
        assert cluster.wait_for(lambda: cluster.get_object("pod", "train-a", "default")["status"]["phase"] == "Running")
        completed = _run(ansible, cluster, {"gpu-a": {}, "gpu-b": {"harness_fail_step": True}}, kubegpu_drain_timeout=6)
        output = completed.stdout + completed.stderr
        assert completed.returncode != 0, output
        # The budget held: the pod is still there, the steps never ran on gpu-a, and it says what to do.
        assert cluster.get_object("pod", "train-a", "default") is not None
        assert not (tmp_path / "ran-gpu-a").exists()
        assert _cordoned(cluster, "gpu-a")
        assert 'gpu-a (node gpu-a): the drain window failed at "cordon and drain"' in output
        assert "Cannot evict pod as it would violate the pod's disruption budget" in output
        assert "put it back with `kubectl uncordon gpu-a`" in output
        # gpu-b was drained, its restart failed: it stays cordoned, and the message names the step.
        assert (tmp_path / "ran-gpu-b").exists()
        assert _cordoned(cluster, "gpu-b")
        assert 'gpu-b (node gpu-b): the drain window failed at "apply containerd.service"' in output
        assert "containerd did not come back (test)" in output
        assert "put it back with `kubectl uncordon gpu-b`" in output


def test_check_mode_drains_nothing(ansible, tmp_path):
    with _cluster() as cluster:
        _pod(cluster, "train-a", "gpu-a")
        assert cluster.wait_for(lambda: cluster.get_object("pod", "train-a", "default")["status"]["phase"] == "Running")
        cluster.reset_counts()
        completed = _run(ansible, cluster, {"gpu-a": {}}, "--check")
        assert completed.returncode == 0, completed.stdout
        assert "would cordon and drain node gpu-a" in completed.stdout
        assert not _cordoned(cluster, "gpu-a")
        assert cluster.get_object("pod", "train-a", "default") is not None
        assert not list(tmp_path.glob("ran-*"))
        writes = {
            k: v
            for k, v in cluster.request_counts()["by_verb_resource"].items()
            if k[0] not in ("get", "list", "watch")
        }
        assert writes == {}
