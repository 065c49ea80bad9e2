# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private to kubegpu.node.nvidia_device_plugin: server-side apply and delete, with `changed` and the diff computed
# from the objects the server returns before and after (never from the request itself).

from __future__ import annotations

import copy

from ansible_collections.kubegpu.node.plugins.module_utils.device_plugin.manifests import (
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    object_path,
    object_ref,
)

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

# Fields the server rewrites on every write, or that describe the object's life rather than its desired state.
_VOLATILE_METADATA = ("resourceVersion", "managedFields", "generation", "uid", "creationTimestamp", "selfLink")
_VOLATILE_ANNOTATIONS = ("deprecated.daemonset.template.generation",)


def comparable(obj: dict | None) -> dict | None:
    """The object without status and server bookkeeping: two of these are equal when nothing a user set differs."""
    if obj is None:
        return None
    result = copy.deepcopy(obj)
    result.pop("status", None)
    meta = result.get("metadata") or {}
    for key in _VOLATILE_METADATA:
        meta.pop(key, None)
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        for key in _VOLATILE_ANNOTATIONS:
            annotations.pop(key, None)
        if not annotations:
            meta.pop("annotations", None)
    return result


def changed_paths(before, after, prefix: str = "") -> list[str]:
    """Dotted paths where two comparable objects differ (lists compare whole); sorted, for the result."""
    if isinstance(before, dict) and isinstance(after, dict):
        paths = []
        for key in sorted(set(before) | set(after)):
            where = f"{prefix}.{key}" if prefix else str(key)
            if key not in before or key not in after:
                paths.append(where)
            else:
                paths.extend(changed_paths(before[key], after[key], where))
        return paths
    if before != after:
        return [prefix or "."]
    return []


def apply_object(client, obj: dict, field_manager: str, force: bool, dry_run: bool, path: str | None = None) -> dict:
    """Server-side apply one object; returns a result entry with the before and after objects.

    ``path``: where the object lives, for kinds this module's manifests do not know (kubegpu.node.dcgm_exporter).
    """
    path = path or object_path(obj)
    before = client.get_or_none(path)
    query = {"fieldManager": field_manager, "force": "true" if force else "false"}
    if dry_run:
        query["dryRun"] = "All"
    after = client.request("PATCH", path, query=query, body=obj, content_type=APPLY_CONTENT_TYPE)
    before_cmp = comparable(before)
    after_cmp = comparable(after)
    if before is None:
        action = "created"
        paths: list[str] = []
    else:
        paths = changed_paths(before_cmp, after_cmp)
        action = "updated" if paths else "unchanged"
    return {
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace"),
        "action": action,
        "changed": action != "unchanged",
        "changed_fields": paths,
        "before": before_cmp,
        "after": after_cmp,
        "object": after,
    }


def owned_by_us(obj: dict) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY_VALUE


def delete_object(client, target: dict, dry_run: bool, path: str | None = None) -> dict:
    """Delete one object if it exists and carries this collection's managed-by label."""
    path = path or object_path(target)
    entry = {
        "kind": target["kind"],
        "name": target["metadata"]["name"],
        "namespace": target["metadata"].get("namespace"),
        "changed": False,
        "changed_fields": [],
        "after": None,
    }
    current = client.get_or_none(path)
    if current is None:
        entry.update(action="absent", before=None)
        return entry
    entry["before"] = comparable(current)
    if not owned_by_us(current):
        entry.update(action="kept", after=entry["before"])
        entry["warning"] = (
            f"{object_ref(target)} exists but was not created by kubegpu.node "
            f"(no {MANAGED_BY_LABEL}={MANAGED_BY_VALUE} label); left in place"
        )
        return entry
    query = {"propagationPolicy": "Background"}
    if dry_run:
        query["dryRun"] = "All"
    client.request("DELETE", path, query=query)
    entry.update(action="deleted", changed=True)
    return entry


def diff_entry(result: dict) -> dict:
    """One Ansible diff per changed object, headed by its kind and name."""
    ref = object_ref({"kind": result["kind"], "metadata": {"name": result["name"], "namespace": result["namespace"]}})
    return {
        "before_header": ref,
        "after_header": ref,
        "before": result.get("before") or {},
        "after": result.get("after") or {},
    }


def summary(result: dict) -> dict:
    """What the module returns about one object (without the full objects)."""
    entry = {key: result.get(key) for key in ("kind", "name", "namespace", "action", "changed", "changed_fields")}
    if result.get("namespace") is None:
        entry.pop("namespace")
    return entry
