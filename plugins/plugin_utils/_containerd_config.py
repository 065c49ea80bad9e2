# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of the kubegpu.node.containerd_config action, not a public API: it can change at any time.
# It runs on the controller (Python 3.11+, tomllib). The TOML work is pure (text and dicts in, text and dicts out); the
# Planner at the end reaches the node only through the small Node interface, so the tests need no host.

from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import tomllib

# containerd 1.x (config version 2) has one CRI plugin; containerd 2.x (config version 3) split it, and runtimes,
# the default runtime and CDI live in the runtime part.
CRI_PLUGIN_V2 = "io.containerd.grpc.v1.cri"
CRI_RUNTIME_PLUGIN_V3 = "io.containerd.cri.v1.runtime"
RUNC_V2_SHIM = "io.containerd.runc.v2"
SUPPORTED_VERSIONS = (2, 3)


class ConfigError(Exception):
    """A configuration that this module cannot (or must not) work with; the message says what to do."""


# ---------------------------------------------------------------------------------------------------------------------
# TOML reading and writing
# ---------------------------------------------------------------------------------------------------------------------


def loads(text: str, source: str) -> dict:
    """Parse TOML text; `source` names it in the error message."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _string(value: str) -> str:
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _string(key)


def _inline(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_inline(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_inline(v)}" for k, v in value.items()) + "}"
    if hasattr(value, "isoformat"):  # TOML dates, times and datetimes, as tomllib returns them
        return value.isoformat()
    raise ConfigError(f"cannot write a value of type {type(value).__name__} as TOML")


def _is_table_array(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(isinstance(item, dict) for item in value)


def dumps(doc: dict) -> str:
    """Write a dict as TOML: plain keys first, then one [table] per dict, indented by depth like containerd does."""
    lines: list[str] = []

    def emit(table: dict, path: list[str], header: str | None) -> None:
        depth = max(len(path) - 1, 0)
        indent = "  " * depth
        scalars = [(k, v) for k, v in table.items() if not isinstance(v, dict) and not _is_table_array(v)]
        if header is not None and (scalars or not table):
            if lines:
                lines.append("")
            lines.append(f"{indent}{header}")
        key_indent = indent if header is None else indent + "  "
        for key, value in scalars:
            lines.append(f"{key_indent}{_key(key)} = {_inline(value)}")
        for key, value in table.items():
            sub = [*path, key]
            name = ".".join(_key(part) for part in sub)
            if isinstance(value, dict):
                emit(value, sub, f"[{name}]")
            elif _is_table_array(value):
                for item in value:
                    if lines:
                        lines.append("")
                    lines.append(f"{'  ' * (len(sub) - 1)}[[{name}]]")
                    # Sub-tables of an array-of-tables item are written inline to keep the item together.
                    for item_key, item_value in item.items():
                        lines.append(f"{'  ' * len(sub)}{_key(item_key)} = {_inline(item_value)}")

    emit(doc, [], None)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# Editing the main file's top-level `imports` key without touching any other byte
# ---------------------------------------------------------------------------------------------------------------------


def _skip_string(text: str, i: int) -> int:
    """Index just after the TOML string that starts at text[i]."""
    quote = text[i]
    multiline = text.startswith(quote * 3, i)
    j = i + 3 if multiline else i + 1
    while j < len(text):
        char = text[j]
        if char == "\\" and quote == '"':
            j += 2
            continue
        if multiline and text.startswith(quote * 3, j):
            j += 3
            # Up to two more quotes right before the closing ones belong to the string.
            extra = 0
            while extra < 2 and j < len(text) and text[j] == quote:
                j += 1
                extra += 1
            return j
        if not multiline and char == quote:
            return j + 1
        if not multiline and char == "\n":
            break
        j += 1
    raise ConfigError("unterminated string")


def _skip_comment(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _skip_space(text: str, i: int, newlines: bool) -> int:
    while i < len(text):
        char = text[i]
        if char in " \t" or (newlines and char in "\r\n"):
            i += 1
        elif newlines and char == "#":
            i = _skip_comment(text, i)
        else:
            break
    return i


def _array_items(text: str, i: int) -> tuple[int, list[tuple[int, int]], list[int]]:
    """For the array starting at text[i] == '[': (end, item spans, comma positions)."""
    items: list[tuple[int, int]] = []
    commas: list[int] = []
    i += 1
    while True:
        i = _skip_space(text, i, newlines=True)
        if i >= len(text):
            raise ConfigError("unterminated array")
        if text[i] == "]":
            return i + 1, items, commas
        if text[i] == ",":
            commas.append(i)
            i += 1
            continue
        start = i
        i = _skip_value(text, i, in_array=True)
        items.append((start, i))


def _skip_value(text: str, i: int, in_array: bool = False) -> int:
    char = text[i] if i < len(text) else ""
    if char in "\"'":
        return _skip_string(text, i)
    if char == "[":
        return _array_items(text, i)[0]
    if char == "{":
        i += 1
        while i < len(text):
            char = text[i]
            if char in "\"'":
                i = _skip_string(text, i)
            elif char in "[{":
                i = _skip_value(text, i)
            elif char == "}":
                return i + 1
            else:
                i += 1
        raise ConfigError("unterminated inline table")
    stop = ",]}#\r\n" if in_array else "#\r\n"
    start = i
    while i < len(text) and text[i] not in stop:
        i += 1
    while i > start and text[i - 1] in " \t":
        i -= 1
    return i


class _Entry:
    """A top-level `key = value` of a TOML document: where its line starts, and where its value starts and ends."""

    def __init__(self, key: str, line_start: int, value_start: int, value_end: int) -> None:
        self.key = key
        self.line_start = line_start
        self.value_start = value_start
        self.value_end = value_end


def _top_level_entries(text: str) -> list[_Entry]:
    """The key/value pairs before the first [table] header, with their positions in the text."""
    entries: list[_Entry] = []
    i = 0
    while i < len(text):
        i = _skip_space(text, i, newlines=True)
        if i >= len(text) or text[i] == "[":
            break
        line_start = text.rfind("\n", 0, i) + 1
        parts = []
        while True:
            i = _skip_space(text, i, newlines=False)
            if i < len(text) and text[i] in "\"'":
                end = _skip_string(text, i)
                parts.append(loads(f"k = {text[i:end]}", "a key")["k"])
                i = end
            else:
                start = i
                while i < len(text) and (text[i].isalnum() or text[i] in "_-"):
                    i += 1
                if i == start:
                    raise ConfigError(f"unexpected character {text[i : i + 1]!r} in a top-level key")
                parts.append(text[start:i])
            i = _skip_space(text, i, newlines=False)
            if i < len(text) and text[i] == ".":
                i += 1
                continue
            break
        if i >= len(text) or text[i] != "=":
            raise ConfigError("a top-level key is not followed by '='")
        i = _skip_space(text, i + 1, newlines=False)
        value_start = i
        i = _skip_value(text, i)
        entries.append(_Entry(".".join(parts), line_start, value_start, i))
        i = _skip_space(text, i, newlines=False)
        if i < len(text) and text[i] == "#":
            i = _skip_comment(text, i)
    return entries


def _find_entry(text: str, key: str) -> _Entry | None:
    return next((entry for entry in _top_level_entries(text) if entry.key == key), None)


def _line_end(text: str, i: int) -> int:
    """Index just after the end of the line that contains text[i] (its newline included)."""
    end = text.find("\n", i)
    return len(text) if end < 0 else end + 1


def add_import(text: str, path: str) -> tuple[str, bool]:
    """Add `path` to the top-level `imports` list, creating the key when there is none.

    Returns the new text and whether the `imports` key itself was added. Every other byte is kept, and a second
    `imports` key is never written (TOML forbids it: containerd then refuses the whole file).
    """
    entry = _find_entry(text, "imports")
    item = _string(path)
    if entry is None:
        line = f"imports = [{item}]\n"
        version = _find_entry(text, "version")
        if version is None:
            return line + text, True
        at = _line_end(text, version.value_end)
        if not text[:at].endswith("\n"):  # the last line, without a newline: keep it that way
            return text[:at] + "\n" + line.rstrip("\n"), True
        return text[:at] + line + text[at:], True
    if text[entry.value_start] != "[":
        raise ConfigError("the top-level imports key is not a list")
    _end, items, commas = _array_items(text, entry.value_start)
    if not items:
        at = entry.value_start + 1
        return text[:at] + item + text[at:], False
    last_end = items[-1][1]
    trailing = [c for c in commas if c >= last_end]
    if trailing:
        at = trailing[0] + 1
        last_start = items[-1][0]
        line_break = text.rfind("\n", entry.value_start, last_start)
        if line_break >= 0 and text[line_break + 1 : last_start].strip() == "":
            # One item per line: keep that layout.
            return text[:at] + "\n" + text[line_break + 1 : last_start] + item + "," + text[at:], False
        return text[:at] + " " + item + "," + text[at:], False
    return text[:last_end] + ", " + item + text[last_end:], False


def remove_import(text: str, path: str, remove_key: bool) -> str:
    """Undo add_import: drop `path` from the top-level `imports` list.

    With `remove_key`, the `imports` line is removed too when `path` was its only item (the role added the key).
    """
    entry = _find_entry(text, "imports")
    if entry is None or text[entry.value_start] != "[":
        return text
    end, items, commas = _array_items(text, entry.value_start)
    for index, (start, stop) in enumerate(items):
        value = loads(f"v = {text[start:stop]}", "an import")["v"]
        if value != path:
            continue
        if remove_key and len(items) == 1:
            line_end = _line_end(text, end - 1)
            if text[entry.line_start : entry.value_start].strip().startswith("imports"):
                if line_end == len(text) and not text.endswith("\n") and entry.line_start > 0:
                    return text[: entry.line_start - 1]
                return text[: entry.line_start] + text[line_end:]
        before = [c for c in commas if c < start and (index == 0 or c >= items[index - 1][1])]
        if before:
            return text[: before[0]] + text[stop:]
        after = [c for c in commas if c >= stop and (index + 1 == len(items) or c < items[index + 1][0])]
        if after:
            cut = _skip_space(text, after[0] + 1, newlines=False)
            return text[:start] + text[cut:]
        return text[:start] + text[stop:]
    return text


def replace_imports(text: str, paths: list[str]) -> str:
    """The same document with its top-level `imports` set to `paths` (for throw-away candidates, not the live file)."""
    entry = _find_entry(text, "imports")
    line = "imports = [" + ", ".join(_string(p) for p in paths) + "]\n"
    if entry is None:
        return line + text
    cut = _line_end(text, max(entry.value_end - 1, entry.value_start))
    return line + text[: entry.line_start] + text[cut:]


# ---------------------------------------------------------------------------------------------------------------------
# Imports: which files containerd loads, in which order
# ---------------------------------------------------------------------------------------------------------------------


def config_version(doc: dict, source: str) -> int:
    """The config version of a main file; version 1 (no `version` key) and unknown versions are refused."""
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise ConfigError(f"{source}: version must be a number, not {version!r}")
    if version not in SUPPORTED_VERSIONS:
        if version == 1:
            raise ConfigError(
                f"{source} has no 'version' key, so containerd reads it as config version 1 (plugins named 'cri', "
                "no drop-ins), which this role does not edit. Convert it first: on containerd 2.x run "
                "'containerd config migrate', on 1.6/1.7 start from 'containerd config default' (version = 2)."
            )
        raise ConfigError(f"{source}: config version {version} is not supported (2 for containerd 1.x, 3 for 2.x)")
    return version


def imports_of(doc: dict, source: str) -> list[str]:
    imports = doc.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(item, str) for item in imports):
        raise ConfigError(f"{source}: imports must be a list of file names, not {imports!r}")
    return imports


def resolve_import(entry: str, parent: str) -> str:
    """containerd resolves a relative import against the folder of the file that names it."""
    return os.path.normpath(entry if os.path.isabs(entry) else os.path.join(os.path.dirname(parent), entry))


def pattern_matches(pattern: str, path: str) -> bool:
    """Whether an import names `path`: containerd globs only entries with '*', and '*' never crosses a '/'."""
    if "*" not in pattern:
        return os.path.normpath(pattern) == os.path.normpath(path)
    pattern_parts = os.path.normpath(pattern).split("/")
    path_parts = os.path.normpath(path).split("/")
    return len(pattern_parts) == len(path_parts) and all(
        fnmatch.fnmatchcase(name, part) for part, name in zip(pattern_parts, path_parts)
    )


def imports_cover(imports: list[str], parent: str, path: str) -> bool:
    return any(pattern_matches(resolve_import(entry, parent), path) for entry in imports)


def expand_imports(imports: list[str], parent: str, dropin: str, glob, replacement: str | None) -> list[str]:
    """The files the imports name, in containerd's order, as absolute paths.

    `glob(pattern)` lists existing files. The drop-in is left out (`replacement` None) or stands at its place under
    another name (`replacement`), whether or not it exists yet: candidates are tried out in a temporary folder.
    """
    files: list[str] = []
    for entry in imports:
        resolved = resolve_import(entry, parent)
        if "*" in resolved:
            matches = {os.path.normpath(p) for p in glob(resolved)}
            matches.discard(dropin)
            if pattern_matches(resolved, dropin) and replacement is not None:
                matches.add(dropin)
            names = sorted(matches)
        else:
            names = [resolved] if resolved != dropin or replacement is not None else []
        files.extend(replacement if name == dropin else name for name in names)
    return files


def files_in_load_order(main_path: str, main_doc: dict, dropin: str, load, glob) -> list[tuple[str, dict]]:
    """Every config file containerd reads, main file first, then imports breadth first, without the drop-in."""
    order: list[tuple[str, dict]] = []
    seen = set()
    pending = [(main_path, main_doc)]
    while pending:
        path, doc = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        order.append((path, doc))
        for name in expand_imports(imports_of(doc, path), path, dropin, glob, None):
            if name not in seen:
                pending.append((name, load(name)))
    return order


def section_in_effect(files: list[tuple[str, dict]], plugin_id: str) -> tuple[str | None, dict | None]:
    """containerd 1.x: the last file that sets a plugin's section replaces it as a whole, so that one is in effect."""
    found: tuple[str | None, dict | None] = (None, None)
    for path, doc in files:
        section = doc.get("plugins", {}).get(plugin_id) if isinstance(doc.get("plugins"), dict) else None
        if isinstance(section, dict):
            found = (path, section)
    return found


