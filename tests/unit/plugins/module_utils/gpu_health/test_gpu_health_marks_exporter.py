"""The pure parts of the GPU health cluster modules: which marks a verdict gives, the taint list and its guarded
patch, the exporter's objects and the per-node reason."""

from __future__ import annotations

import pytest
from ansible_collections.kubegpu.node.plugins.module_utils.gpu_health import exporter, marks

OURS = {"key": marks.TAINT_KEY, "value": "failed", "effect": "NoSchedule"}
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("verdict", "taint", "labelled", "tainted"),
    [
        ("healthy", "degraded", False, False),
        ("unknown", "degraded", False, False),
        ("degraded", "none", True, False),
        ("degraded", "failed", True, False),
        ("degraded", "degraded", True, True),
        ("failed", "failed", True, True),
        ("failed", "none", True, False),
    ],
)
def test_wanted_marks(verdict, taint, labelled, tainted):
    wanted = marks.wanted_marks({"verdict": verdict, "action": "reset", "summary": "s"}, taint)
    assert bool(wanted["labels"]) is labelled
    assert bool(wanted["annotations"]) is labelled
    assert (wanted["taint"] is not None) is tainted
    if tainted:
        assert wanted["taint"] == {"key": marks.TAINT_KEY, "value": verdict, "effect": "NoSchedule"}


def test_the_annotation_is_bounded():
    wanted = marks.wanted_marks({"verdict": "failed", "summary": "x" * 5000}, "none")
    assert len(wanted["annotations"][marks.ANNOTATION]) == marks.ANNOTATION_LIMIT


def test_planned_taints_keep_every_other_taint_in_place():
    assert marks.planned_taints([GPU], OURS) == [GPU, OURS]
    assert marks.planned_taints([GPU, OURS], OURS) is None
    assert marks.planned_taints([OURS, GPU], {**OURS, "value": "degraded"}) == [{**OURS, "value": "degraded"}, GPU]
    assert marks.planned_taints([GPU, OURS], None) == [GPU]
    assert marks.planned_taints([GPU], None) is None
    assert marks.planned_taints(None, OURS) == [OURS]
    # A duplicate of our key (written by hand) collapses to one.
    assert marks.planned_taints([OURS, GPU, {**OURS, "effect": "NoExecute"}], OURS) == [OURS, GPU]


def test_the_taint_patch_tests_what_it_read():
    node = {"metadata": {"resourceVersion": "42"}, "spec": {"taints": [GPU]}}
    assert marks.taint_patch(node, [GPU, OURS]) == [
        {"op": "test", "path": "/spec/taints", "value": [GPU]},
        {"op": "replace", "path": "/spec/taints", "value": [GPU, OURS]},
    ]
    assert marks.taint_patch({"metadata": {"resourceVersion": "42"}, "spec": {"taints": [OURS]}}, [])[1] == {
        "op": "remove",
        "path": "/spec/taints",
    }
    # No list yet: the object's version guards the write.
    assert marks.taint_patch({"metadata": {"resourceVersion": "42"}, "spec": {}}, [OURS]) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "add", "path": "/spec/taints", "value": [OURS]},
    ]


def test_verdict_problems():
    assert marks.verdict_problems({"verdict": "failed", "action": "reset"}) == []
    assert marks.verdict_problems("failed") == ["verdict must be the gpu_health verdict (a dict), not str"]
    assert len(marks.verdict_problems({"verdict": "bad", "action": "explode"})) == 2


PARAMS = {"name": "dcgm-exporter", "namespace": "monitoring", "port": 9400}


def test_the_daemonset_follows_nvidias_manifest_facts():
    ds = exporter.render_daemonset(PARAMS)
    spec = ds["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": 9400}
    assert spec["automountServiceAccountToken"] is False
    assert spec["priorityClassName"] == "system-node-critical"
    # The selector names the exporter and the instance, never the version (a DaemonSet's selector cannot change).
    assert ds["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "dcgm-exporter",
        "app.kubernetes.io/instance": "dcgm-exporter",
    }
    assert ds["metadata"]["labels"]["app.kubernetes.io/version"] == "4.5.3-4.8.2-distroless"
    no_profiling = exporter.render_daemonset({**PARAMS, "profiling_metrics": False})
    assert "add" not in no_profiling["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]
    everywhere = exporter.render_daemonset({**PARAMS, "node_selector": {}, "runtime_class": "nvidia"})
    assert "nodeSelector" not in everywhere["spec"]["template"]["spec"]
    assert everywhere["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


def test_service_and_service_monitor_select_the_pods():
    service = exporter.render_service(PARAMS)
    monitor = exporter.render_service_monitor({**PARAMS, "service_monitor_labels": {"release": "prometheus"}})
    assert service["spec"]["selector"] == monitor["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["monitoring"]}
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert exporter.object_path(monitor) == (
        "/apis/monitoring.coreos.com/v1/namespaces/monitoring/servicemonitors/dcgm-exporter"
    )


def _node(name, labels=None, ready=True, taints=None):
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints} if taints else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _pod(node, ready=True, generation=1, waiting=None):
    status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if waiting:
        status = {
            "phase": "Pending",
            "containerStatuses": [{"image": "img", "state": {"waiting": {"reason": waiting}}}],
        }
    return {
        "metadata": {"name": f"dcgm-exporter-{node}", "labels": {"pod-template-generation": str(generation)}},
        "spec": {"nodeName": node},
        "status": status,
    }


def test_node_states_say_why_not():
    pod_spec = exporter.render_daemonset(PARAMS)["spec"]["template"]["spec"]
    gpu = {"nvidia.com/gpu.present": "true"}
    nodes = [
        _node("ok", gpu),
        _node("pull", gpu),
        _node("old", gpu),
        _node("down", gpu, ready=False),
        _node("unready", gpu),
        _node("cpu"),
        _node("tainted", gpu, taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
    ]
    names = [n["metadata"]["name"] for n in nodes] + ["gone"]
    pods = [
        _pod("ok", generation=2),
        _pod("pull", generation=2, waiting="ErrImagePull"),
        _pod("old", generation=1),
        _pod("unready", generation=2, ready=False),
    ]
    states = exporter.node_states(nodes, pods, pod_spec, 2, names)
    assert states["ok"] == {"ready": True, "reason": ""}
    assert "cannot start: image pull error (ErrImagePull)" in states["pull"]["reason"]
    assert "still runs the previous template" in states["old"]["reason"]
    assert states["down"]["reason"] == "the node is not Ready"
    assert "runs but is not Ready" in states["unready"]["reason"]
    assert "node_selector does not match" in states["cpu"]["reason"]
    assert "taint not tolerated: dedicated=infer:NoSchedule" in states["tainted"]["reason"]
    assert states["gone"]["reason"] == "node not found in the cluster"
    # Without names: the nodes the DaemonSet selects.
    assert sorted(exporter.node_states(nodes, [], pod_spec, 2)) == ["down", "ok", "old", "pull", "unready"]
