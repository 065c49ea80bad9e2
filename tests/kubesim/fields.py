"""Field ownership (``managedFields``), server-side apply and the patch formats.

A simplified model of structured-merge-diff: maps are merged key by key, a list whose items are all maps with a
``name`` is a map keyed by that name (containers, volumes, env, ...), and every other list is atomic (replaced whole,
owned as one field), which is how the real schema treats ``tolerations`` and ``args``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from .errors import ApiError
from .store import clone

# A path is a tuple of elements: ("f", key) for a map field, ("k", '{"name":"x"}') for an item of a keyed list,
# and (".", "") for "the item itself".
Element = tuple[str, str]
Path = tuple[Element, ...]
ManagerKey = tuple[str, str, str]  # (manager, operation, subresource)

_MISSING = object()
_ITEM: Element = (".", "")

# Fields the server owns: never tracked, never taken from a request.
_SERVER_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    }
)


def _is_keyed_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)
    )


@functools.lru_cache(maxsize=65536)
def _key_for_name(name: str) -> str:
    return json.dumps({"name": name}, separators=(",", ":"))


@functools.lru_cache(maxsize=65536)
def _name_of_key(key: str) -> str:
    return str(json.loads(key)["name"])


def _item_key(item: dict[str, Any]) -> str:
    return _key_for_name(item["name"])


def tracked(obj: dict[str, Any], has_status: bool) -> dict[str, Any]:
    """The part of an object whose fields have owners."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind") and not (has_status and k == "status")}
    meta = out.get("metadata")
    if isinstance(meta, dict):
        out["metadata"] = {k: v for k, v in meta.items() if k not in _SERVER_META}
        if not out["metadata"]:
            del out["metadata"]
    return out


def field_paths(value: dict[str, Any], prefix: Path = ()) -> set[Path]:
    """Every owned leaf of a map, keyed-list items included."""
    paths: set[Path] = set()
    for key, child in value.items():
        path = (*prefix, ("f", key))
        if isinstance(child, dict) and child:
            paths |= field_paths(child, path)
        elif _is_keyed_list(child):
            for item in child:
                item_path = (*path, ("k", _item_key(item)))
                paths.add((*item_path, _ITEM))
                paths |= field_paths(item, item_path)
        else:
            paths.add(path)
    return paths


def value_at(obj: Any, path: Path) -> Any:
    node = obj
    for kind, key in path:
        if kind == ".":
            return node
        if kind == "f":
            if not isinstance(node, dict) or key not in node:
                return _MISSING
            node = node[key]
        else:
            if not isinstance(node, list):
                return _MISSING
            wanted = _name_of_key(key)
            node = next((i for i in node if isinstance(i, dict) and i.get("name") == wanted), _MISSING)
            if node is _MISSING:
                return _MISSING
    return node


def _set_at(obj: dict[str, Any], path: Path, value: Any) -> None:
    node: Any = obj
    for index, (kind, key) in enumerate(path):
        last = index == len(path) - 1
        if kind == ".":
            return
        if kind == "f":
            if last:
                node[key] = clone(value)
                return
            nxt_kind = path[index + 1][0]
            if nxt_kind == "k":
                if not isinstance(node.get(key), list):
                    node[key] = []
            elif not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        else:
            wanted = _name_of_key(key)
            item = next((i for i in node if isinstance(i, dict) and i.get("name") == wanted), None)
            if item is None:
                item = {"name": wanted}
                node.append(item)
            node = item


def _delete_at(obj: dict[str, Any], path: Path) -> None:
    parent: Any = obj
    for kind, key in path[:-1]:
        if kind == "f":
            parent = parent.get(key) if isinstance(parent, dict) else None
        elif kind == "k":
            wanted = _name_of_key(key)
            parent = next((i for i in parent if i.get("name") == wanted), None) if isinstance(parent, list) else None
        if parent is None:
            return
    kind, key = path[-1]
    if kind == "f" and isinstance(parent, dict):
        parent.pop(key, None)
    elif kind == "." and len(path) >= 2:
        _delete_item(obj, path[:-1])


def _delete_item(obj: dict[str, Any], item_path: Path) -> None:
    container = value_at(obj, item_path[:-1])
    if isinstance(container, list):
        wanted = _name_of_key(item_path[-1][1])
        container[:] = [i for i in container if not (isinstance(i, dict) and i.get("name") == wanted)]


def _path_text(path: Path) -> str:
    """The field as the API server prints it in conflicts: ``.spec.template.spec.containers[name="x"].image``."""
    out = ""
    for kind, key in path:
        if kind == "f":
            out += f".{key}"
        elif kind == "k":
            out += f'[name="{_name_of_key(key)}"]'
    return out