# ---------------------------------------------------------------------------------------------------------------------
# What is in effect, and what the drop-in must say
# ---------------------------------------------------------------------------------------------------------------------


def runtime_plugin_id(version: int) -> str:
    return CRI_RUNTIME_PLUGIN_V3 if version >= 3 else CRI_PLUGIN_V2


def get_path(doc: dict, *path: str):
    """doc[path[0]][path[1]]..., or None where a key is missing."""
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def runtime_section(dump: dict) -> dict:
    """The CRI section that holds runtimes in a `containerd config dump` (1.x dumps version 2, 2.x version 3)."""
    section = get_path(dump, "plugins", runtime_plugin_id(dump.get("version", 2)))
    if not isinstance(section, dict):
        raise ConfigError(
            "containerd's merged configuration has no CRI plugin section (is the CRI plugin disabled with "
            "disabled_plugins?); Kubernetes cannot use containerd without it"
        )
    return section


def default_runtime(dump: dict) -> str | None:
    return get_path(runtime_section(dump), "containerd", "default_runtime_name")


def host_systemd_cgroup(dump: dict, runtime_name: str = "nvidia") -> bool:
    """SystemdCgroup of the host's runc runtime (else of its default runtime); false, containerd's default, if unset."""
    return systemd_cgroup_of(runtime_section(dump), runtime_name)


