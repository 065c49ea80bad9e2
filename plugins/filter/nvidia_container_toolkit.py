# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# The filters of kubegpu.node.nvidia_container_toolkit, pure functions on what the role reads from the node:
#   openpgp_fingerprints   the primary key fingerprints in an OpenPGP public key (armoured or binary)
#   toolkit_package_plan   what apt must do so that the toolkit packages are at one version and held
#   toolkit_runtime_config the runtime's config.toml with the asked settings, edited line by line (comments kept)
# Documentation: one .yml file per filter next to this file. They run on the controller (Python 3.11+: tomllib).

from __future__ import annotations

import base64
import hashlib
import re
from typing import Any

import tomllib
from ansible.errors import AnsibleFilterError

# --- OpenPGP ------------------------------------------------------------------------------------------------------

_PUBLIC_KEY_TAG = 6


def _dearmor(text: str) -> bytes:
    lines = text.strip().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----"))
    except StopIteration:
        raise AnsibleFilterError("openpgp_fingerprints: no 'BEGIN PGP PUBLIC KEY BLOCK' in the key") from None
    body: list[str] = []
    in_headers = True
    for line in lines[start + 1 :]:
        line = line.strip()
        if line.startswith("-----END"):
            break
        if in_headers:
            if not line:
                in_headers = False
            elif ":" not in line:
                in_headers = False
                body.append(line)
            continue
        if line.startswith("="):  # the CRC24 line
            continue
        body.append(line)
    try:
        return base64.b64decode("".join(body), validate=True)
    except ValueError as exc:
        raise AnsibleFilterError(f"openpgp_fingerprints: the key's base64 is damaged ({exc})") from None


def _packets(data: bytes):
    """(tag, body) of each OpenPGP packet (RFC 9580 section 4.2)."""
    i = 0
    while i < len(data):
        header = data[i]
        if not header & 0x80:
            raise AnsibleFilterError(f"openpgp_fingerprints: not an OpenPGP packet at byte {i}")
        if header & 0x40:  # new format
            tag = header & 0x3F
            first = data[i + 1]
            if first < 192:
                length, i = first, i + 2
            elif first < 224:
                length, i = ((first - 192) << 8) + data[i + 2] + 192, i + 3
            elif first == 255:
                length, i = int.from_bytes(data[i + 2 : i + 6], "big"), i + 6
            else:
                raise AnsibleFilterError("openpgp_fingerprints: partial body lengths do not occur in keys")
        else:  # old format
            tag = (header >> 2) & 0x0F
            length_type = header & 0x03
            if length_type == 3:
                length, i = len(data) - i - 1, i + 1
            else:
                size = (1, 2, 4)[length_type]
                length, i = int.from_bytes(data[i + 1 : i + 1 + size], "big"), i + 1 + size
        if i + length > len(data):
            raise AnsibleFilterError("openpgp_fingerprints: the key is truncated")
        yield tag, data[i : i + length]
        i += length


def openpgp_fingerprints(key: str | bytes) -> list[str]:
    """The fingerprints of the primary keys (not subkeys) in a public key, upper-case hex, in order."""
    if isinstance(key, str):
        data = _dearmor(key)
    elif isinstance(key, bytes):
        data = key
    else:
        raise AnsibleFilterError(f"openpgp_fingerprints expects the key's text, not {type(key).__name__}")
    result = []
    for tag, body in _packets(data):
        if tag != _PUBLIC_KEY_TAG or not body:
            continue
        version = body[0]
        if version == 4:
            digest = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False)
        elif version == 5:
            digest = hashlib.sha256(b"\x9a" + len(body).to_bytes(4, "big") + body)
        elif version == 6:
            digest = hashlib.sha256(b"\x9b" + len(body).to_bytes(4, "big") + body)
        else:
            raise AnsibleFilterError(f"openpgp_fingerprints: key version {version} is not supported")
        result.append(digest.hexdigest().upper())
    if not result:
        raise AnsibleFilterError("openpgp_fingerprints: the data holds no public key")
    return result


