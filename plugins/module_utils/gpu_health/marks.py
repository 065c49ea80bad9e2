# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.gpu_health_node: what a node's GPU health verdict puts on its Node object (pure).
#
# Labels and the annotation are applied by server-side apply under a field manager of their own, so a label of
# another manager is never touched and ours go away when the node is healthy again (a manager's fields it stops
# applying are removed). Taints cannot be: NodeSpec.Taints is `+listType=atomic` (kubernetes/api core/v1/types.go), so
# whoever applies spec.taints owns the whole list, and applying ours would remove (or, without force, conflict with)
# every taint another manager set. The taint is therefore changed by a JSON patch that first tests the list as read
# and then replaces it with the same list plus or minus our one taint; a list another writer changed in between fails
# the test, and the change is planned again from a fresh read.

from __future__ import annotations

LABEL = "kubegpu.node/gpu-health"
ACTION_LABEL = "kubegpu.node/gpu-health-action"
ANNOTATION = "kubegpu.node/gpu-health"
TAINT_KEY = "kubegpu.node/gpu-unhealthy"
TAINT_EFFECT = "NoSchedule"
FIELD_MANAGER = "kubegpu.node-gpu-health"
ANNOTATION_LIMIT = 1024

VERDICT_RANK = {"healthy": 0, "unknown": 1, "degraded": 2, "failed": 3}
TAINT_CHOICES = ("none", "degraded", "failed")
ACTIONS = ("none", "application", "watch", "reset", "reboot", "replace")


def verdict_problems(verdict) -> list:
    """Why a verdict (the gpu_health action's result, ansible_local.nvidia_health) cannot be used; empty when it can."""
    if not isinstance(verdict, dict):
        return ["verdict must be the gpu_health verdict (a dict), not " + type(verdict).__name__]
    problems = []
    if verdict.get("verdict") not in VERDICT_RANK:
        problems.append(f"verdict.verdict must be one of {', '.join(VERDICT_RANK)}, not {verdict.get('verdict')!r}")
    if verdict.get("action", "none") not in ACTIONS:
        problems.append(f"verdict.action must be one of {', '.join(ACTIONS)}, not {verdict.get('action')!r}")
    return problems


def wanted_marks(verdict: dict, taint: str) -> dict:
    """The labels, annotation and taint a node with this verdict carries: none when healthy or unknown; the verdict and
    the action as labels, the summary as annotation when degraded or failed; the taint when asked for this bad."""
    state = verdict.get("verdict", "unknown")
    marked = state in ("degraded", "failed")
    labels = {LABEL: state, ACTION_LABEL: verdict.get("action") or "none"} if marked else {}
    summary = str(verdict.get("summary") or state)
    annotations = {ANNOTATION: summary[:ANNOTATION_LIMIT]} if marked else {}
    wanted_taint = None
    if taint != "none" and VERDICT_RANK.get(state, 0) >= VERDICT_RANK[taint]:
        wanted_taint = {"key": TAINT_KEY, "value": state, "effect": TAINT_EFFECT}
    return {"labels": labels, "annotations": annotations, "taint": wanted_taint}


def apply_body(name: str, marks: dict) -> dict:
    """The server-side apply configuration of our labels and annotation. What we applied before and apply no more is
    removed by the server; an empty map is left out rather than sent (the configuration says nothing about it)."""
    metadata = {"name": name}
    for key in ("labels", "annotations"):
        if marks[key]:
            metadata[key] = dict(marks[key])
    return {"apiVersion": "v1", "kind": "Node", "metadata": metadata}


def _same_taint(a: dict, b: dict) -> bool:
    return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "value", "effect"))


def planned_taints(current, wanted) -> list | None:
    """The node's new taint list, or None when ours is already as wanted. Every other taint stays as it is, in its
    place; ours (our key, whatever its value or effect) is replaced in place, added at the end, or removed."""
    current = list(current or [])
    ours = [t for t in current if t.get("key") == TAINT_KEY]
    if wanted is None:
        if not ours:
            return None
        return [t for t in current if t.get("key") != TAINT_KEY]
    if len(ours) == 1 and _same_taint(ours[0], wanted):
        return None
    new = []
    placed = False
    for taint in current:
        if taint.get("key") != TAINT_KEY:
            new.append(taint)
        elif not placed:
            new.append(dict(wanted))
            placed = True
    if not placed:
        new.append(dict(wanted))
    return new


def taint_patch(node: dict, new: list) -> list:
    """A JSON patch that changes spec.taints to ``new`` only if the list is still the one read (else 422)."""
    spec = node.get("spec")
    if spec is not None and "taints" in spec:
        guard = {"op": "test", "path": "/spec/taints", "value": spec["taints"]}
        change = (
            {"op": "replace", "path": "/spec/taints", "value": new} if new else {"op": "remove", "path": "/spec/taints"}
        )
        return [guard, change]
    # No list yet: nothing to test it against but the object's version (any write in between fails the patch).
    guard = {"op": "test", "path": "/metadata/resourceVersion", "value": node["metadata"]["resourceVersion"]}
    if spec is None:
        return [guard, {"op": "add", "path": "/spec", "value": {"taints": new}}]
    return [guard, {"op": "add", "path": "/spec/taints", "value": new}]


def marks_view(node: dict | None) -> dict:
    """The part of a Node this module manages, for changed and the diff."""
    meta = (node or {}).get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    taints = ((node or {}).get("spec") or {}).get("taints") or []
    ours = [t for t in taints if t.get("key") == TAINT_KEY]
    return {
        "labels": {k: labels[k] for k in (LABEL, ACTION_LABEL) if k in labels},
        "annotations": {k: annotations[k] for k in (ANNOTATION,) if k in annotations},
        "taint": {k: ours[0][k] for k in ("key", "value", "effect") if k in ours[0]} if ours else None,
        "other_taints": [t.get("key") for t in taints if t.get("key") != TAINT_KEY],
    }