def systemd_cgroup_of(section: dict, runtime_name: str = "nvidia") -> bool:
    """SystemdCgroup of the runc runtime (else the default runtime) of a CRI section, as dumped or as written."""
    runtimes = get_path(section, "containerd", "runtimes") or {}
    candidates = ["runc", get_path(section, "containerd", "default_runtime_name")]
    for name in candidates:
        if name and name != runtime_name and isinstance(runtimes.get(name), dict):
            value = get_path(runtimes[name], "options", "SystemdCgroup")
            if isinstance(value, bool):
                return value
    return False


def dumps_runtime_options(dump: dict) -> bool:
    """Whether `containerd config dump` shows the runtimes' options; containerd 1.4 prints every options table empty."""
    runtimes = get_path(runtime_section(dump), "containerd", "runtimes") or {}
    return any(isinstance(r, dict) and isinstance(r.get("options"), dict) and r["options"] for r in runtimes.values())


def supports_cdi(dump: dict) -> bool:
    """containerd 1.7 and later know enable_cdi (and dump it); 1.6 does not."""
    return "enable_cdi" in runtime_section(dump)


def nvidia_runtime(binary: str, systemd_cgroup: bool) -> dict:
    return {"runtime_type": RUNC_V2_SHIM, "options": {"BinaryName": binary, "SystemdCgroup": systemd_cgroup}}


