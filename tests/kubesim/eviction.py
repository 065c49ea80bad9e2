"""The eviction subresource (``POST .../pods/NAME/eviction``) and the PodDisruptionBudgets it honours (policy/v1).

What the real API server does, in the part a drain relies on: a pod covered by a PodDisruptionBudget is evicted only
while the budget allows a disruption; otherwise the answer is 429 "Cannot evict pod as it would violate the pod's
disruption budget." with a cause naming the budget, and the client retries (``kubectl drain`` every 5 s). A pod
covered by two budgets cannot be evicted (500). A pod that has finished, or that is not running yet, is evicted
without consulting a budget that is healthy.

Simplified: the real disruption controller counts the pods a budget expects from their controller's scale; here
every matching pod that has not finished is expected, and a percentage is taken of that count (rounded up, as the
real controller does for ``minAvailable``).
"""

from __future__ import annotations

import math
from typing import Any

from .api import Api
from .errors import ApiError
from .resources import BY_PLURAL
from .selectors import selector_from_label_selector
from .store import clone

_PODS = BY_PLURAL["pods"]
_PDBS = BY_PLURAL["poddisruptionbudgets"]
_MANAGER = "kube-controller-manager"


def _healthy(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _scaled(value: Any, expected: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = expected * int(value[:-1]) / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def budget_status(api: Api, pdb: dict[str, Any]) -> dict[str, Any]:
    """The status the disruption controller would write for ``pdb`` now."""
    namespace = pdb["metadata"]["namespace"]
    spec = pdb.get("spec") or {}
    matches = selector_from_label_selector(spec.get("selector") or {})
    pods, _rv = api.list(_PODS, namespace)
    covered = [p.obj for p in pods if matches(p.obj["metadata"].get("labels") or {}) and not _terminal(p.obj)]
    expected = len(covered)
    healthy = sum(1 for p in covered if _healthy(p))
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected, round_up=True)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        desired = expected  # the API server refuses such a budget; treat it as allowing nothing
    return {
        "observedGeneration": int(pdb["metadata"].get("generation", 1)),
        "expectedPods": expected,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "disruptionsAllowed": max(0, healthy - desired),
    }


def refresh_budgets(api: Api, namespace: str) -> None:
    """Write each budget's status in ``namespace`` when it changed (run by the simulated controller)."""
    entries, _rv = api.list(_PDBS, namespace)
    for entry in entries:
        status = budget_status(api, entry.obj)
        if (entry.obj.get("status") or {}) != status:
            api.mutate(
                _PDBS,
                namespace,
                entry.obj["metadata"]["name"],
                lambda pdb, s=status: pdb.update(status=s),
                _MANAGER,
                subresource="status",
            )


def _budgets_for(api: Api, pod: dict[str, Any]) -> list[dict[str, Any]]:
    labels = pod["metadata"].get("labels") or {}
    entries, _rv = api.list(_PDBS, pod["metadata"]["namespace"])
    return [
        e.obj for e in entries if selector_from_label_selector((e.obj.get("spec") or {}).get("selector") or {})(labels)
    ]


def evict(api: Api, namespace: str, name: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
    """Evict one pod, or refuse as the API server does. Returns the Status the server answers with (201)."""
    if body is not None and not isinstance(body, dict):
        raise ApiError(400, "the body of the request was in an unknown format")
    meta = (body or {}).get("metadata") or {}
    if meta.get("name") and meta["name"] != name:
        raise ApiError(400, f"name in URL does not match name in Eviction object: {meta['name']} != {name}")
    with api.store.lock:
        pod = clone(api.get(_PODS, namespace, name).obj)
        budgets = [] if _terminal(pod) else _budgets_for(api, pod)
        if len(budgets) > 1:
            raise ApiError(
                500, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
            )
        if budgets:
            status = budget_status(api, budgets[0])
            healthy = _healthy(pod)
            # An unhealthy pod may go only while the budget is healthy (unhealthyPodEvictionPolicy IfHealthyBudget).
            allowed = (
                status["disruptionsAllowed"] > 0 if healthy else status["currentHealthy"] >= status["desiredHealthy"]
            )
            if not allowed:
                budget = budgets[0]["metadata"]["name"]
                raise ApiError(
                    429,
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    reason="TooManyRequests",
                    details={
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {budget} needs {status['desiredHealthy']} healthy "
                                f"pods and has {status['currentHealthy']} currently",
                            }
                        ]
                    },
                )
        if not dry_run:
            api.delete(_PODS, namespace, name)
            if budgets:
                refresh_budgets(api, namespace)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
