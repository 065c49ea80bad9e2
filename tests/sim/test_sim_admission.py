"""The simulator's admission (priority classes, Pod Security), preemption and pod accounting.

site.yml's validation relies on these: its pods must pass the `restricted` profile, carry the lowest priority and
never preempt a workload. Each check of the Pod Security stand-in is tested against the rule of the real policy
package (k8s.io/pod-security-admission/policy/check_*.go), so that a pod the stand-in admits would be admitted by a
real API server too.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from conftest import DAEMONSET
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubesim import SimCluster, SimNode
from kubesim.admission import pod_security_findings
from kubesim.errors import ApiError
from kubesim.workloads import extended_requests

# A pod that passes `restricted` (the shape of site.yml's validation pods).
RESTRICTED_POD: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "smi",
            "image": "cuda",
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }
    ],
}


def _spec(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(RESTRICTED_POD)
    for path, value in changes.items():
        target = spec
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    return spec


def test_the_restricted_shape_passes_every_level() -> None:
    for level in ("privileged", "baseline", "restricted"):
        assert pod_security_findings(level, RESTRICTED_POD) == []


@pytest.mark.parametrize(
    ("changes", "reason", "detail"),
    [
        (
            {"containers__0__securityContext__allowPrivilegeEscalation": None},
            "allowPrivilegeEscalation != false",
            'container "smi" must set securityContext.allowPrivilegeEscalation=false',
        ),
        (
            {"containers__0__securityContext__allowPrivilegeEscalation": True},
            "allowPrivilegeEscalation != false",
            'container "smi" must set securityContext.allowPrivilegeEscalation=false',
        ),
        (
            {"securityContext__runAsNonRoot": None},
            "runAsNonRoot != true",
            'pod or container "smi" must set securityContext.runAsNonRoot=true',
        ),
        (
            {"securityContext__runAsNonRoot": False},
            "runAsNonRoot != true",
            "pod must not set securityContext.runAsNonRoot=false",
        ),
        (
            {"securityContext__seccompProfile": None},
            "seccompProfile",
            'pod or container "smi" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
        ),
        (
            {"securityContext__seccompProfile": {"type": "Unconfined"}},
            "seccompProfile",
            'pod must not set securityContext.seccompProfile.type to "Unconfined"',
        ),
        (
            {"containers__0__securityContext__capabilities": None},
            "unrestricted capabilities",
            'container "smi" must set securityContext.capabilities.drop=["ALL"]',
        ),
        (
            {"containers__0__securityContext__capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}},
            "unrestricted capabilities",
            'container "smi" must not include "SYS_ADMIN" in securityContext.capabilities.add',
        ),
        ({"securityContext__runAsUser": 0}, "runAsUser=0", "pod must not set runAsUser=0"),
        (
            {"volumes": [{"name": "dev", "hostPath": {"path": "/dev"}}]},
            "hostPath volumes",
            'volume "dev"',
        ),
    ],
)
def test_each_restricted_rule_refuses_what_the_real_policy_refuses(
    changes: dict[str, Any], reason: str, detail: str
) -> None:
    findings = pod_security_findings("restricted", _spec(**changes))
    assert (reason, detail) in findings


def test_container_level_settings_stand_in_for_pod_level_ones() -> None:
    spec = _spec(securityContext=None)
    spec["containers"][0]["securityContext"].update(runAsNonRoot=True, seccompProfile={"type": "Localhost"})
    assert pod_security_findings("restricted", spec) == []
    # An init container is checked like the others.
    spec["initContainers"] = [{"name": "init", "image": "x"}]
    reasons = {reason for reason, _detail in pod_security_findings("restricted", spec)}
    assert reasons == {
        "allowPrivilegeEscalation != false",
        "runAsNonRoot != true",
        "seccompProfile",
        "unrestricted capabilities",
    }


def test_baseline_allows_what_only_restricted_forbids() -> None:
    bare = {"containers": [{"name": "app", "image": "x"}]}
    assert pod_security_findings("baseline", bare) == []
    assert pod_security_findings("baseline", {**bare, "hostNetwork": True}) == [("host namespaces", "hostNetwork=true")]
    privileged = {"containers": [{"name": "app", "image": "x", "securityContext": {"privileged": True}}]}
    assert pod_security_findings("baseline", privileged)[0][0] == "privileged"
    assert pod_security_findings("privileged", privileged) == []


# ----- through the API ----------------------------------------------------------------------------------------------


def _namespace(cluster: SimCluster, name: str, level: str | None) -> None:
    labels = {"pod-security.kubernetes.io/enforce": level} if level else {}
    cluster.create_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})


def _pod(name: str, namespace: str, spec: dict[str, Any], gpus: int = 0, **extra: Any) -> dict[str, Any]:
    body = copy.deepcopy(spec)
    if gpus:
        body["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    body.update(extra)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": body}


def test_a_restricted_namespace_refuses_a_pod_with_the_real_servers_message(
    core: client.CoreV1Api, cluster: SimCluster
) -> None:
    _namespace(cluster, "locked", "restricted")
    bare = {"containers": [{"name": "app", "image": "busybox"}]}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("locked", _pod("bare", "locked", bare))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert message.startswith('pods "bare" is forbidden: violates PodSecurity "restricted:latest": ')
    assert 'allowPrivilegeEscalation != false (container "app" must set' in message
    assert cluster.get_object("pod", "bare", "locked") is None
    # The same pod is fine where nothing is enforced; the restricted shape is admitted in both.
    core.create_namespaced_pod("default", _pod("bare", "default", bare))
    core.create_namespaced_pod("locked", _pod("fine", "locked", RESTRICTED_POD))


def _priority_class(name: str, value: int, policy: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    if policy:
        body["preemptionPolicy"] = policy
    return body


def test_priority_comes_from_the_class_and_an_unknown_class_is_refused(cluster: SimCluster) -> None:
    cluster.create_object(_priority_class("lowest", -1000, "Never"))
    created = cluster.create_object(_pod("low", "default", RESTRICTED_POD, priorityClassName="lowest"))
    assert created["spec"]["priority"] == -1000 and created["spec"]["preemptionPolicy"] == "Never"
    plain = cluster.create_object(_pod("plain", "default", RESTRICTED_POD))
    assert plain["spec"]["priority"] == 0 and plain["spec"]["preemptionPolicy"] == "PreemptLowerPriority"
    with pytest.raises(ApiError) as refused:
        cluster.create_object(_pod("lost", "default", RESTRICTED_POD, priorityClassName="nope"))
    assert refused.value.code == 403 and "no PriorityClass with name nope was found" in str(refused.value.status())
    # The device plugin's class exists from the start, as on a real server.
    assert cluster.get_object("priorityclass", "system-node-critical")["value"] == 2000001000
    with pytest.raises(ApiError):
        cluster.create_object(_priority_class("system-mine", 5))
    with pytest.raises(ApiError):
        cluster.create_object(_priority_class("too-high", 2_000_000_000))


def _gpus_ready(cluster: SimCluster) -> None:
    cluster.create_object(json.loads(json.dumps(DAEMONSET)))
    assert cluster.wait_for(
        lambda: (
            (cluster.get_object("node", "gpu-1") or {}).get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")
            == "4"
        )
    )


@pytest.fixture
def one_node() -> Any:
    with SimCluster(nodes=[SimNode("gpu-1", gpus=4)], capacity_delay=0.05) as sim:
        yield sim


def _phase(cluster: SimCluster, name: str) -> str:
    return ((cluster.get_object("pod", name, "default") or {}).get("status") or {}).get("phase", "gone")


def test_a_higher_priority_pod_preempts_a_lower_one_unless_its_policy_is_never(one_node: SimCluster) -> None:
    cluster = one_node
    _gpus_ready(cluster)
    cluster.create_object(_priority_class("batch-low", -10))
    cluster.create_object(_priority_class("polite", 100, "Never"))
    cluster.create_object(_priority_class("urgent", 100))
    spec = {"containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"]}]}
    cluster.create_object(_pod("victim", "default", spec, gpus=4, priorityClassName="batch-low"))
    assert cluster.wait_for(lambda: _phase(cluster, "victim") == "Running")
    # preemptionPolicy Never: it waits, however high its priority.
    cluster.create_object(_pod("polite", "default", spec, gpus=1, priorityClassName="polite"))
    time.sleep(0.5)
    assert _phase(cluster, "victim") == "Running" and _phase(cluster, "polite") == "Pending"
    assert cluster.preemptions() == []
    cluster.delete_object("pod", "polite", "default")
    # The default policy evicts the lower-priority pod and takes its GPUs.
    cluster.create_object(_pod("urgent", "default", spec, gpus=1, priorityClassName="urgent"))
    assert cluster.wait_for(lambda: _phase(cluster, "urgent") == "Running")
    assert _phase(cluster, "victim") == "gone"
    assert cluster.preemptions() == [{"preemptor": "default/urgent", "node": "gpu-1", "victims": ["default/victim"]}]


def test_equal_priority_is_never_preempted_and_the_queue_takes_higher_priority_first(one_node: SimCluster) -> None:
    cluster = one_node
    _gpus_ready(cluster)
    cluster.create_object(_priority_class("lowest", -1000, "Never"))
    spec = {"containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"]}]}
    cluster.create_object(_pod("holder", "default", spec, gpus=4))
    assert cluster.wait_for(lambda: _phase(cluster, "holder") == "Running")
    cluster.create_object(_pod("same", "default", spec, gpus=1))
    cluster.create_object(_pod("low", "default", spec, gpus=1, priorityClassName="lowest"))
    time.sleep(0.3)
    assert _phase(cluster, "holder") == "Running" and cluster.preemptions() == []
    # One GPU comes free: the default-priority pod gets it although the low one is as old.
    cluster.delete_object("pod", "holder", "default")
    assert cluster.wait_for(lambda: _phase(cluster, "same") == "Running")
    assert cluster.wait_for(lambda: _phase(cluster, "low") == "Running")


def test_init_containers_and_sidecars_count_as_the_scheduler_counts_them() -> None:
    def container(gpus: int, **extra: Any) -> dict[str, Any]:
        return {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}, **extra}

    pod = {"spec": {"initContainers": [container(3)], "containers": [container(1), container(1)]}}
    assert extended_requests(pod) == {"nvidia.com/gpu": 3}
    pod["spec"]["initContainers"] = [container(1)]
    assert extended_requests(pod) == {"nvidia.com/gpu": 2}
    pod["spec"]["initContainers"] = [container(1, restartPolicy="Always"), container(2)]
    assert extended_requests(pod) == {"nvidia.com/gpu": 3}
    # A request wins over a limit.
    requested = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}, "limits": {}}}]}}
    assert extended_requests(requested) == {"nvidia.com/gpu": 2}


def test_sleep_runs_its_time_and_active_deadline_ends_a_pod(one_node: SimCluster) -> None:
    cluster = one_node
    _gpus_ready(cluster)
    spec = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x", "command": ["sleep", "30"]}]}
    cluster.create_object(_pod("bounded", "default", spec, gpus=4, activeDeadlineSeconds=1))
    assert cluster.wait_for(lambda: _phase(cluster, "bounded") == "Running")
    time.sleep(0.5)
    assert _phase(cluster, "bounded") == "Running"  # sleep 30 runs past the default run time
    assert cluster.wait_for(lambda: _phase(cluster, "bounded") == "Failed", timeout=5)
    assert cluster.get_object("pod", "bounded", "default")["status"]["reason"] == "DeadlineExceeded"
    # Its GPUs are free again.
    cluster.create_object(_pod("next", "default", spec, gpus=4))
    assert cluster.wait_for(lambda: _phase(cluster, "next") == "Running")


def test_creations_are_counted_by_kind(one_node: SimCluster) -> None:
    cluster = one_node
    before = len(cluster.creations("pods"))
    cluster.create_object(_pod("a", "default", RESTRICTED_POD))
    created = cluster.creations("pods")[before:]
    assert [(c["namespace"], c["name"]) for c in created] == [("default", "a")]
    assert cluster.creations("priorityclass")[0]["name"] in ("system-node-critical", "system-cluster-critical")