def build_dropin(
    version: int,
    runtime_name: str,
    binary: str,
    systemd_cgroup: bool,
    make_default: bool,
    cdi: bool,
    cdi_spec_dirs: list[str],
    section_in_effect_copy: dict | None = None,
    runtimes_in_effect: dict | None = None,
) -> dict:
    """The drop-in document.

    containerd 2.x merges imported files key by key, so the drop-in holds only what changes. containerd 1.x replaces a
    plugin's whole section with the last file that sets it; then `section_in_effect_copy` (the user's CRI section) is
    carried along, and `runtimes_in_effect` when the user's section names no runtimes (a runtimes table replaces
    containerd's built-in runc entry).
    """
    plugin_id = runtime_plugin_id(version)
    section = copy.deepcopy(section_in_effect_copy) if section_in_effect_copy is not None else {}
    containerd = section.setdefault("containerd", {})
    if not isinstance(containerd, dict):
        raise ConfigError(f"plugins.{plugin_id}.containerd is not a table")
    runtimes = containerd.get("runtimes")
    if section_in_effect_copy is not None and not runtimes:
        runtimes = {k: copy.deepcopy(v) for k, v in (runtimes_in_effect or {}).items() if k != runtime_name}
    runtimes = dict(runtimes or {})
    runtimes[runtime_name] = nvidia_runtime(binary, systemd_cgroup)
    containerd["runtimes"] = runtimes
    if make_default:
        containerd["default_runtime_name"] = runtime_name
    if cdi:
        section["enable_cdi"] = True
        section["cdi_spec_dirs"] = list(cdi_spec_dirs)
    return {"version": version, "plugins": {plugin_id: section}}


