# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The filter kubegpu.node.docker_daemon_config: checks the shape of Docker's daemon.json and merges the nvidia runtime
# into it (or takes it out again). Documentation: docker_daemon_config.yml next to this file.
#
# Docker reads one daemon.json and has no drop-ins, so the file is merged, never replaced: every key the role does not
# manage keeps its value and its place. Everything here is pure, so the role can decide what to write (and what to
# refuse) before it touches the host, and the tests need no host.

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from ansible.errors import AnsibleFilterError

NVIDIA = "nvidia"
# The keys the role manages, as paths into daemon.json. Their previous values are recorded so that absent can undo.
DEFAULT_RUNTIME = ("default-runtime",)
NVIDIA_RUNTIME = ("runtimes", NVIDIA)
FEATURES_CDI = ("features", "cdi")
MANAGED = (NVIDIA_RUNTIME, DEFAULT_RUNTIME, FEATURES_CDI)

_UTF8_BOM = b"\xef\xbb\xbf"
_INDENT = re.compile(r'^([ \t]+)["}\]]', re.MULTILINE)


class DaemonConfigError(ValueError):
    """daemon.json cannot be merged safely; the text says what is wrong with it."""


def json_kind(value: Any) -> str:
    """The JSON name of a Python value's type, as a user reading the file would call it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DaemonConfigError(f"the key {key!r} appears more than once in the same object")
        seen[key] = value
    return seen


def parse(data: bytes | None) -> dict[str, Any] | None:
    """Parse daemon.json's bytes (None: the file does not exist) and check the parts the role reads or writes.

    Raises DaemonConfigError naming the problem. An empty file is an empty configuration, as for dockerd.
    """
    if data is None:
        return None
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DaemonConfigError(f"it is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        return {}
    try:
        config = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise DaemonConfigError(f"it is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    check_shape(config)
    return config


def check_shape(config: Any) -> None:
    """Check the types of everything the merge reads or writes; a wrong type there would be lost or break Docker."""
    if not isinstance(config, dict):
        raise DaemonConfigError(f"the top level must be a JSON object, but it is {json_kind(config)}")
    runtimes = config.get("runtimes", {})
    if "runtimes" in config and not isinstance(runtimes, dict):
        raise DaemonConfigError(f'"runtimes" must be an object, but it is {json_kind(runtimes)}')
    for name, runtime in runtimes.items():
        if not isinstance(runtime, dict):
            raise DaemonConfigError(f'"runtimes.{name}" must be an object, but it is {json_kind(runtime)}')
    if "default-runtime" in config and not isinstance(config["default-runtime"], str):
        raise DaemonConfigError(f'"default-runtime" must be a string, but it is {json_kind(config["default-runtime"])}')
    if "features" in config and not isinstance(config["features"], dict):
        raise DaemonConfigError(f'"features" must be an object, but it is {json_kind(config["features"])}')


def _get(config: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    node: Any = config
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _delete(config: dict[str, Any], path: tuple[str, ...], prune_from: int | None = None) -> None:
    """Remove a key, then the objects above it down to depth prune_from that this leaves empty (the role made them)."""
    parents = [config]
    for key in path[:-1]:
        parents.append(parents[-1][key])
    parents[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if prune_from is None or depth < prune_from or parents[depth]:
            break
        parents[depth - 1].pop(path[depth - 1])


def _first_missing(config: dict[str, Any], path: tuple[str, ...]) -> int:
    """The depth of the first object on the way to path that does not exist yet (len(path) when only the key is new)."""
    for depth in range(1, len(path)):
        if not _get(config, path[:depth])[0]:
            return depth
    return len(path)


def _same(left: Any, right: Any) -> bool:
    """Equal as JSON: unlike ==, true is not 1 here, and the order of keys does not matter."""
    return json.dumps(left, sort_keys=True) == json.dumps(right, sort_keys=True)


def _record_key(path: tuple[str, ...]) -> str:
    return ".".join(path)


def merge(
    config: dict[str, Any],
    *,
    state: str = "present",
    runtime_path: str = "/usr/bin/nvidia-container-runtime",
    nvidia_default: bool = True,
    cdi_enabled: bool = False,
    record: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return the merged configuration and the new record, leaving the arguments unchanged.

    The record maps each managed key the role changed to what was there before ({"existed": bool, "value": ...})
    and what the role set ("set"); for a new key, "created_from" is the depth of the first object the role had to
    create for it, so that undoing removes those objects again when they are left empty. A key is recorded the first
    time the role changes it, so later runs keep the user's original value. Undoing a key puts the previous value back
    only while the key still holds what the role set: a value the user changed since is theirs.
    """
    if state not in ("present", "absent"):
        raise ValueError(f"state must be present or absent, not {state!r}")
    new = json.loads(json.dumps(config))
    new_record = {key: dict(entry) for key, entry in (record or {}).items() if isinstance(entry, dict)}

    def put(path: tuple[str, ...], value: Any) -> None:
        exists, current = _get(new, path)
        if exists and _same(current, value):
            return
        key = _record_key(path)
        if key not in new_record:
            if exists:
                new_record[key] = {"existed": True, "value": current}
            else:
                new_record[key] = {"existed": False, "created_from": _first_missing(new, path)}
        new_record[key]["set"] = value
        _set(new, path, value)

    def undo(path: tuple[str, ...], *, without_record: str = "keep") -> None:
        entry = new_record.pop(_record_key(path), None)
        exists, current = _get(new, path)
        if entry is None:
            if exists and without_record == "remove":
                _delete(new, path)
            return
        if path != NVIDIA_RUNTIME and (not exists or not _same(current, entry.get("set"))):
            return
        if entry.get("existed"):
            _set(new, path, entry.get("value"))
        elif exists:
            _delete(new, path, entry.get("created_from", len(path)))

    if state == "present":
        exists, current = _get(new, NVIDIA_RUNTIME)
        runtime = dict(current) if exists else {}
        runtime["path"] = runtime_path
        put(NVIDIA_RUNTIME, runtime)
        if nvidia_default:
            put(DEFAULT_RUNTIME, NVIDIA)
        else:
            undo(DEFAULT_RUNTIME)
        if cdi_enabled:
            put(FEATURES_CDI, True)
        else:
            undo(FEATURES_CDI)
    else:
        undo(NVIDIA_RUNTIME, without_record="remove")
        # A default runtime that names a runtime which is gone would stop dockerd from starting.
        if _get(new, DEFAULT_RUNTIME) == (True, NVIDIA) and _record_key(DEFAULT_RUNTIME) not in new_record:
            _delete(new, DEFAULT_RUNTIME)
        else:
            undo(DEFAULT_RUNTIME)
        undo(FEATURES_CDI)
    return new, new_record


