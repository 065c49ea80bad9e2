# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.node_cordon and site.yml's private filter kubegpu.node._cordon_record; may change without
# notice.
#
# A cordon this collection makes carries a record on the Node itself, the annotation kubegpu.node/cordon: who
# cordoned it, why, when, and how to put the node back by hand. The cordon and its record are one merge patch with the
# resourceVersion the decision was made on, so that:
# - a kill between any two API calls leaves either no cordon and no record, or both (the next run reads which);
# - a node someone else cordoned meanwhile is never marked as ours (the patch fails with 409; read again, decide again);
# - a node is uncordoned only while the record is there, and the record goes in the same patch.
# A cordon without the record is someone else's (an operator, another tool) and is left alone.

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.errors import KubeApiError

ANNOTATION = "kubegpu.node/cordon"
MERGE_PATCH = "application/merge-patch+json"
# Cordoned with the record / cordoned without it (someone else's) / schedulable.
RECORDED, UNRECORDED, NONE = "recorded", "unrecorded", "none"
STATES = ("cordoned", "uncordoned")
# A node's status is written every few seconds by its kubelet: a 409 is expected now and then, not only from an
# operator's cordon. Read and decide again this many times before giving up.
ATTEMPTS = 5


class CordonError(Exception):
    """A failure the module reports with fail_json."""


def undo_commands(node: str) -> str:
    """What puts the node back by hand: uncordon, then drop the record (the order keeps it ours until the end)."""
    return f"kubectl uncordon {node} && kubectl annotate node {node} {ANNOTATION}-"


def make_record(node: str, reason: str, owner: str, at: str) -> dict[str, str]:
    return {"by": owner, "reason": reason, "at": at, "undo": undo_commands(node)}


def encode_record(record: dict[str, str]) -> str:
    return json.dumps(record, separators=(", ", ": "))


def record_of(node: Any) -> dict[str, Any] | None:
    """The record on a Node (a dict as the API returns it), or None when there is none.

    The key alone makes it a record: a value that is not the JSON this collection writes (edited by hand) is kept as
    the reason, so the cordon stays recognisably ours.
    """
    if not isinstance(node, dict):
        return None
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, dict):
        return {"reason": str(raw)}
    return value


def unschedulable(node: dict[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def cordon_of(node: dict[str, Any]) -> str:
    """RECORDED (cordoned by this collection), UNRECORDED (cordoned by someone else) or NONE (schedulable)."""
    if not unschedulable(node):
        return NONE
    return RECORDED if record_of(node) is not None else UNRECORDED


def boot_id(node: dict[str, Any]) -> str:
    return str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")


@dataclass(frozen=True)
class Step:
    """What to write to reach the wanted state from ``node``: ``patch`` None when nothing is to be written."""

    action: str  # cordon, uncordon, forget (a record left on a schedulable node), none
    patch: dict[str, Any] | None
    cordon_after: str


def plan(node: dict[str, Any], state: str, record: str) -> Step:
    """The step from the node as read to ``state``; ``record`` is the encoded record a cordon writes."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
    version = (node.get("metadata") or {}).get("resourceVersion")
    current = cordon_of(node)
    if state == "cordoned":
        if current != NONE:
            # Ours already (an earlier run was stopped inside its window), or someone else's: never marked as ours.
            return Step("none", None, current)
        patch = {"metadata": {"annotations": {ANNOTATION: record}}, "spec": {"unschedulable": True}}
        return Step("cordon", _with_version(patch, version), RECORDED)
    if current == RECORDED:
        patch = {"metadata": {"annotations": {ANNOTATION: None}}, "spec": {"unschedulable": None}}
        return Step("uncordon", _with_version(patch, version), NONE)
    if current == NONE and record_of(node) is not None:
        # Uncordoned by hand with the record left behind: drop it, or a later cordon by someone else would read as ours.
        return Step("forget", _with_version({"metadata": {"annotations": {ANNOTATION: None}}}, version), NONE)
    return Step("none", None, current)


def _with_version(patch: dict[str, Any], version: str | None) -> dict[str, Any]:
    if version:
        patch["metadata"]["resourceVersion"] = version
    return patch


def _view(node: dict[str, Any]) -> dict[str, Any]:
    """The part of a Node this module changes, for diff mode."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    view: dict[str, Any] = {"spec": {"unschedulable": unschedulable(node)}}
    if ANNOTATION in annotations:
        view["metadata"] = {"annotations": {ANNOTATION: annotations[ANNOTATION]}}
    return view


def converge(
    client: Any,
    name: str,
    state: str,
    reason: str,
    owner: str,
    now: Callable[[], str],
    check_mode: bool = False,
) -> dict[str, Any]:
    """Read the node, decide, write with the resourceVersion read; on a conflict (409) read and decide again.

    ``client`` is a device_plugin.client.KubeClient (``get_or_none``, ``request``); ``now()`` gives the record's time.
    """
    path = f"/api/v1/nodes/{name}"
    for _attempt in range(ATTEMPTS):
        node = client.get_or_none(path)
        if node is None:
            raise CordonError(f"node {name} does not exist in the cluster")
        before = cordon_of(node)
        record = record_of(node)
        step = plan(node, state, encode_record(make_record(name, reason, owner, now())))
        result: dict[str, Any] = {
            "changed": step.patch is not None,
            "action": step.action,
            "cordon_before": before,
            "cordon": step.cordon_after,
            "record": record,
            "boot_id": boot_id(node),
            "diff": {"before": _view(node), "after": _view(node)},
        }
        if step.patch is None:
            return result
        if check_mode:
            expected = _patched(node, step.patch)
            result["diff"]["after"] = _view(expected)
            if step.action == "cordon":
                result["record"] = record_of(expected)
            return result
        try:
            written = client.request("PATCH", path, body=step.patch, content_type=MERGE_PATCH)
        except KubeApiError as error:
            if error.status == 409:
                continue
            raise
        result["diff"]["after"] = _view(written)
        result["boot_id"] = boot_id(written) or result["boot_id"]
        if step.action == "cordon":
            result["record"] = record_of(written)
        return result
    raise CordonError(
        f"node {name} changed between each read and write, {ATTEMPTS} times in a row (HTTP 409 Conflict): "
        "nothing was written; run again"
    )


def _patched(node: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The node as the merge patch would leave it, in the two fields it sets (check mode's prediction)."""
    after = {"metadata": {"annotations": dict((node.get("metadata") or {}).get("annotations") or {})}}
    after["spec"] = {"unschedulable": unschedulable(node)}
    value = patch["metadata"]["annotations"][ANNOTATION]
    if value is None:
        after["metadata"]["annotations"].pop(ANNOTATION, None)
    else:
        after["metadata"]["annotations"][ANNOTATION] = value
    if "spec" in patch:
        after["spec"]["unschedulable"] = bool(patch["spec"]["unschedulable"])
    return after