def flatten(doc, prefix: tuple = ()) -> dict:
    """{(key, key, ...): leaf value}; empty tables count as leaves."""
    if isinstance(doc, dict) and doc:
        out = {}
        for key, value in doc.items():
            out.update(flatten(value, (*prefix, key)))
        return out
    return {prefix: doc}


def check_candidate(
    base: dict,
    candidate: dict,
    runtime_name: str,
    binary: str,
    systemd_cgroup: bool,
    make_default: bool,
    cdi: bool,
    check_options: bool = True,
) -> list[str]:
    """What is wrong with a candidate's merged configuration (`containerd config dump`) compared with the base one.

    The nvidia runtime, and the default runtime and CDI when asked, must be in effect; nothing else may differ.
    `check_options` false: this containerd dumps no runtime options (1.4), so only the runtime's type is checked.
    """
    problems: list[str] = []
    section = runtime_section(candidate)
    plugin_id = runtime_plugin_id(candidate.get("version", 2))
    prefix = f"plugins.{plugin_id}.containerd"
    runtime = get_path(section, "containerd", "runtimes", runtime_name)
    if not isinstance(runtime, dict):
        problems.append(f"{prefix}.runtimes.{runtime_name} is not in effect (is another import overriding it?)")
    else:
        expected = {
            ("runtime_type",): RUNC_V2_SHIM,
            ("options", "BinaryName"): binary,
            ("options", "SystemdCgroup"): systemd_cgroup,
        }
        for path, value in expected.items():
            if path[0] == "options" and not check_options:
                continue
            actual = get_path(runtime, *path)
            if actual != value:
                problems.append(f"{prefix}.runtimes.{runtime_name}.{'.'.join(path)} is {actual!r}, not {value!r}")
    wanted_default = runtime_name if make_default else default_runtime(base)
    if default_runtime(candidate) != wanted_default:
        problems.append(f"{prefix}.default_runtime_name is {default_runtime(candidate)!r}, not {wanted_default!r}")
    if cdi and section.get("enable_cdi") is not True:
        problems.append(f"plugins.{plugin_id}.enable_cdi is {section.get('enable_cdi')!r}, not True")

    ours = [("plugins", plugin_id, "containerd", "runtimes", runtime_name), ("imports",)]
    if make_default:
        ours.append(("plugins", plugin_id, "containerd", "default_runtime_name"))
    if cdi:
        ours += [("plugins", plugin_id, "enable_cdi"), ("plugins", plugin_id, "cdi_spec_dirs")]
    before, after = flatten(base), flatten(candidate)
    for key in sorted(set(before) | set(after), key=lambda k: [str(part) for part in k]):
        if any(key[: len(mine)] == mine for mine in ours):
            continue
        if before.get(key, "<unset>") != after.get(key, "<unset>"):
            problems.append(
                f"{'.'.join(str(part) for part in key)} would change from {before.get(key, '<unset>')!r} "
                f"to {after.get(key, '<unset>')!r}"
            )
    return problems