def render(config: dict[str, Any], original: bytes | None = None) -> str:
    """JSON text for daemon.json, indented like the original file where it had an indentation (else two spaces)."""
    indent: str | int = 2
    if original:
        found = _INDENT.search(original.decode("utf-8", errors="replace"))
        if found:
            indent = found.group(1)
    return json.dumps(config, indent=indent, ensure_ascii=False) + "\n"


def _decode_b64(content: str | None) -> bytes | None:
    if content is None:
        return None
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise AnsibleFilterError(
            f"docker_daemon_config expects base64 text, as ansible.builtin.slurp returns: {exc}"
        ) from None


def docker_daemon_config(
    content: str | None,
    state: str = "present",
    runtime_path: str = "/usr/bin/nvidia-container-runtime",
    nvidia_default: bool = True,
    cdi_enabled: bool = False,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The filter: see docker_daemon_config.yml."""
    data = _decode_b64(content)
    result: dict[str, Any] = {
        "problem": "",
        "exists": data is not None,
        "differs": False,
        "before": None,
        "after": None,
        "content": "",
        "record": dict(record or {}),
    }
    try:
        before = parse(data)
    except DaemonConfigError as exc:
        result["problem"] = str(exc)
        return result
    if record is not None and not isinstance(record, dict):
        raise AnsibleFilterError(f"docker_daemon_config: record must be a dict, not {type(record).__name__}")
    after, new_record = merge(
        before if before is not None else {},
        state=state,
        runtime_path=runtime_path,
        nvidia_default=nvidia_default,
        cdi_enabled=cdi_enabled,
        record=record,
    )
    # No file: present creates it; absent has nothing to remove.
    differs = state == "present" if before is None else not _same(after, before)
    result.update(
        before=before,
        after=after,
        differs=differs,
        content=render(after, data) if differs else (data or b"").decode("utf-8", errors="replace"),
        record=new_record,
    )
    return result


class FilterModule:
    """kubegpu.node Docker filters."""

    def filters(self) -> dict[str, Any]:
        return {"docker_daemon_config": docker_daemon_config}