# ----- managedFields encoding ------------------------------------------------------------------------------------


def encode_fields(paths: set[Path]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in paths:
        node = tree
        for kind, key in path:
            label = "." if kind == "." else f"{kind}:{key}"
            node = node.setdefault(label, {})
    return tree


def decode_fields(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    paths: set[Path] = set()
    for label, child in tree.items():
        if label == ".":
            paths.add((*prefix, _ITEM))
            continue
        kind, _sep, key = label.partition(":")
        path = (*prefix, (kind, key))
        if child:
            paths |= decode_fields(child, path)
        else:
            paths.add(path)
    return paths


def read_managed(meta: dict[str, Any]) -> dict[ManagerKey, dict[str, Any]]:
    """managedFields as {(manager, operation, subresource): {"paths": set, "apiVersion": str, "time": str}}."""
    out: dict[ManagerKey, dict[str, Any]] = {}
    for entry in meta.get("managedFields") or []:
        key = (entry.get("manager", ""), entry.get("operation", "Update"), entry.get("subresource", ""))
        out[key] = {
            "paths": decode_fields(entry.get("fieldsV1") or {}),
            "apiVersion": entry.get("apiVersion", ""),
            "time": entry.get("time", ""),
        }
    return out


def write_managed(managed: dict[ManagerKey, dict[str, Any]]) -> list[dict[str, Any]]:
    entries = []
    for (manager, operation, subresource), info in managed.items():
        if not info["paths"]:
            continue
        entry: dict[str, Any] = {
            "manager": manager,
            "operation": operation,
            "apiVersion": info["apiVersion"],
            "time": info["time"],
            "fieldsType": "FieldsV1",
            "fieldsV1": encode_fields(info["paths"]),
        }
        if subresource:
            entry["subresource"] = subresource
        entries.append(entry)
    return entries


# ----- server-side apply -----------------------------------------------------------------------------------------


def apply(
    live: dict[str, Any] | None,
    config: dict[str, Any],
    manager: str,
    force: bool,
    has_status: bool,
    api_version: str,
    now: str,
) -> dict[str, Any]:
    """Merge an applied configuration into the live object; returns the new object with managedFields set.

    Raises a 409 when the configuration sets a field another manager owns to a different value (unless forced).
    """
    live = clone(live) if live is not None else {}
    meta = live.setdefault("metadata", {})
    managed = read_managed(meta)
    me = (manager, "Apply", "")
    config_tracked = tracked(config, has_status)
    wanted = field_paths(config_tracked)
    leaves = {p for p in wanted if p[-1] != _ITEM}

    conflicts: list[tuple[str, Path]] = []
    for path in sorted(leaves):
        if value_at(live, path) == value_at(config_tracked, path):
            continue
        for key, info in managed.items():
            if key != me and key[2] == "" and path in info["paths"]:
                conflicts.append((key[0], path))
    if conflicts and not force:
        causes = [
            {
                "reason": "FieldManagerConflict",
                "message": f'conflict with "{owner}" using {managed_api(managed, owner, api_version)}',
                "field": _path_text(path),
            }
            for owner, path in conflicts
        ]
        count = len(conflicts)
        lines = "\n".join(f"- {c['message']}: {c['field']}" for c in causes)
        raise ApiError(
            409,
            f"Apply failed with {count} conflict{'s' if count > 1 else ''}: {lines}",
            details={"causes": causes},
        )
    for owner, path in conflicts:
        for key, info in managed.items():
            if key[0] == owner and key != me:
                info["paths"].discard(path)

    previous = managed.get(me, {"paths": set()})["paths"]
    for path in sorted(wanted, key=len):
        if path[-1] == _ITEM:
            _set_at(live, path[:-1], None)  # creates the list item when it is missing
        else:
            _set_at(live, path, value_at(config_tracked, path))
    others: set[Path] = set()
    for key, info in managed.items():
        if key != me:
            others |= info["paths"]
    for path in sorted(previous - wanted, key=len, reverse=True):
        if path in others:
            continue
        # A list item goes only when no other manager still owns something inside it.
        if path[-1] == _ITEM and any(o[: len(path) - 1] == path[:-1] for o in others):
            continue
        _delete_at(live, path)

    if me not in managed or managed[me]["paths"] != wanted or managed[me]["apiVersion"] != api_version:
        managed[me] = {"paths": wanted, "apiVersion": api_version, "time": now}
    meta["managedFields"] = write_managed(managed)
    if not meta["managedFields"]:
        del meta["managedFields"]
    return live


def managed_api(managed: dict[ManagerKey, dict[str, Any]], owner: str, default: str) -> str:
    for (name, _op, _sub), info in managed.items():
        if name == owner:
            return info["apiVersion"] or default
    return default


def record_update(
    old: dict[str, Any] | None,
    new: dict[str, Any],
    manager: str,
    has_status: bool,
    api_version: str,
    now: str,
    subresource: str = "",
) -> None:
    """Give ``manager`` (operation Update) the fields a non-apply write changed, taking them from other owners."""
    if has_status and subresource == "status":
        before = {"status": (old or {}).get("status", {})}
        after = {"status": new.get("status", {})}
    else:
        before = tracked(old, has_status) if old else {}
        after = tracked(new, has_status)
    old_paths = field_paths(before) if before else set()
    new_paths = field_paths(after)
    changed = {p for p in new_paths if value_at(before, p) != value_at(after, p)} if before else new_paths
    gone = old_paths - new_paths
    meta = new.setdefault("metadata", {})
    managed = read_managed((old or {}).get("metadata", {}))
    if not changed and not gone:
        if managed:
            meta["managedFields"] = write_managed(managed)
        return
    for info in managed.values():
        info["paths"] -= changed
        info["paths"] -= gone
    me = (manager, "Update", subresource)
    mine = managed.setdefault(me, {"paths": set(), "apiVersion": api_version, "time": now})
    mine["paths"] |= changed
    mine["time"] = now
    mine["apiVersion"] = api_version
    meta["managedFields"] = write_managed(managed)
    if not meta["managedFields"]:
        del meta["managedFields"]


# ----- patches ---------------------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """An approximation of strategic merge patch: maps merge, lists of named maps merge by name.

    Honoured directives: ``$patch: delete`` / ``$patch: replace`` on a map or list item; other ``$`` keys (such as
    ``$setElementOrder/...`` and ``$retainKeys`` sent by kubectl) are dropped.
    """
    if not isinstance(patch, dict):
        return clone(patch)
    if patch.get("$patch") == "replace":
        return {k: clone(v) for k, v in patch.items() if not k.startswith("$")}
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and _is_keyed_list([i for i in value if isinstance(i, dict)] or [None]):
            result[key] = _merge_named_list(result.get(key), value)
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_named_list(current: Any, patch: list[Any]) -> list[Any]:
    merged = [clone(i) for i in current] if isinstance(current, list) else []
    for item in patch:
        name = item.get("name")
        index = next((n for n, i in enumerate(merged) if isinstance(i, dict) and i.get("name") == name), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append(strategic_merge_patch({}, item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move)."""
    if not isinstance(operations, list):
        raise ApiError(400, "json patch must be a list of operations")
    doc = clone(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"invalid json patch operation: {op!r}")
        kind = op["op"]
        if kind in ("copy", "move"):
            value = clone(_pointer_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _pointer_apply(doc, op["from"], "remove", None)
            doc = _pointer_apply(doc, op["path"], "add", value)
        elif kind == "test":
            if _pointer_get(doc, op["path"]) != op.get("value"):
                raise ApiError(422, f"the json patch test operation failed at {op['path']}")
        elif kind in ("add", "replace", "remove"):
            doc = _pointer_apply(doc, op["path"], kind, op.get("value"))
        else:
            raise ApiError(400, f"unknown json patch operation {kind!r}")
    return doc


def _pointer_tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ApiError(400, f"invalid json pointer {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _pointer_get(doc: Any, pointer: str) -> Any:
    node = doc
    for token in _pointer_tokens(pointer):
        try:
            node = node[int(token)] if isinstance(node, list) else node[token]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(422, f"the json patch path {pointer} does not exist") from exc
    return node


def _pointer_apply(doc: Any, pointer: str, kind: str, value: Any) -> Any:
    tokens = _pointer_tokens(pointer)
    if not tokens:
        return clone(value)
    parent = _pointer_get(doc, "/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in tokens[:-1]))
    last = tokens[-1]
    try:
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(index, clone(value))
            elif kind == "replace":
                parent[index] = clone(value)
            else:
                parent.pop(index)
        elif isinstance(parent, dict):
            if kind in ("replace", "remove") and last not in parent:
                raise ApiError(422, f"the json patch path {pointer} does not exist")
            if kind == "remove":
                del parent[last]
            else:
                parent[last] = clone(value)
        else:
            raise ApiError(422, f"the json patch path {pointer} does not exist")
    except (IndexError, ValueError) as exc:
        raise ApiError(422, f"the json patch path {pointer} does not exist") from exc
    return doc