# ---------------------------------------------------------------------------------------------------------------------
# The record of what the role added (so that state=absent removes exactly that)
# ---------------------------------------------------------------------------------------------------------------------


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_record(text: str | None, source: str) -> dict:
    if not text:
        return {}
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source} is not valid JSON ({exc}); remove it to let the role start afresh") from exc
    if not isinstance(record, dict):
        raise ConfigError(f"{source} does not hold a JSON object; remove it to let the role start afresh")
    return record


def render_record(record: dict) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------------------------------------------------------------
# The plan: what the main file, the drop-in and the record must hold
# ---------------------------------------------------------------------------------------------------------------------

HEADER = """\
# Managed by Ansible (kubegpu.node.container_runtime): the {name} runtime for containerd, imported from {main}.
# Run the role with container_runtime_state=absent to remove it; containerd's previous default runtime then returns.
"""

HEADER_1X = """\
# containerd 1.x replaces a plugin's whole section with the last file that sets it, so this file also carries the
# CRI plugin settings in effect without it ({source}). Change those there and run the role again.
"""


# A candidate's drop-in lies next to it and is imported by this relative name, which containerd resolves against the
# folder of the file that names it (resolveImports in containerd's config loader, 1.x and 2.x).
TRIAL_DROPIN = "dropin.toml"


@dataclass(frozen=True)
class Trial:
    """A candidate for `containerd config dump`: the main file's text (as `name`) and the drop-in it imports as
    TRIAL_DROPIN (None: none)."""

    name: str
    main: str
    dropin: str | None = None


class Node(Protocol):
    """What the planner needs from the node. Nothing here changes a file containerd reads."""

    def prefetch(
        self, files: Iterable[str], modes: Iterable[str], globs: Iterable[str], default_unless: str | None
    ) -> None:
        """Read these at once (a hint: what is not read here is read when asked for). `default_unless`: also
        `containerd config default` when that file does not exist."""

    def read(self, path: str) -> str | None:
        """A file's text; None when it does not exist. Raises ConfigError when it is not UTF-8."""

    def mode(self, path: str) -> str | None:
        """A file's mode as four octal digits; None when it does not exist."""

    def glob(self, pattern: str) -> list[str]:
        """The paths that match `pattern` (containerd's glob: '*' never crosses a '/')."""

    def config_default(self) -> str:
        """`containerd config default`. Raises ConfigError when it fails."""

    def config_dump(self, trial: Trial, also: Sequence[Trial] = ()) -> str:
        """`containerd --config CANDIDATE config dump` of a candidate in a temporary folder. `also`: candidates the
        planner is likely to ask for next, dumped in the same go. Raises ConfigError when it fails."""


