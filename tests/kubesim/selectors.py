"""Label and field selectors, and the scheduling rules that decide whether a DaemonSet pod fits a node."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import ApiError

Predicate = Callable[[dict[str, Any]], bool]

_SET_TERM = re.compile(r"^\s*(!?)\s*([A-Za-z0-9._/-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_CMP_TERM = re.compile(r"^\s*([A-Za-z0-9._/-]+)\s*(==|=|!=)\s*([A-Za-z0-9._-]*)\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside ``in (...)`` value lists."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current)
    return terms


def parse_label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda _labels: True
    checks: list[Predicate] = []
    for term in _split_terms(text):
        cmp_match = _CMP_TERM.match(term)
        if cmp_match:
            key, op, value = cmp_match.groups()
            if op == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
            continue
        set_match = _SET_TERM.match(term)
        if not set_match:
            raise ApiError(400, f"unable to parse requirement: invalid label selector {text!r}")
        negate, key, op, values = set_match.groups()
        if op:
            members = {v.strip() for v in values.split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, m=members: labels.get(k) in m)
            else:
                checks.append(lambda labels, k=key, m=members: labels.get(k) not in m)
        elif negate:
            checks.append(lambda labels, k=key: k not in labels)
        else:
            checks.append(lambda labels, k=key: k in labels)
    return lambda labels: all(check(labels) for check in checks)


def _field_value(obj: dict[str, Any], field: str) -> str:
    node: Any = obj
    for part in field.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


# Field selectors the simulator accepts, per resource; the real server refuses others with 400.
SUPPORTED_FIELDS = {
    "pods": {"metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.restartPolicy"},
    "events": {
        "metadata.name",
        "metadata.namespace",
        "involvedObject.name",
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.uid",
        "reason",
        "type",
    },
    "nodes": {"metadata.name", "spec.unschedulable"},
}


def parse_field_selector(text: str | None, plural: str) -> Predicate:
    if not text:
        return lambda _obj: True
    checks: list[Predicate] = []
    allowed = SUPPORTED_FIELDS.get(plural, {"metadata.name", "metadata.namespace"})
    for term in _split_terms(text):
        match = _CMP_TERM.match(term)
        if not match:
            raise ApiError(400, f"invalid field selector: {term!r}")
        field, op, value = match.groups()
        if field not in allowed:
            raise ApiError(400, f"field label not supported: {field}")
        if op == "!=":
            checks.append(lambda obj, f=field, v=value: _field_value(obj, f) != v)
        else:
            checks.append(lambda obj, f=field, v=value: _field_value(obj, f) == v)
    return lambda obj: all(check(obj) for check in checks)


def selector_from_label_selector(selector: dict[str, Any]) -> Predicate:
    """A metav1.LabelSelector (matchLabels + matchExpressions) as a predicate over a label map."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []

    def check(labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in match_labels.items()):
            return False
        return all(_expression(labels, e) for e in expressions)

    return check


def _expression(values: dict[str, str], expr: dict[str, Any]) -> bool:
    key, op, members = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return key in values and values[key] in members
    if op == "NotIn":
        return values.get(key) not in members
    if op == "Exists":
        return key in values
    if op == "DoesNotExist":
        return key not in values
    if op in ("Gt", "Lt"):
        try:
            have, want = int(values[key]), int(members[0])
        except (KeyError, IndexError, ValueError):
            return False
        return have > want if op == "Gt" else have < want
    return False


# Tolerations the DaemonSet controller adds to every pod it creates (so NotReady or cordoned nodes keep theirs).
DAEMONSET_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        operator = tol.get("operator", "Equal")
        if operator == "Exists":
            if not tol.get("key") or tol.get("key") == taint.get("key"):
                return True
        elif tol.get("key") == taint.get("key") and (tol.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def pod_fits_node(pod_spec: dict[str, Any], node: dict[str, Any]) -> tuple[bool, str]:
    """Whether a DaemonSet pod would be placed on the node, and if not, why (in the scheduler's words)."""
    labels = node.get("metadata", {}).get("labels") or {}
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False, "node(s) didn't match Pod's node affinity/selector"
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        terms = affinity.get("nodeSelectorTerms") or []
        fields = {"metadata.name": node.get("metadata", {}).get("name", "")}
        matched = any(
            all(_expression(labels, e) for e in term.get("matchExpressions") or [])
            and all(_expression(fields, e) for e in term.get("matchFields") or [])
            for term in terms
        )
        if not matched:
            return False, "node(s) didn't match Pod's node affinity/selector"
    tolerations = list(pod_spec.get("tolerations") or []) + list(DAEMONSET_TOLERATIONS)
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            value = f"={taint['value']}" if taint.get("value") else ""
            return False, f"node(s) had untolerated taint {{{taint.get('key')}{value}}}"
    return True, ""
