"""kubegpu.node.node_cordon against the simulated API server (tests/kubesim, a stand-in for kube-apiserver), run
in-process exactly as Ansible runs it; and its read-decide-write loop against an operator cordoning the node between
the module's read and its write."""

from __future__ import annotations

import json

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils import _node_cordon
from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.client import KubeClient, load_configuration
from ansible_collections.kubegpu.node.plugins.modules import node_cordon
from kubesim import SimCluster, SimNode
from kubesim.resources import BY_PLURAL
from nvidia_device_plugin_harness import auth_args, run_module

RECORD = "kubegpu.node/cordon"


@pytest.fixture
def cluster():
    with SimCluster(nodes=[SimNode("gpu-1", gpus=2), SimNode("gpu-2", gpus=4)]) as sim:
        yield sim


def cordon(cluster, check_mode=False, diff=False, **extra):
    args = dict(auth_args(cluster), **{"name": "gpu-1", **extra})
    return run_module(args, check_mode=check_mode, diff=diff, module=node_cordon)


def node(cluster, name="gpu-1"):
    return cluster.get_object("node", name)


def record(cluster, name="gpu-1"):
    raw = (node(cluster, name)["metadata"].get("annotations") or {}).get(RECORD)
    return None if raw is None else json.loads(raw)


def operator_cordons(cluster, name="gpu-1"):
    cluster.api.mutate(BY_PLURAL["nodes"], None, name, lambda obj: obj["spec"].update(unschedulable=True), "operator")


def test_cordon_writes_the_record_in_the_same_write_and_a_second_call_changes_nothing(cluster):
    cluster.reset_counts()
    first = cordon(cluster, state="cordoned", reason="driver upgrade (reboot)", owner="maintenance.yml")
    assert first.get("failed") is not True, first.get("msg")
    assert (first["changed"], first["action"], first["cordon_before"], first["cordon"]) == (
        True,
        "cordon",
        "none",
        "recorded",
    )
    assert node(cluster)["spec"]["unschedulable"] is True
    written = record(cluster)
    assert written["by"] == "maintenance.yml" and written["reason"] == "driver upgrade (reboot)"
    assert written["undo"] == "kubectl uncordon gpu-1 && kubectl annotate node gpu-1 kubegpu.node/cordon-"
    assert written["at"].endswith("Z")
    assert first["record"] == written
    assert first["boot_id"] == node(cluster)["status"]["nodeInfo"]["bootID"]
    # One read, one write: the cordon and its record cannot be split by a kill.
    assert cluster.request_counts()["by_verb_resource"] == {("get", "nodes"): 1, ("patch", "nodes"): 1}

    again = cordon(cluster, state="cordoned", reason="another reason")
    assert (again["changed"], again["action"], again["cordon"]) == (False, "none", "recorded")
    assert record(cluster) == written  # the first record stays: it says when and why the cordon began


def test_uncordon_removes_the_cordon_and_the_record_together(cluster):
    cordon(cluster, state="cordoned", reason="r")
    result = cordon(cluster, state="uncordoned", diff=True)
    assert (result["changed"], result["action"], result["cordon_before"], result["cordon"]) == (
        True,
        "uncordon",
        "recorded",
        "none",
    )
    assert result["record"]["reason"] == "r"  # what was removed
    assert not node(cluster)["spec"].get("unschedulable")
    assert record(cluster) is None
    assert result["diff"]["before"]["spec"] == {"unschedulable": True}
    assert result["diff"]["after"] == {"spec": {"unschedulable": False}}
    assert cordon(cluster, state="uncordoned")["changed"] is False


def test_a_cordon_without_the_record_is_never_taken_over_nor_undone(cluster):
    operator_cordons(cluster)
    cordoned = cordon(cluster, state="cordoned", reason="r")
    assert (cordoned["changed"], cordoned["cordon"], cordoned["record"]) == (False, "unrecorded", None)
    uncordoned = cordon(cluster, state="uncordoned")
    assert (uncordoned["changed"], uncordoned["cordon"]) == (False, "unrecorded")
    assert node(cluster)["spec"]["unschedulable"] is True
    assert record(cluster) is None


