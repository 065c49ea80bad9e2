"""site.yml's GPU validation decisions (plugins/plugin_utils/_gpu_validation.py), over API-shaped objects."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _gpu_validation as gv
from kubesim.admission import pod_security_findings

SETTINGS = gv.Settings(namespace="kubegpu-validation", run="r1", image="cuda:12", timeout=300)


def node(name: str, gpus: int = 4, record: dict | None = None) -> dict[str, Any]:
    annotations = {gv.RECORD_ANNOTATION: json.dumps(record)} if record is not None else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {"allocatable": {"cpu": "64", gv.GPU: str(gpus)}},
    }


def pod(
    name: str,
    node_name: str | None,
    gpus: int = 0,
    phase: str = "Running",
    requests: int | None = None,
    init: list[dict] | None = None,
    namespace: str = "default",
    labels: dict | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {gv.GPU: str(gpus)}} if gpus else {}
    if requests is not None:
        resources["requests"] = {gv.GPU: str(requests)}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}]}
    if node_name:
        spec["nodeName"] = node_name
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": phase},
    }


# ----- kubegpu_validate ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode", "deprecated"),
    [
        (None, "changed", False),
        ("changed", "changed", False),
        ("ALL", "all", False),
        ("none", "none", False),
        (True, "all", True),
        (False, "none", True),
        ("true", "all", True),
        ("false", "none", True),
        ("yes", "all", True),
        ("0", "none", True),
    ],
)
def test_validation_mode_keeps_the_old_switch_working_as_deprecated_aliases(value, mode, deprecated):
    found, note = gv.validation_mode(value)
    assert found == mode
    assert (note is not None) is deprecated
    if note:
        assert "deprecated" in note and "all, changed" in note


def test_validation_mode_refuses_anything_else():
    with pytest.raises(gv.ValidationError, match="must be all, changed or none"):
        gv.validation_mode("sometimes")


def test_run_id_is_awx_job_or_random():
    assert gv.run_id(1234) == "awx-1234"
    assert gv.run_id("", token="abc123") == "abc123"
    first, second = gv.run_id(), gv.run_id()
    assert first != second and len(first) == 6
    with pytest.raises(gv.ValidationError):
        gv.run_id("12 34")


# ----- the play's hosts (site.yml's former set_fact loop) ------------------------------------------------------


def test_collect_targets_reads_names_counts_and_modes():
    hosts = ["a", "b.example", "c", "d", "e"]
    found = gv.collect_targets(
        hosts,
        {
            "a": {"kubegpu_gpu_count": 8, "__kubegpu_pci_gpus": {"skipped": True, "changed": False}},
            "b.example": {"kubegpu_gpu_count": "4", "kubegpu_node_name": "b", "kubegpu_validate": "all"},
            # site.yml's registered kubegpu.node.nvidia_pci_gpus
            "c": {"__kubegpu_pci_gpus": {"changed": False, "count": 2, "gpus": []}, "kubegpu_validate": "false"},
            "d": {},
            # a count given wins over the one read
            "e": {"kubegpu_gpu_count": 0, "__kubegpu_pci_gpus": {"changed": False, "count": 4, "gpus": []}},
        },
    )
    assert found["nodes"] == ["a", "b", "c", "d", "e"]
    assert found["expected"] == {"a": 8, "b": 4, "c": 2, "e": 0}
    assert found["modes"] == {"a": "changed", "b.example": "all", "c": "none", "d": "changed", "e": "changed"}
    assert found["validating"] is True
    assert len(found["deprecation_notes"]) == 1 and found["problems"] == []


def test_collect_targets_names_every_value_it_cannot_use():
    found = gv.collect_targets(
        ["a", "b"], {"a": {"kubegpu_gpu_count": "eight"}, "b": {"kubegpu_gpu_count": 2, "kubegpu_validate": "x"}}
    )
    assert "kubegpu_gpu_count of a is eight" in found["problems"][0]
    assert found["problems"][1].startswith("b: kubegpu_validate must be")
    assert found["expected"] == {"b": 2}


def test_nothing_to_validate_when_every_host_says_none():
    assert gv.collect_targets(["a"], {"a": {"kubegpu_validate": "none"}})["validating"] is False


def test_host_changes_come_from_the_drain_window_and_the_kubelet_result():
    assert gv.host_changes({}) == []
    assert gv.host_changes(
        {"__kubegpu_disruptions": ["reboot", "containerd"], "kubelet_feature_gates_result": {"changed": "True"}}
    ) == ["reboot", "containerd", "kubelet feature gates"]
    assert gv.host_changes({"kubelet_feature_gates_result": {"changed": False}}) == []


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("ii |1.18.2-1\n", "1.18.2-1"),
        ("hi |1.17.8-1", "1.17.8-1"),
        ("rc |1.18.2-1", ""),  # removed, configuration left
        ("un |", ""),
        ("", ""),
        ("1.18.2-1.el9\n", "1.18.2-1.el9"),  # rpm
        ("package nvidia-container-toolkit is not installed", ""),
    ],
)
def test_toolkit_version(output, version):
    assert gv.toolkit_version(output) == version


def test_driver_version_prefers_the_loaded_one():
    assert gv.driver_version({"installed_version": "580.95.05", "loaded_version": "550.163.01"}) == "550.163.01"
    assert gv.driver_version({"installed_version": "580.95.05", "loaded_version": ""}) == "580.95.05"
    assert gv.driver_version(None) == ""


# ----- which nodes ---------------------------------------------------------------------------------------------


def target(name: str, mode: str = "changed", driver: str = "580", toolkit: str = "1.18", **extra: Any) -> gv.Target:
    return gv.Target(
        name, name, extra.pop("expected", 4), versions={"driver": driver, "toolkit": toolkit}, mode=mode, **extra
    )


def test_changed_mode_validates_new_changed_and_upgraded_nodes_only():
    record = {"driver": "580", "toolkit": "1.18", "run": "r0", "at": "2026-01-01T00:00:00Z"}
    nodes = {
        "same": node("same", record=record),
        "fresh": node("fresh"),
        "upgraded": node("upgraded", record=dict(record, driver="550")),
        "rebooted": node("rebooted", record=record),
        "broken-record": {"metadata": {"name": "broken-record", "annotations": {gv.RECORD_ANNOTATION: "{oops"}}},
    }
    targets = [
        target("same"),
        target("fresh"),
        target("upgraded"),
        target("rebooted", changes=["reboot"]),
        target("broken-record"),
        target("gone"),
    ]
    selection = gv.select_nodes(targets, nodes)
    assert selection["validate"] == {
        "fresh": "never validated",
        "upgraded": "validated with driver 550, toolkit 1.18; it runs driver 580, toolkit 1.18",
        "rebooted": "this run changed it: reboot",
        "broken-record": "never validated",
        "gone": "not found in the cluster",
    }
    assert selection["skip"] == {"same": "validated with driver 580, toolkit 1.18 (run r0, 2026-01-01T00:00:00Z)"}
    assert selection["hosts"] == ["fresh", "upgraded", "rebooted", "broken-record", "gone"]


def test_a_no_op_run_validates_nothing_and_says_why():
    record = {"driver": "580", "toolkit": "1.18"}
    selection = gv.select_nodes(
        [target("a"), target("b")], {"a": node("a", record=record), "b": node("b", record=record)}
    )
    assert selection["validate"] == {} and selection["hosts"] == []
    assert gv.selection_summary(selection) == [
        "Validating 0 of 2 nodes",
        "a: not validated: validated with driver 580, toolkit 1.18",
        "b: not validated: validated with driver 580, toolkit 1.18",
    ]


def test_a_fleets_summary_counts_the_nodes_left_alone():
    record = {"driver": "580", "toolkit": "1.18"}
    names = [f"n{i:03}" for i in range(1000)]
    nodes = {n: node(n, record=record) for n in names}
    nodes["n500"] = node("n500")
    selection = gv.select_nodes([target(n) for n in names], nodes)
    assert gv.selection_summary(selection) == [
        "Validating 1 of 1000 nodes",
        "n500: validated: never validated",
        "999 nodes not validated (n000, n001, n002, n003, n004, ...): validated before with the driver and toolkit "
        "they run, no GPU expected, or kubegpu_validate: none",
    ]


def test_all_none_plugin_changes_and_gpu_less_nodes():
    record = {"driver": "580", "toolkit": "1.18"}
    nodes = {n: node(n, record=record) for n in ("a", "b", "c")}
    targets = [target("a", mode="all"), target("b", mode="none"), target("c"), target("d", expected=0)]
    selection = gv.select_nodes(targets, nodes)
    assert selection["validate"] == {"a": "kubegpu_validate is all"}
    assert selection["skip"]["b"] == "kubegpu_validate is none"
    assert selection["skip"]["d"] == "no GPU expected"
    plugin = gv.select_nodes(targets, nodes, plugin_changed=True)
    assert plugin["validate"]["c"] == "the device plugin changed in this run"
    assert "b" not in plugin["validate"]


# ----- free GPUs ---------------------------------------------------------------------------------------------


def test_pod_request_counts_limits_requests_init_containers_and_sidecars():
    assert gv.pod_request(pod("p", "n", gpus=2)) == 2
    assert gv.pod_request(pod("p", "n", gpus=2, requests=1)) == 1  # a request wins over its limit
    init = [{"name": "warm", "resources": {"limits": {gv.GPU: "3"}}}]
    assert gv.pod_request(pod("p", "n", gpus=1, init=init)) == 3  # an init container needing more
    sidecar = [{"name": "s", "restartPolicy": "Always", "resources": {"limits": {gv.GPU: "1"}}}]
    assert gv.pod_request(pod("p", "n", gpus=2, init=sidecar)) == 3  # a sidecar runs beside the app
    both = [*sidecar, {"name": "i", "resources": {"limits": {gv.GPU: "3"}}}]
    assert gv.pod_request(pod("p", "n", gpus=1, init=both)) == 4  # the init container starts after the sidecar
    overhead = pod("p", "n", gpus=1)
    overhead["spec"]["overhead"] = {gv.GPU: "1"}
    assert gv.pod_request(overhead) == 2


def test_free_gpus_count_only_non_terminated_pods_bound_to_the_node():
    pods = [
        pod("running", "a", gpus=2),
        pod("pending-bound", "a", gpus=1, phase="Pending"),
        pod("done", "a", gpus=4, phase="Succeeded"),
        pod("failed", "a", gpus=4, phase="Failed"),
        pod("elsewhere", "b", gpus=4),
        pod("unbound", None, gpus=4, phase="Pending"),
        pod("cpu-only", "a"),
        pod("ours", "a", gpus=1, labels={gv.RUN_LABEL: "r1"}),
    ]
    usage = gv.gpu_usage(node("a", 4), pods, exclude_run="r1")
    assert usage == {
        "allocatable": 4,
        "used": 3,
        "free": 1,
        "holders": {"default/running": 2, "default/pending-bound": 1},
    }
    assert gv.in_use_text(usage) == "3/4 in use"
    # More in use than allocatable (a device went unhealthy under running pods): none free, never negative.
    assert gv.gpu_usage(node("a", 2), pods)["free"] == 0


def test_plan_checks_with_the_free_gpus_and_skips_a_full_node():
    nodes = {"idle": node("idle", 4), "half": node("half", 4), "full": node("full", 4), "cpu": node("cpu", 0)}
    pods = [pod("w1", "half", gpus=2), pod("w2", "full", gpus=4)]
    planned = gv.plan(["idle", "half", "full", "cpu", "missing"], nodes, pods, SETTINGS)
    assert planned["busy"] == {"full": "skipped: 4/4 in use"}
    holders = {p["metadata"]["annotations"][gv.NODE_ANNOTATION]: p for p in planned["pods"]["holder"]}
    assert holders["idle"]["spec"]["containers"][0]["resources"]["limits"][gv.GPU] == "4"
    assert holders["half"]["spec"]["containers"][0]["resources"]["limits"][gv.GPU] == "2"
    assert [p["spec"]["containers"][0]["resources"]["limits"][gv.GPU] for p in planned["pods"]["smi"]] == ["1", "1"]
    assert [p["metadata"]["name"] for p in planned["pods"]["surplus"]] == [
        "kubegpu-surplus-idle-r1",
        "kubegpu-surplus-half-r1",
    ]


# ----- the pods ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("check", gv.CHECKS)
def test_every_validation_pod_passes_pod_security_restricted(check):
    # kubesim's check is tested rule by rule against the real policy package (tests/sim/test_sim_admission.py).
    spec = gv.pod_object("gpu-1", check, 2, SETTINGS)["spec"]
    assert pod_security_findings("restricted", spec) == []


def test_validation_pods_are_the_lowest_priority_never_preempt_and_end_by_themselves():
    obj = gv.pod_object("gpu-1", "holder", 3, dataclass_replace(SETTINGS, runtime_class="nvidia"))
    spec = obj["spec"]
    assert spec["priorityClassName"] == gv.PRIORITY_CLASS
    klass = gv.priority_class_object()
    assert klass["value"] < -10 and klass["preemptionPolicy"] == "Never" and klass["globalDefault"] is False
    assert spec["activeDeadlineSeconds"] == 3 * 300 + 60
    assert spec["containers"][0]["command"] == ["sleep", "960"]
    assert spec["restartPolicy"] == "Never" and spec["runtimeClassName"] == "nvidia"
    assert obj["metadata"]["labels"][gv.RUN_LABEL] == "r1" and obj["metadata"]["name"] == "kubegpu-holder-gpu-1-r1"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]
    namespace = gv.namespace_object("kubegpu-validation")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    with pytest.raises(gv.ValidationError, match="a namespace of its own"):
        gv.namespace_object("default")


def dataclass_replace(settings: gv.Settings, **changes: Any) -> gv.Settings:
    values = dict(settings.__dict__, **changes)
    return gv.Settings(**values)


def test_a_long_node_name_still_makes_a_valid_pod_name():
    long = "n" + "-x" * 140
    name = gv.pod_name("surplus", long, "awx-123456")
    assert len(name) <= 253 and name.endswith("-awx-123456")
    assert name == gv.pod_name("surplus", long, "awx-123456")


# ----- waiting -------------------------------------------------------------------------------------------------


def scheduled(obj: dict, status: str, message: str = "") -> dict:
    obj = copy.deepcopy(obj)
    condition = {"type": "PodScheduled", "status": status}
    if message:
        condition.update(reason="Unschedulable", message=message)
    obj["status"]["conditions"] = [condition]
    return obj


def ours(check: str, node_name: str, bound: bool, phase: str = "Pending") -> dict:
    obj = pod(f"kubegpu-{check}-{node_name}-r1", node_name if bound else None, gpus=1, phase=phase)
    obj["metadata"]["annotations"] = {gv.NODE_ANNOTATION: node_name}
    return obj


def test_what_each_check_waits_for():
    insufficient = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match"
    assert gv.settled("smi", None)  # gone: judged later
    assert not gv.settled("smi", ours("smi", "a", True, "Running"))
    assert gv.settled("smi", ours("smi", "a", True, "Succeeded"))
    assert gv.settled("smi", scheduled(ours("smi", "a", False), "False", insufficient))
    assert not gv.settled("holder", ours("holder", "a", False))
    assert gv.settled("holder", ours("holder", "a", True))
    assert gv.settled("surplus", scheduled(ours("surplus", "a", False), "False", insufficient))
    assert not gv.settled("surplus", ours("surplus", "a", False))
    pods = [ours("smi", "a", True, "Succeeded"), ours("smi", "b", True, "Running")]
    assert gv.unsettled("smi", ["a", "b", "c"], pods) == ["b"]


# ----- judging -------------------------------------------------------------------------------------------------

INSUFFICIENT = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity"
REACHED = {"smi": True, "holder": True, "surplus": True}
USAGE = {"allocatable": 4, "used": 0, "free": 4}


def smi_done(node_name: str = "a") -> dict:
    obj = ours("smi", node_name, True, "Succeeded")
    return obj


def holder_bound(gpus: int = 4) -> dict:
    obj = ours("holder", "a", True, "Running")
    obj["spec"]["containers"][0]["resources"] = {"limits": {gv.GPU: str(gpus)}}
    return obj


def judge(**kwargs: Any) -> dict:
    values = {
        "node": "a",
        "allocatable": 4,
        "before": USAGE,
        "after": USAGE,
        "smi": (smi_done(), ["GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)"]),
        "holder": holder_bound(),
        "surplus": scheduled(ours("surplus", "a", False), "False", INSUFFICIENT),
        "waited": {"smi": 3.0, "holder": 1.0, "surplus": 1.0},
        "reached": REACHED,
    }
    values.update(kwargs)
    return gv.judge_node(**values)


def test_a_healthy_node_passes():
    assert judge() == {
        "pod": "ok: GPU 0: NVIDIA A100-SXM4-80GB",
        "scheduling": "ok: surplus pod Pending (Insufficient nvidia.com/gpu)",
        "verdict": "ok",
    }


def test_nvidia_smi_that_failed_or_never_finished_says_what_was_waited_for_and_seen():
    failed = ours("smi", "a", True, "Failed")
    failed["status"]["containerStatuses"] = [{"state": {"terminated": {"exitCode": 6}}}]
    result = judge(smi=(failed, ["No devices were found"]))
    assert result["pod"] == "FAILED: nvidia-smi -L failed (exit 6): No devices were found"
    assert result["verdict"] == "failed"
    stuck = ours("smi", "a", True, "Pending")
    stuck["status"]["containerStatuses"] = [
        {"image": "cuda:12", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}
    ]
    result = judge(smi=(stuck, None), waited={"smi": 300.2})
    assert result["pod"] == (
        "FAILED: waited 300 s for nvidia-smi -L to finish; it is image pull error (ErrImagePull) for cuda:12: not found"
    )


def test_gpus_taken_by_other_pods_during_the_check_skip_rather_than_fail():
    unschedulable = scheduled(ours("smi", "a", False), "False", INSUFFICIENT)
    taken = {"allocatable": 4, "used": 4, "free": 0}
    result = judge(
        smi=(unschedulable, None),
        after=taken,
        holder=scheduled(ours("holder", "a", False), "False", INSUFFICIENT),
        surplus=None,
    )
    assert result["pod"] == "skipped: its GPU was taken during the check (4/4 in use by other pods)"
    assert result["scheduling"] == "skipped: GPUs were taken during the check (4/4 in use by other pods)"
    assert result["verdict"] == "skipped"
    # Not taken by anyone: the scheduler refused free GPUs, a failure.
    result = judge(smi=(unschedulable, None))
    assert result["pod"].startswith("FAILED: the scheduler did not place the nvidia-smi pod: 0/2 nodes")
    assert result["verdict"] == "failed"


def test_a_surplus_pod_that_fits_is_a_failure_only_when_the_node_is_overcommitted():
    bound = ours("surplus", "a", True, "Running")
    result = judge(surplus=bound)
    assert result["scheduling"] == (
        "FAILED: the scheduler placed a pod asking for one GPU more than the node has: "
        "5 GPUs requested on 4 allocatable"
    )
    assert result["verdict"] == "failed"
    freed = judge(
        before={"allocatable": 4, "used": 2, "free": 2},
        after={"allocatable": 4, "used": 1, "free": 3},
        holder=holder_bound(2),
        surplus=bound,
    )
    assert freed["scheduling"].startswith("skipped: GPUs were freed during the check, so the surplus pod fitted")
    assert freed["verdict"] == "skipped"


def test_pods_deleted_under_the_check_and_checks_not_reached():
    assert judge(smi=(None, None))["pod"].startswith("skipped: the nvidia-smi pod was deleted during the check")
    assert judge(holder=None)["verdict"] == "skipped"
    assert judge(reached={"smi": True, "holder": False, "surplus": False})["scheduling"] == "not run"
    assert judge(reached={})["verdict"] == "failed"
    waiting = ours("surplus", "a", False)
    assert judge(surplus=waiting, waited={"surplus": 30.0})["scheduling"].startswith(
        "FAILED: waited 30 s for the scheduler to decide on a pod asking for one GPU more; it is pod phase Pending"
    )


def test_failure_text_never_says_unknown_error():
    assert gv.failure_text("Wait", {"msg": "Unknown error.", "attempts": 150}) == "Wait: gave up after 150 attempts"
    body = json.dumps({"kind": "Status", "message": 'pods "x" is forbidden: violates PodSecurity "restricted:latest"'})
    text = gv.failure_text("Start", {"msg": "Failed to create object", "body": body, "status": 403})
    assert text == 'Start: Failed to create object; pods "x" is forbidden: violates PodSecurity "restricted:latest"'
    assert gv.failure_text(None, {"status": 409}) == "status 409"
    assert "without a message" in gv.failure_text("T", {})
    # kubernetes.core's message holds the Status; a loop's failed item says which object.
    conflict = {"message": 'Apply failed with 1 conflict: - conflict with "platform-team" using v1', "code": 409}
    looped = {
        "msg": "One or more items failed",
        "results": [
            {"failed": False, "item": {"kind": "PriorityClass", "metadata": {"name": "p"}}},
            {
                "failed": True,
                "msg": "Failed to apply object: " + json.dumps(conflict),
                "item": {"kind": "Namespace", "metadata": {"name": "kubegpu-validation"}},
            },
        ],
    }
    assert gv.failure_text("Apply", looped) == (
        "Apply: Namespace kubegpu-validation: Failed to apply object: Apply failed with 1 conflict: - conflict with "
        '"platform-team" using v1'
    )


# ----- the node's own checks and the table ------------------------------------------------------------------


def test_host_and_container_cells():
    lines = [f"{i}, NVIDIA A100, GPU-{i}" for i in range(4)]
    assert gv.host_cell({"rc": 0, "stdout_lines": lines}, 4) == "ok (4 GPUs)"
    assert gv.host_cell({"rc": 0, "stdout_lines": lines[:3]}, 4) == "FAILED: nvidia-smi saw 3 of 4 GPUs"
    assert gv.host_cell({"rc": 9, "stdout": "NVIDIA-SMI has failed", "stderr": ""}, 4) == (
        "FAILED: exit 9: NVIDIA-SMI has failed"
    )
    assert gv.host_cell(None, 4) == "not run"
    assert gv.container_cell({"skipped": True}) == "skipped"
    assert gv.container_cell({"rc": 4, "stdout": "no docker"}) == "not checked (no docker or ctr)"
    assert gv.container_cell({"rc": 0, "stdout_lines": ["GPU 0: A100 (UUID: x)"]}) == "ok (1 GPUs)"
    assert gv.container_cell({"rc": 3, "stderr": "pull failed"}) == "FAILED: exit 3: pull failed"


def test_rows_records_and_verdicts():
    record = {"driver": "550", "toolkit": "1.18"}
    nodes = {
        "ok": node("ok"),
        "ok-again": node("ok-again", record={"driver": "580", "toolkit": "1.18"}),
        "busy": node("busy", record=record),
        "bad": node("bad", record=record),
    }
    targets = [target(n) for n in nodes]
    selection = gv.select_nodes(targets, nodes)
    assert set(selection["validate"]) == {"ok", "busy", "bad"}
    selection["validate"]["ok-again"] = "kubegpu_validate is all"
    planned = gv.plan(list(selection["validate"]), nodes, [pod("w", "busy", gpus=4)], SETTINGS)
    healthy = {
        n: (
            ours("smi", n, True, "Succeeded"),
            scheduled(ours("surplus", n, False), "False", INSUFFICIENT),
        )
        for n in ("ok", "ok-again", "bad")
    }
    holder = {n: dict(ours("holder", n, True, "Running")) for n in healthy}
    for obj in holder.values():
        obj["spec"]["containers"][0]["resources"] = {"limits": {gv.GPU: "4"}}
    outcome = gv.Outcome(
        plan=planned,
        pods={
            "smi": [smi for smi, _s in healthy.values()],
            "holder": list(holder.values()),
            "surplus": [surplus for _p, surplus in healthy.values()],
        },
        logs={n: ["GPU 0: NVIDIA A100 (UUID: x)"] for n in healthy},
        waited={"smi": 1.0, "holder": 1.0, "surplus": 1.0},
        reached=REACHED,
    )
    checks = {n: {"host": "ok (4 GPUs)", "container": "skipped"} for n in nodes}
    checks["bad"] = {"host": "FAILED: exit 9: NVIDIA-SMI has failed", "container": "skipped"}
    judged = gv.rows(targets, selection, nodes, checks, outcome, "r1", "2026-11-25T00:00:00Z")
    assert judged["passed_nodes"] == ["ok", "ok-again"]
    assert judged["failed_nodes"] == ["bad"] and judged["skipped_nodes"] == ["busy"]
    by_node = {row["node"]: row for row in judged["rows"]}
    assert by_node["busy"]["pod"] == "skipped: 4/4 in use" and by_node["busy"]["gpus"] == "4 (4 in use)"
    # A new record where the versions changed (or none was there); none rewritten for the same versions; the
    # failed node's record removed; the skipped node's kept.
    assert json.loads(judged["records"]["ok"]) == {
        "driver": "580",
        "toolkit": "1.18",
        "run": "r1",
        "at": "2026-11-25T00:00:00Z",
    }
    assert "ok-again" not in judged["records"]
    assert judged["records"]["bad"] is None and "busy" not in judged["records"]
    assert gv.failure_message(judged["failed_nodes"], None).startswith(
        "GPU validation failed. Nodes that did not pass: bad."
    )


def test_check_mode_rows_say_not_run():
    # Also where check mode applied no device plugin, so the node has no allocatable GPU yet.
    nodes = {"a": node("a"), "b": node("b", gpus=0)}
    targets = [target("a"), target("b")]
    selection = gv.select_nodes(targets, nodes)
    checks = {"a": {"host": "ok (4 GPUs)", "container": "skipped"}, "b": {"host": "ok (4 GPUs)", "container": "x"}}
    judged = gv.rows(targets, selection, nodes, checks, gv.Outcome(check_mode=True), "r1", "now")
    assert [row["pod"] for row in judged["rows"]] == ["not run (check mode)"] * 2
    assert judged["skipped_nodes"] == ["a", "b"] and judged["failed_nodes"] == []
    assert judged["records"] == {}


def test_a_node_without_allocatable_gpus_fails_when_gpus_are_expected():
    nodes = {"a": node("a", gpus=0)}
    selection = gv.select_nodes([target("a")], nodes)
    judged = gv.rows([target("a")], selection, nodes, {}, gv.Outcome(), "r1", "now")
    assert judged["rows"][0]["pod"] == "FAILED: no allocatable nvidia.com/gpu" and judged["failed_nodes"] == ["a"]


def test_table_aligns_columns() -> None:
    rows = [{"node": "gpu-node-1", "gpus": 8, "pod": "ok"}, {"node": "n2", "gpus": 4, "pod": "FAILED: no log"}]
    assert gv.table(rows) == [
        "NODE        GPUS  POD",
        "gpu-node-1  8     ok",
        "n2          4     FAILED: no log",
    ]
    assert gv.table(rows, ["pod"]) == ["POD", "ok", "FAILED: no log"]
