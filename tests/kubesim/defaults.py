"""Defaults the real API server fills in on every write, for the kinds the collection and its tests create.

From the defaulting functions of k8s.io/kubernetes (pkg/apis/apps/v1/defaults.go, pkg/apis/core/v1/defaults.go), as
`kubectl get -o yaml` shows them after `kubectl create`: without them, clients that read these fields (``kubectl
rollout status`` reads ``updateStrategy``) see an object no real server would return. Only fields that are absent are
set, so what a client sent always wins.
"""

from __future__ import annotations

from typing import Any


def apply_defaults(plural: str, obj: dict[str, Any]) -> None:
    """Fill in the server-side defaults of one object of kind ``plural``, in place."""
    if plural == "daemonsets":
        _daemonset(obj)
    elif plural == "pods":
        _pod_spec(obj.setdefault("spec", {}))
        obj["spec"].setdefault("enableServiceLinks", True)
    elif plural == "priorityclasses":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


def _daemonset(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    strategy = spec.setdefault("updateStrategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        rolling = strategy.setdefault("rollingUpdate", {})
        rolling.setdefault("maxUnavailable", 1)
        rolling.setdefault("maxSurge", 0)
    spec.setdefault("revisionHistoryLimit", 10)
    template = spec.setdefault("template", {})
    _pod_spec(template.setdefault("spec", {}))


def _pod_spec(spec: dict[str, Any]) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        if not isinstance(container, dict):
            continue
        container.setdefault("imagePullPolicy", _pull_policy(str(container.get("image") or "")))
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        container.setdefault("resources", {})
        for port in container.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
        for env in container.get("env") or []:
            field_ref = (env.get("valueFrom") or {}).get("fieldRef") if isinstance(env, dict) else None
            if isinstance(field_ref, dict):
                field_ref.setdefault("apiVersion", "v1")
    for volume in spec.get("volumes") or []:
        if not isinstance(volume, dict):
            continue
        if isinstance(volume.get("hostPath"), dict):
            volume["hostPath"].setdefault("type", "")
        for source in ("configMap", "secret"):
            if isinstance(volume.get(source), dict):
                volume[source].setdefault("defaultMode", 420)


def _pull_policy(image: str) -> str:
    """Always for an untagged or :latest image (no digest), IfNotPresent otherwise."""
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"