# --- Debian versions and the package plan -------------------------------------------------------------------------


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's comparison of an upstream version or a revision."""
    i = j = 0
    while i < len(a) or j < len(b):
        first_diff = 0
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            bc = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ac != bc:
                return -1 if ac < bc else 1
            i += 1
            j += 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            if not first_diff:
                first_diff = ord(a[i]) - ord(b[j])
            i += 1
            j += 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return -1 if first_diff < 0 else 1
    return 0


def _split_version(version: str) -> tuple[int, str, str]:
    epoch = 0
    if ":" in version:
        head, version = version.split(":", 1)
        epoch = int(head)
    upstream, _dash, revision = version.rpartition("-") if "-" in version else (version, "", "0")
    return epoch, upstream, revision or "0"


def debian_version_compare(a: str, b: str) -> int:
    """-1, 0 or 1, as `dpkg --compare-versions`."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def parse_dpkg_query(text: str) -> dict[str, dict[str, str]]:
    """Lines "PACKAGE|VERSION|STATUS" (dpkg-query -W -f '${Package}|${Version}|${Status}\\n'; tabs work too).

    The version is empty for a package dpkg knows but that is not installed. Shared with the nvidia_driver filters:
    both roles read their packages with the same query.
    """
    result = {}
    for line in text.splitlines():
        parts = line.split("\t" if "\t" in line else "|")
        if len(parts) == 3 and parts[0]:
            want, _flag, state = ([*parts[2].split(), "", "", ""])[:3]
            result[parts[0]] = {"version": parts[1], "want": want, "state": state}
    return result


def toolkit_package_plan(
    dpkg_query: str, packages: list[str], version: str, state: str = "present", allow_downgrade: bool = False
) -> dict[str, Any]:
    """What apt and dpkg must do for ``packages`` to be installed at ``version`` and held (or removed, unheld)."""
    if state not in ("present", "absent"):
        raise AnsibleFilterError(f"toolkit_package_plan: state must be present or absent, not {state!r}")
    current = parse_dpkg_query(dpkg_query or "")
    installed = {
        name: info["version"] for name, info in current.items() if name in packages and info["state"] == "installed"
    }
    held = sorted(name for name, info in current.items() if name in packages and info["want"] == "hold")
    plan: dict[str, Any] = {
        "installed": installed,
        "held": held,
        "change": [],
        "downgrades": [],
        "direction": "none",
        "install": [],
        "to_hold": [],
        "to_unhold": held,
        "to_remove": sorted(
            name for name, info in current.items() if name in packages and info["state"] != "not-installed"
        ),
        "problem": "",
    }
    if state == "absent":
        return plan
    change = [name for name in packages if installed.get(name) != version]
    downgrades = [name for name in change if name in installed and debian_version_compare(installed[name], version) > 0]
    upgrades = [name for name in change if name in installed and name not in downgrades]
    plan["change"] = change
    plan["downgrades"] = downgrades
    plan["install"] = [f"{name}={version}" for name in packages] if change else []
    plan["to_hold"] = [name for name in packages if name not in held]
    plan["to_unhold"] = []
    if not change:
        plan["direction"] = "none"
    elif downgrades and upgrades:
        plan["direction"] = "mixed"
    elif downgrades:
        plan["direction"] = "downgrade"
    elif upgrades:
        plan["direction"] = "upgrade"
    else:
        plan["direction"] = "install"
    if downgrades and not allow_downgrade:
        versions = ", ".join(f"{name} {installed[name]}" for name in downgrades)
        plan["problem"] = (
            f"the pinned version {version} is older than what is installed ({versions}); a downgrade happens only "
            "when nvidia_container_toolkit_allow_downgrade is true"
        )
    return plan


# --- config.toml --------------------------------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY_LINE = re.compile(r"^\s*([A-Za-z0-9_-]+|\"[^\"]*\")\s*=")
_COMMENTED_KEY_LINE = re.compile(r"^\s*#\s*([A-Za-z0-9_-]+)\s*=")


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(c if c >= " " or c == "\t" else f"\\u{ord(c):04x}" for c in escaped)
    return f'"{escaped}"'


def _toml_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item, where) for item in value) + "]"
    raise AnsibleFilterError(f"toolkit_runtime_config: {where} must be a string, number, boolean or list")


def _flatten_settings(settings: dict, table: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, Any]]:
    result = []
    for key, value in settings.items():
        if isinstance(value, dict):
            result.extend(_flatten_settings(value, (*table, str(key))))
        else:
            result.append((table, str(key), value))
    return result


def _table_of(header: str) -> tuple[str, ...]:
    return tuple(part.strip().strip('"') for part in header.split("."))


def _lookup(doc: dict, table: tuple[str, ...], key: str) -> tuple[bool, Any]:
    node: Any = doc
    for part in table:
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    if not isinstance(node, dict) or key not in node:
        return False, None
    return True, node[key]


def _without(doc: dict, settings: list[tuple[tuple[str, ...], str, Any]]) -> dict:
    """The parsed document without the set keys (and without tables that only they created)."""
    import copy

    result = copy.deepcopy(doc)
    for table, key, _value in settings:
        node = result
        for part in table:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(key, None)

    def prune(node: dict) -> dict:
        return {
            k: prune(v) if isinstance(v, dict) else v
            for k, v in node.items()
            if not (isinstance(v, dict) and not prune(v))
        }

    return prune(result)


def _region(lines: list[str], table: tuple[str, ...]) -> tuple[int, int] | None:
    """The lines of a table: after its header (the file's start for the top level) up to the next header."""
    start = 0 if not table else None
    for number, line in enumerate(lines):
        header = _HEADER.match(line)
        if not header:
            continue
        if start is not None:
            return start, number
        if _table_of(header.group(1)) == table:
            start = number + 1
    return (start, len(lines)) if start is not None else None


def toolkit_runtime_config(current: str | None, settings: dict) -> dict[str, Any]:
    """config.toml of nvidia-container-runtime with ``settings`` (nested tables as dicts) applied.

    Only the lines of keys that change are touched: an active line is replaced, a commented-out default
    (``#key = value``, as NVIDIA ships most settings) is replaced by the active one in place, a key not there is
    added at the end of its table, a missing table at the end of the file. Comments and every other key stay.
    """
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise AnsibleFilterError("toolkit_runtime_config: the settings must be a dict (tables as nested dicts)")
    flat = _flatten_settings(settings)
    text = current or ""
    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return {"content": current, "changed": [], "problem": f"it is not valid TOML ({exc})"}
    lines = text.splitlines()
    changed = []
    for table, key, value in flat:
        where = ".".join((*table, key))
        rendered = f"{_toml_key(key)} = {_toml_value(value, where)}"
        present, old = _lookup(before, table, key)
        if present and old == value and type(old) is type(value):
            continue
        changed.append(where)
        region = _region(lines, table)
        if region is None:
            if lines and lines[-1].strip():
                lines.append("")
            lines.extend([f"[{'.'.join(_toml_key(part) for part in table)}]", rendered])
            continue
        start, end = region
        active = commented = None
        for number in range(start, end):
            match = _KEY_LINE.match(lines[number])
            if match and match.group(1).strip('"') == key:
                active = number
            match = _COMMENTED_KEY_LINE.match(lines[number])
            if match and match.group(1) == key and commented is None:
                commented = number
        if active is not None:
            lines[active] = rendered
        elif commented is not None:
            lines[commented] = rendered
        else:
            last = end
            while last > start and not lines[last - 1].strip():
                last -= 1
            lines.insert(last, rendered)
    content = "\n".join(lines) + ("\n" if lines else "")
    if not changed:
        return {"content": current, "changed": [], "problem": ""}
    try:
        after = tomllib.loads(content)
    except tomllib.TOMLDecodeError as exc:
        return {"content": current, "changed": [], "problem": f"the edited file would not be valid TOML ({exc})"}
    for table, key, value in flat:
        present, new = _lookup(after, table, key)
        if not present or new != value:
            where = ".".join((*table, key))
            return {"content": current, "changed": [], "problem": f"{where} could not be set in place"}
    if _without(after, flat) != _without(before, flat):
        return {"content": current, "changed": [], "problem": "the edit would change other settings"}
    return {"content": content, "changed": changed, "problem": ""}


class FilterModule:
    """kubegpu.node filters of the nvidia_container_toolkit role."""

    def filters(self) -> dict[str, Any]:
        return {
            "openpgp_fingerprints": openpgp_fingerprints,
            "toolkit_package_plan": toolkit_package_plan,
            "toolkit_runtime_config": toolkit_runtime_config,
        }
