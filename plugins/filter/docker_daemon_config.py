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
# The record's entry saying that daemon.json did not exist before the role wrote it.
FILE_CREATED = "daemon.json"

_UTF8_BOM = b"\xef\xbb\xbf"
# Deeper than any Docker setting goes; keeps every later step (copy, compare, render) far from Python's recursion limit.
MAX_DEPTH = 64
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


def _refuse_constant(name: str) -> Any:
    raise DaemonConfigError(
        f"it contains {name}, which Python's JSON reader accepts but dockerd does not (JSON has no {name})"
    )


def _check_values(value: Any) -> None:
    """Refuse what the merge could not write back: nesting deeper than MAX_DEPTH, and strings (keys or values) that
    are not valid Unicode, such as a lone surrogate escape like "\\ud800" (Python reads it, no UTF-8 file holds it)."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)) and depth > MAX_DEPTH:
            raise DaemonConfigError(
                f"it is nested more than {MAX_DEPTH} levels deep, which no Docker setting needs; the role does not "
                "merge such a file"
            )
        if isinstance(item, dict):
            pending.extend((key, depth + 1) for key in item)
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                escaped = item.encode("utf-8", errors="backslashreplace").decode("ascii", errors="backslashreplace")
                raise DaemonConfigError(
                    f"it contains a string that is not valid Unicode ({escaped[:60]}): a lone surrogate escape such "
                    "as \\ud800, which no UTF-8 file can hold"
                ) from None


def parse(data: bytes | None) -> dict[str, Any] | None:
    """Parse daemon.json's bytes (None: the file does not exist) and check the parts the role reads or writes.

    Raises DaemonConfigError naming the problem. What dockerd refuses is refused here too, before anything changes: an
    empty file ("EOF"), a UTF-8 byte order mark, NaN/Infinity, invalid Unicode escapes.
    """
    if data is None:
        return None
    if data.startswith(_UTF8_BOM):
        raise DaemonConfigError(
            "it starts with a UTF-8 byte order mark, which dockerd refuses (\"invalid character 'ï' looking for "
            'beginning of value"); save it without the mark'
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DaemonConfigError(f"it is not valid UTF-8 (byte {exc.start})") from None
    if not text.strip():
        raise DaemonConfigError(
            'it is empty, and dockerd refuses an empty daemon.json ("EOF"); write {} into it, or remove it'
        )
    try:
        config = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise DaemonConfigError(f"it is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise DaemonConfigError(
            f"it is nested more than {MAX_DEPTH} levels deep, which no Docker setting needs; the role does not "
            "merge such a file"
        ) from None
    _check_values(config)
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
    time the role changes it, so later runs keep the user's original value. When a later run finds a setting
    (default-runtime, features.cdi) holding a value the role did not set, the user changed it since: that value becomes
    the one to put back. Undoing a key puts the previous value back only while the key still holds what the role set.
    The entry FILE_CREATED says that the role created daemon.json; undoing everything then removes the file again
    when nothing else was added to it.
    """
    if state not in ("present", "absent"):
        raise ValueError(f"state must be present or absent, not {state!r}")
    new = json.loads(json.dumps(config))
    new_record = {key: dict(entry) for key, entry in (record or {}).items() if isinstance(entry, dict)}

    def put(path: tuple[str, ...], value: Any) -> None:
        exists, current = _get(new, path)
        key = _record_key(path)
        entry = new_record.get(key)
        if entry is not None and path != NVIDIA_RUNTIME and not (exists and _same(current, entry.get("set"))):
            # Not what the role set: the user changed it since, so this is the value to put back one day.
            del new_record[key]
        if exists and _same(current, value):
            return
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


def _reloadable(before: dict[str, Any], after: dict[str, Any] | None) -> bool:
    """Whether dockerd applies the change on a reload (SIGHUP).

    A reload re-reads `runtimes` (the whole map) and `default-runtime`, and only when the file sets them: a key taken
    out of the file keeps its old value until a restart, and so does everything else (`features` among it).
    """
    if after is None:
        return False
    managed = ("runtimes", "default-runtime")
    if any(key in before and key not in after for key in managed):
        return False
    return _same(
        {k: v for k, v in before.items() if k not in managed}, {k: v for k, v in after.items() if k not in managed}
    )


def parse_record(record: Any) -> dict[str, Any]:
    """The role's record: a dict, or the record file's content base64-encoded (as slurp returns it), or None."""
    if record is None:
        return {}
    if isinstance(record, dict):
        return record
    if not isinstance(record, str):
        raise DaemonConfigError(f"it is {type(record).__name__}, not the record file's content")
    try:
        text = base64.b64decode(record, validate=True).decode("utf-8")
        parsed = json.loads(text, parse_constant=_refuse_constant) if text.strip() else {}
    except (binascii.Error, ValueError) as exc:
        raise DaemonConfigError(f"it is not valid JSON ({exc})") from None
    except RecursionError:
        raise DaemonConfigError("it is nested too deeply to be the role's record") from None
    if not isinstance(parsed, dict):
        raise DaemonConfigError(f"it holds {json_kind(parsed)}, not a JSON object")
    return parsed


def docker_daemon_config(
    content: str | None,
    state: str = "present",
    runtime_path: str = "/usr/bin/nvidia-container-runtime",
    nvidia_default: bool = True,
    cdi_enabled: bool = False,
    record: Any = None,
) -> dict[str, Any]:
    """The filter: see docker_daemon_config.yml."""
    data = _decode_b64(content)
    result: dict[str, Any] = {
        "problem": "",
        "record_problem": "",
        "exists": data is not None,
        "differs": False,
        "reloadable": True,
        "before": None,
        "after": None,
        "content": None,
        "record": {},
        "record_content": None,
    }
    try:
        before = parse(data)
    except DaemonConfigError as exc:
        result["problem"] = str(exc)
        return result
    try:
        previous = parse_record(record)
    except DaemonConfigError as exc:
        result["record_problem"] = str(exc)
        return result
    after, new_record = merge(
        before if before is not None else {},
        state=state,
        runtime_path=runtime_path,
        nvidia_default=nvidia_default,
        cdi_enabled=cdi_enabled,
        record=previous,
    )
    created = new_record.pop(FILE_CREATED, None) is not None or (before is None and state == "present")
    if state == "present" and created:
        new_record[FILE_CREATED] = {"created": True}
    # The role created the file and undoing left nothing of anyone else's in it: it goes, as it came.
    remove = state == "absent" and created and after == {}
    # No file: present creates it; absent has nothing to remove.
    differs = state == "present" if before is None else remove or not _same(after, before)
    if remove or (before is None and not differs):
        text = None
    elif differs:
        text = render(after, data)
    else:
        text = data.decode("utf-8") if data is not None else None
    result.update(
        before=before,
        after=None if remove else after,
        differs=differs,
        reloadable=_reloadable(before or {}, None if remove else after),
        content=text,
        record=new_record,
        record_content=json.dumps(new_record, indent=2, sort_keys=True) + "\n" if new_record else None,
    )
    return result


class FilterModule:
    """kubegpu.node Docker filters."""

    def filters(self) -> dict[str, Any]:
        return {"docker_daemon_config": docker_daemon_config}