class Planner:
    """Works out containerd's files for the nvidia runtime and checks them with the node's own containerd.

    `params` are the options of kubegpu.node.containerd_config (see its documentation).
    """

    def __init__(self, node: Node, params: dict[str, Any]) -> None:
        self.node = node
        self.params = params
        self.main = os.path.normpath(params["path"])
        self.dropin = os.path.normpath(params["dropin"])

    def dump(self, trial: Trial, also: Sequence[Trial] = ()) -> dict:
        """containerd's merged configuration of a candidate."""
        return loads(self.node.config_dump(trial, also), f"containerd config dump ({trial.name})")

    @staticmethod
    def trial(name: str, main_text: str, imports: list[str], dropin: str | None = None) -> Trial:
        """The candidate where `main_text` imports `imports` (TRIAL_DROPIN among them when `dropin` is given)."""
        return Trial(name, replace_imports(main_text, imports), dropin)

    def load(self, path: str) -> dict:
        text = self.node.read(path)
        if text is None:
            raise ConfigError(f"{path} is imported by containerd's configuration but does not exist")
        return loads(text, path)

    def _current(self) -> tuple[str | None, str | None, dict, bool]:
        """The main file as it is, the role's record as text and parsed, and whether the record is of this setup."""
        main_before = self.node.read(self.main)
        record_before = self.node.read(self.params["record"])
        record = parse_record(record_before, self.params["record"])
        mine = record.get("dropin") == self.dropin and record.get("path") == self.main
        return main_before, record_before, record, mine

    def present(self) -> dict[str, Any]:
        params = self.params
        main_before, record_before, record, mine = self._current()
        dropin_before = self.node.read(self.dropin)
        if main_before is None:
            main_text = self.node.config_default()
            created_sha = sha256(main_text)
        else:
            main_text = main_before
            created_sha = record.get("main_created_sha256") if mine else None
        main_doc = loads(main_text, self.main)
        version = config_version(main_doc, self.main)
        imports = imports_of(main_doc, self.main)

        if imports_cover(imports, self.main, self.dropin):
            main_after = main_text
            ours = mine and record.get("import_added") is True and self.dropin in imports
            key_added = ours and record.get("imports_key_added") is True
        else:
            main_after, key_added = add_import(main_text, self.dropin)
            ours = True
        after_doc = loads(main_after, f"{self.main} with the import added")
        after_imports = imports_of(after_doc, self.main)

        trial_imports = expand_imports(after_imports, self.main, self.dropin, self.node.glob, TRIAL_DROPIN)
        # On a run with nothing to change the drop-in on disk is the candidate: it is dumped with the base.
        likely = (
            [] if dropin_before is None else [self.trial("candidate.toml", main_after, trial_imports, dropin_before)]
        )
        base = self.dump(
            self.trial(
                "base.toml", main_after, expand_imports(after_imports, self.main, self.dropin, self.node.glob, None)
            ),
            also=likely,
        )
        if params["cdi"] and not supports_cdi(base):
            raise ConfigError(
                "container_runtime_cdi is true, but this containerd has no CDI support (containerd 1.7 or "
                "later has it; this one does not know enable_cdi). Upgrade containerd or turn CDI off."
            )

        # containerd 1.x dumps version 2 and merges imports plugin section by plugin section.
        carries_section = base.get("version", 2) < 3
        header = HEADER.format(name=params["runtime_name"], main=self.main)
        section_copy = runtimes_in_effect = None
        if carries_section:
            files = files_in_load_order(self.main, after_doc, self.dropin, self.load, self.node.glob)
            source, section = section_in_effect(files, CRI_PLUGIN_V2)
            section_copy = section or {}
            runtimes_in_effect = get_path(runtime_section(base), "containerd", "runtimes")
            header += HEADER_1X.format(source=source or "containerd's built-in defaults")
        # containerd 1.4 dumps every runtime's options empty: then the files say what SystemdCgroup is.
        options_shown = dumps_runtime_options(base)
        systemd_cgroup = params.get("systemd_cgroup")
        if systemd_cgroup is None:
            systemd_cgroup = (
                host_systemd_cgroup(base, params["runtime_name"])
                if options_shown
                else systemd_cgroup_of(section_copy or {}, params["runtime_name"])
            )
        dropin_doc = build_dropin(
            version=version,
            runtime_name=params["runtime_name"],
            binary=params["runtime_path"],
            systemd_cgroup=systemd_cgroup,
            make_default=params["set_as_default"],
            cdi=params["cdi"],
            cdi_spec_dirs=params["cdi_spec_dirs"],
            section_in_effect_copy=section_copy,
            runtimes_in_effect=runtimes_in_effect,
        )
        dropin_content = header + dumps(dropin_doc)

        candidate = self.dump(self.trial("candidate.toml", main_after, trial_imports, dropin_content))
        problems = check_candidate(
            base,
            candidate,
            runtime_name=params["runtime_name"],
            binary=params["runtime_path"],
            systemd_cgroup=systemd_cgroup,
            make_default=params["set_as_default"],
            cdi=params["cdi"],
            check_options=options_shown,
        )
        if problems:
            raise ConfigError(
                f"containerd would not load the nvidia runtime as intended from {self.dropin} (nothing was changed): "
                + "; ".join(problems)
            )

        record_after = {
            "path": self.main,
            "dropin": self.dropin,
            "import_added": ours,
            "imports_key_added": bool(ours and key_added),
            "main_created_sha256": created_sha,
        }
        return {
            "config_version": version,
            "main_before": main_before,
            "main_content": main_after,
            "import_added": ours,
            "dropin_content": dropin_content,
            "record_before": record_before,
            "record_content": render_record(record_after),
            "systemd_cgroup": systemd_cgroup,
            "default_runtime_before": default_runtime(base),
            "carries_cri_section": carries_section,
        }

    def absent(self) -> dict[str, Any]:
        main_before, record_before, record, mine = self._current()
        main_after = main_before
        if main_before is not None and mine and record.get("import_added") is True:
            main_after = remove_import(main_before, self.dropin, record.get("imports_key_added") is True)
            if record.get("main_created_sha256") == sha256(main_after):
                main_after = None
        if main_after is not None:
            imports = imports_of(loads(main_after, self.main), self.main)
            # What containerd will load once the drop-in is gone must still be a valid configuration.
            self.dump(
                self.trial(
                    "after.toml", main_after, expand_imports(imports, self.main, self.dropin, self.node.glob, None)
                )
            )
        return {
            "main_before": main_before,
            "main_content": main_after,
            "import_added": False,
            "dropin_content": None,
            "record_before": record_before,
            "record_content": None,
        }

    def service_files(self, result: dict[str, Any]) -> list[dict[str, Any]]:
        """The files as kubegpu.node.service_config writes them, in the order that keeps a run cut between two of them
        undoable: the drop-in before the import that names it (containerd refuses to start when an import names a
        missing file) and the import gone before the drop-in on absent; the record of what the role added first on
        present and last on absent, so that no change of the role's is ever without it. 0600 for the drop-in: on
        containerd 1.x it repeats the CRI section, registry credentials included (only root reads it)."""
        dropin = {
            "path": self.dropin,
            "content": result["dropin_content"],
            "owner": "root",
            "group": "root",
            "mode": "0600",
        }
        main = {"path": self.main, "content": result["main_content"]}
        record = {"path": self.params["record"], "content": result["record_content"], "mode": "0644"}
        return [record, dropin, main] if self.params["state"] == "present" else [main, dropin, record]

    def plan(self) -> dict[str, Any]:
        """Every return value of kubegpu.node.containerd_config; raises ConfigError with what to do."""
        present = self.params["state"] == "present"
        # The node's files the plan reads, in one go, with the usual imports (conf.d/*.toml: the drop-in's folder).
        self.node.prefetch(
            files=[self.main, self.params["record"], self.dropin],
            modes=[self.main],
            globs=[os.path.join(os.path.dirname(self.dropin), "*.toml")],
            default_unless=self.main if present else None,
        )
        result = self.present() if present else self.absent()
        return {
            "main_path": self.main,
            "main_mode": self.node.mode(self.main) or "0644",
            "dropin": self.dropin,
            "dropin_before": self.node.read(self.dropin),
            **result,
            "service_files": self.service_files(result),
        }