def test_a_record_left_by_a_hand_uncordon_is_removed(cluster):
    cordon(cluster, state="cordoned", reason="r")
    cluster.api.mutate(BY_PLURAL["nodes"], None, "gpu-1", lambda obj: obj["spec"].pop("unschedulable"), "operator")
    result = cordon(cluster, state="uncordoned")
    assert (result["changed"], result["action"], result["cordon"]) == (True, "forget", "none")
    assert record(cluster) is None


def test_check_mode_says_what_it_would_write_and_writes_nothing(cluster):
    cluster.reset_counts()
    result = cordon(cluster, check_mode=True, diff=True, state="cordoned", reason="r")
    assert (result["changed"], result["action"], result["cordon"]) == (True, "cordon", "recorded")
    assert result["record"]["reason"] == "r"
    assert result["diff"]["after"]["spec"] == {"unschedulable": True}
    assert json.loads(result["diff"]["after"]["metadata"]["annotations"][RECORD])["reason"] == "r"
    assert not node(cluster)["spec"].get("unschedulable") and record(cluster) is None
    assert set(cluster.request_counts()["by_verb_resource"]) == {("get", "nodes")}


def test_a_missing_node_and_a_missing_reason_are_refused(cluster):
    missing = cordon(cluster, state="cordoned", reason="r", name="gpu-9")
    assert missing["failed"] is True and missing["msg"] == "node gpu-9 does not exist in the cluster"
    no_reason = cordon(cluster, state="cordoned")
    assert no_reason["failed"] is True and "reason" in no_reason["msg"]


class RacingClient:
    """The module's client, with an operator (or a kubelet's status write) changing the node right after each read
    of the first ``races`` reads, before the module writes."""

    def __init__(self, cluster, change, races=1):
        configuration, _source = load_configuration(auth_args(cluster))
        self.client = KubeClient(configuration)
        self.cluster, self.change, self.races = cluster, change, races

    def get_or_none(self, path):
        answer = self.client.get_or_none(path)
        if self.races > 0:
            self.races -= 1
            self.cluster.api.mutate(BY_PLURAL["nodes"], None, "gpu-1", self.change, "racer")
        return answer

    def request(self, *args, **kwargs):
        return self.client.request(*args, **kwargs)


def _converge(client, state):
    return _node_cordon.converge(client, "gpu-1", state, "r", "kubegpu.node", lambda: "T")


def test_an_operator_cordoning_between_the_read_and_the_write_keeps_the_cordon_as_theirs(cluster):
    cluster.reset_counts()
    client = RacingClient(cluster, lambda obj: obj["spec"].update(unschedulable=True))
    result = _converge(client, "cordoned")
    assert (result["changed"], result["cordon"], result["record"]) == (False, "unrecorded", None)
    assert node(cluster)["spec"]["unschedulable"] is True and record(cluster) is None
    # The write carried the resourceVersion it was decided on, and the server refused it.
    assert ("patch", "nodes", 409) in {entry[1:] for entry in cluster.request_log()}


def test_a_status_write_between_the_read_and_the_write_is_read_again_and_the_cordon_made(cluster):
    client = RacingClient(cluster, lambda obj: obj["metadata"].setdefault("labels", {}).update(heartbeat="1"))
    result = _converge(client, "cordoned")
    assert (result["changed"], result["cordon"]) == (True, "recorded")
    assert record(cluster)["reason"] == "r"


def test_an_operator_taking_the_cordon_over_between_the_read_and_the_write_keeps_it(cluster):
    _converge(RacingClient(cluster, lambda obj: None, races=0), "cordoned")

    def take_over(obj):
        obj["metadata"]["annotations"].pop(RECORD)

    result = _converge(RacingClient(cluster, take_over), "uncordoned")
    assert (result["changed"], result["cordon"]) == (False, "unrecorded")
    assert node(cluster)["spec"]["unschedulable"] is True


def test_a_node_that_changes_at_every_read_fails_after_a_few_attempts_writing_nothing(cluster):
    client = RacingClient(
        cluster,
        lambda obj: obj["metadata"].setdefault("labels", {}).update(x=obj["metadata"]["resourceVersion"]),
        races=99,
    )
    with pytest.raises(_node_cordon.CordonError, match="5 times in a row"):
        _converge(client, "cordoned")
    assert not node(cluster)["spec"].get("unschedulable") and record(cluster) is None
