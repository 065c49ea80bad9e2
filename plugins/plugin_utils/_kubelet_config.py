# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.kubelet_feature_gates, not a public API: it can change at any time.
#
# KubeletConfiguration files (--config, --config-dir drop-ins, k3s' kubelet.conf.d) read as the kubelet reads them and
# edited where they hold featureGates, every other byte kept:
# - The kubelet reads its config file with sigs.k8s.io/yaml, so a file is YAML or JSON (EKS' AL2 images write
#   /etc/kubernetes/kubelet/kubelet-config.json, nodeadm writes /etc/kubernetes/kubelet/config.json). JSON is edited
#   as JSON, YAML as YAML: a block mapping line by line, a flow mapping ({A: true}) entry by entry, so comments stay.
# - healthzPort (default 10248; 0 turns the endpoint off) and healthzBindAddress (default 127.0.0.1) say where the
#   kubelet answers /healthz (KubeletConfiguration v1beta1); its flags --healthz-port and --healthz-bind-address
#   override the file, as every kubelet flag overrides its config file.
# No node I/O here.

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import yaml

GATES_KEY = "featureGates"
DEFAULT_HEALTHZ_PORT = 10248
DEFAULT_HEALTHZ_ADDRESS = "127.0.0.1"


class ConfigError(ValueError):
    """A config file the kubelet could not read, or one that cannot be edited safely; nothing was changed."""


# ---------------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------------


def is_json(text: str) -> bool:
    """Whether the file is JSON (it starts with `{` and parses as JSON)."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def load_config(text: str, path: str) -> dict[str, Any]:
    """The file's settings; raises ConfigError for a file the kubelet could not read either."""
    if is_json(text):
        doc = json.loads(text)
    else:
        try:
            doc = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as exc:
            kind = "JSON or YAML" if text.lstrip().startswith("{") else "YAML"
            raise ConfigError(
                f"{path} is not valid {kind} ({exc}); the kubelet could not read it either. Nothing was changed"
            ) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a KubeletConfiguration (not a mapping); nothing was changed")
    gates = doc.get(GATES_KEY)
    if gates is None:
        return doc
    if not isinstance(gates, dict):
        raise ConfigError(f"{path}: {GATES_KEY} must map gate names to true or false; nothing was changed")
    for name, value in gates.items():
        if not isinstance(value, bool):
            raise ConfigError(
                f"{path}: {GATES_KEY}.{name} is {value!r}, not true or false; the kubelet refuses it. "
                "Nothing was changed"
            )
    return doc


def config_gates(text: str | None, path: str) -> dict[str, bool]:
    if text is None:
        return {}
    return dict(load_config(text, path).get(GATES_KEY) or {})


def meaningful(doc: dict[str, Any]) -> bool:
    """Whether a drop-in still sets anything (apiVersion, kind and an empty featureGates set nothing)."""
    return any(key not in ("apiVersion", "kind") and not (key == GATES_KEY and not value) for key, value in doc.items())


@dataclass(frozen=True)
class Healthz:
    """Where the kubelet answers /healthz; port 0: it does not."""

    address: str
    port: int

    def url(self) -> str | None:
        if not self.port:
            return None
        host = self.address
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/healthz"


def healthz(docs: list[tuple[str, dict[str, Any]]], flags: dict[str, str]) -> Healthz:
    """The health endpoint from the config file and its drop-ins (later wins), then the flags (which win)."""
    address, port = DEFAULT_HEALTHZ_ADDRESS, DEFAULT_HEALTHZ_PORT
    for path, doc in docs:
        if "healthzBindAddress" in doc:
            address = str(doc["healthzBindAddress"])
        if "healthzPort" in doc:
            try:
                port = int(doc["healthzPort"])
            except (TypeError, ValueError):
                raise ConfigError(f"{path}: healthzPort is {doc['healthzPort']!r}, not a port number") from None
    if "--healthz-bind-address" in flags:
        address = flags["--healthz-bind-address"]
    if "--healthz-port" in flags:
        try:
            port = int(flags["--healthz-port"])
        except ValueError:
            raise ConfigError(f"--healthz-port={flags['--healthz-port']} is not a port number") from None
    return Healthz(address, port)


# ---------------------------------------------------------------------------------------------------------------------
# Editing: splices of the original text
# ---------------------------------------------------------------------------------------------------------------------

Splice = tuple[int, int, str]


def apply_splices(text: str, splices: list[Splice]) -> str:
    """`text` with each [start, end) replaced; splices must not overlap (an insertion may sit where a removal starts:
    the removal is applied first, then the insertion lands before what follows)."""
    out = text
    previous_start = len(text) + 1
    for start, end, new in sorted(splices, key=lambda s: (s[0], s[1]), reverse=True):
        if end > previous_start:
            raise ValueError("overlapping edits")
        out = out[:start] + new + out[end:]
        previous_start = start
    return out


@dataclass(frozen=True)
class Member:
    """One `key: value` of a flow mapping (JSON object or YAML flow mapping), with its spans."""

    key: str
    start: int  # the key's first character
    value_start: int
    value_end: int


@dataclass(frozen=True)
class FlowMap:
    open: int  # the `{`
    close: int  # the `}`
    members: list[Member]


def _render_gate(name: str, value: bool, as_json: bool) -> str:
    word = "true" if value else "false"
    return f"{json.dumps(name)}: {word}" if as_json else f"{name}: {word}"


def _edit_members(
    text: str, mapping: FlowMap, gates: dict[str, bool], as_json: bool, render_whole: str
) -> list[Splice]:
    """The splices that make `mapping` hold exactly `gates` (entries kept in place, new ones after the last)."""
    kept = [m for m in mapping.members if m.key in gates]
    if not kept:
        return [(mapping.open, mapping.close + 1, render_whole)]
    splices: list[Splice] = []
    members = mapping.members
    for position, member in enumerate(members):
        if member.key in gates:
            word = "true" if gates[member.key] else "false"
            if text[member.value_start : member.value_end] != word:
                splices.append((member.value_start, member.value_end, word))
            continue
        later = [m for m in members[position + 1 :] if m.key in gates]
        if later:
            splices.append((member.start, members[position + 1].start, ""))  # the entry, its comma, up to the next
        else:
            earlier = members[position - 1]
            splices.append((earlier.value_end, member.value_end, ""))  # the comma before it, and the entry
    present = {m.key for m in members}
    new = [(name, value) for name, value in gates.items() if name not in present]
    if new:
        last = kept[-1]
        index = members.index(last)
        if index > 0:
            separator = text[members[index - 1].value_end : last.start]
            separator = separator[separator.index(",") + 1 :] if "," in separator else " "
        else:
            separator = text[mapping.open + 1 : last.start] if "\n" in text[mapping.open + 1 : last.start] else " "
        separator = re.sub(r"[ \t]*#[^\n]*", "", separator)
        addition = "".join("," + separator + _render_gate(n, v, as_json) for n, v in new)
        splices.append((last.value_end, last.value_end, addition))
    return splices


# ---------------------------------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------------------------------

_JSON_WS = " \t\r\n"


def _skip_ws(text: str, index: int) -> int:
    while index < len(text) and text[index] in _JSON_WS:
        index += 1
    return index


def _json_value_end(text: str, index: int) -> int:
    """The end of the JSON value starting at `index` (the text is known to be valid JSON)."""
    decoder = json.JSONDecoder()
    _value, end = decoder.raw_decode(text, index)
    return end


def _json_object(text: str, index: int) -> FlowMap:
    """The members of the JSON object whose `{` is at `index`."""
    open_at = index
    members: list[Member] = []
    index = _skip_ws(text, index + 1)
    if text[index] == "}":
        return FlowMap(open_at, index, members)
    while True:
        key_start = index
        key, index = json.JSONDecoder().raw_decode(text, index)
        index = _skip_ws(text, index)
        index = _skip_ws(text, index + 1)  # the colon
        value_start = index
        value_end = _json_value_end(text, index)
        members.append(Member(str(key), key_start, value_start, value_end))
        index = _skip_ws(text, value_end)
        if text[index] == "}":
            return FlowMap(open_at, index, members)
        index = _skip_ws(text, index + 1)  # the comma


def _json_indent(text: str, mapping: FlowMap) -> str | None:
    """The indentation of the members of a multi-line object (None: written on one line)."""
    if not mapping.members:
        return None
    first = mapping.members[0]
    before = text[mapping.open + 1 : first.start]
    if "\n" not in before:
        return None
    return before.rsplit("\n", 1)[1]


def _render_json_object(gates: dict[str, bool], indent: str | None, unit: str) -> str:
    if not gates:
        return "{}"
    if indent is None:
        return "{" + ", ".join(_render_gate(n, v, True) for n, v in gates.items()) + "}"
    inner = indent + unit
    body = ",".join("\n" + inner + _render_gate(n, v, True) for n, v in gates.items())
    return "{" + body + "\n" + indent + "}"


def _set_json_gates(text: str, gates: dict[str, bool]) -> str:
    top = _json_object(text, _skip_ws(text, 0))
    indent = _json_indent(text, top)
    unit = indent if indent else "  "
    entries = [m for m in top.members if m.key == GATES_KEY]
    if not entries:
        if not gates:
            return text
        rendered = _render_json_object(gates, indent, unit)
        member = f"{json.dumps(GATES_KEY)}: {rendered}"
        if not top.members:
            inside = member if indent is None else "\n" + "  " + member + "\n"
            return text[: top.open + 1] + inside + text[top.close :]
        last = top.members[-1]
        separator = ("\n" + indent) if indent is not None else " "
        return apply_splices(text, [(last.value_end, last.value_end, "," + separator + member)])
    entry = entries[-1]
    if not gates:
        others = [m for m in top.members if m is not entry]
        if not others:
            return text[: top.open + 1] + text[top.close :]
        position = top.members.index(entry)
        if position + 1 < len(top.members):
            return apply_splices(text, [(entry.start, top.members[position + 1].start, "")])
        return apply_splices(text, [(top.members[position - 1].value_end, entry.value_end, "")])
    inner = _json_object(text, entry.value_start)
    one_line = inner.members and _json_indent(text, inner) is None
    whole = _render_json_object(gates, None if one_line else indent, unit)
    return apply_splices(text, _edit_members(text, inner, gates, True, whole))


# ---------------------------------------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------------------------------------

_TOP_GATES = re.compile(r"^featureGates\s*:\s*(#.*)?$")
_TOP_FLOW = re.compile(r"^featureGates\s*:[ \t]*\{", re.MULTILINE)
_GATE_LINE = re.compile(r"^(\s+)([\"']?)([A-Za-z0-9_.-]+)\2\s*:\s*([^#\s]+)\s*(#.*)?$")


def _edit_block(text: str, gates: dict[str, bool]) -> str | None:
    """featureGates as a block mapping at the top level, edited line by line; None when it is not written so."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if _TOP_GATES.match(line.rstrip("\r\n"))), None)
    if start is None:
        if re.search(r"^featureGates\s*:", text, re.MULTILINE):
            return None
        if not gates:
            return text
        body = "".join(f"  {name}: {'true' if value else 'false'}\n" for name, value in gates.items())
        prefix = text if not text or text.endswith("\n") else text + "\n"
        return prefix + "featureGates:\n" + body
    end = start + 1
    while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    block = lines[start + 1 : end]
    indent = "  "
    kept: list[str] = []
    seen: set[str] = set()
    for line in block:
        match = _GATE_LINE.match(line.rstrip("\r\n"))
        if not line.strip() or line.lstrip().startswith("#"):
            kept.append(line)
            continue
        if not match:
            return None
        indent = match.group(1)
        name = match.group(3)
        if name not in gates:
            continue
        seen.add(name)
        value = "true" if gates[name] else "false"
        raw = line.rstrip("\r\n")
        if match.group(4).lower() != value:
            line = raw[: match.start(4)] + value + raw[match.end(4) :] + line[len(raw) :]
        kept.append(line)
    for name, value in gates.items():
        if name not in seen:
            kept.append(f"{indent}{name}: {'true' if value else 'false'}\n")
    if not any(_GATE_LINE.match(line.rstrip("\r\n")) for line in kept):
        return "".join(lines[:start] + lines[end:])
    return "".join(lines[: start + 1] + kept + lines[end:])


def _yaml_scalar(text: str, index: int, stops: str) -> int:
    """The end of a flow scalar starting at `index` (quoted, or plain up to one of `stops`, a comment or newline)."""
    if text[index] in "'\"":
        quote = text[index]
        index += 1
        while index < len(text):
            if text[index] == "\\" and quote == '"':
                index += 2
                continue
            if text[index] == quote:
                if quote == "'" and text[index + 1 : index + 2] == "'":
                    index += 2
                    continue
                return index + 1
            index += 1
        raise ValueError("unterminated quote")
    start = index
    while index < len(text) and text[index] not in stops and text[index] != "\n":
        if text[index] == "#" and index > start and text[index - 1] in " \t":
            break
        index += 1
    while index > start and text[index - 1] in " \t":
        index -= 1
    return index


def _yaml_gap(text: str, index: int) -> int:
    """Past whitespace, newlines and comments inside a flow collection."""
    while index < len(text):
        if text[index] in " \t\r\n":
            index += 1
        elif text[index] == "#":
            while index < len(text) and text[index] != "\n":
                index += 1
        else:
            break
    return index


def _yaml_flow_map(text: str, open_at: int) -> FlowMap:
    members: list[Member] = []
    index = _yaml_gap(text, open_at + 1)
    while text[index] != "}":
        key_start = index
        key_end = _yaml_scalar(text, index, ":,}")
        raw_key = text[key_start:key_end]
        key = yaml.safe_load(raw_key) if raw_key[:1] in "'\"" else raw_key
        index = _yaml_gap(text, key_end)
        if text[index] != ":":
            raise ValueError("not a key: value entry")
        index = _yaml_gap(text, index + 1)
        value_start = index
        value_end = _yaml_scalar(text, index, ",}")
        members.append(Member(str(key), key_start, value_start, value_end))
        index = _yaml_gap(text, value_end)
        if text[index] == ",":
            index = _yaml_gap(text, index + 1)
    return FlowMap(open_at, index, members)


def _render_flow(gates: dict[str, bool]) -> str:
    return "{" + ", ".join(_render_gate(n, v, False) for n, v in gates.items()) + "}"


def _edit_flow(text: str, gates: dict[str, bool]) -> str | None:
    """featureGates written as a flow mapping ({A: true, B: false}), edited entry by entry; None if it is not."""
    match = _TOP_FLOW.search(text)
    if match is None:
        return None
    try:
        mapping = _yaml_flow_map(text, match.end() - 1)
    except (ValueError, IndexError, yaml.YAMLError):
        return None
    return apply_splices(text, _edit_members(text, mapping, gates, False, _render_flow(gates)))


# ---------------------------------------------------------------------------------------------------------------------
# The edit
# ---------------------------------------------------------------------------------------------------------------------


def set_config_gates(text: str | None, path: str, gates: dict[str, bool]) -> tuple[str, bool]:
    """The file's new text with featureGates == `gates` (in this order), and whether it had to be written out whole
    (only when featureGates is written in a form this editor does not take apart; the caller warns)."""
    text = text or ""
    original = load_config(text, path)
    expected = dict(original)
    expected.pop(GATES_KEY, None)
    if gates:
        expected[GATES_KEY] = gates

    def same(doc: dict[str, Any]) -> bool:
        # featureGates: {} is what no featureGates is to the kubelet (an emptied flow mapping keeps its comments)
        trimmed = {k: v for k, v in doc.items() if not (k == GATES_KEY and not v)}
        return trimmed == expected and list(doc.get(GATES_KEY) or {}) == list(gates)

    as_json = is_json(text)
    candidates: list[str | None] = []
    if as_json:
        try:
            candidates.append(_set_json_gates(text, gates))
        except (ValueError, IndexError):
            candidates.append(None)
    else:
        candidates.append(_edit_flow(text, gates))
        candidates.append(_edit_block(text, gates))
    for edited in candidates:
        if edited is None:
            continue
        try:
            check = load_config(edited, path)
        except ConfigError:
            continue
        if same(check):
            return edited, False
    if as_json:
        indent = re.search(r"\n([ \t]+)\"", text)
        rendered = json.dumps(expected, indent=indent.group(1) if indent else 2)
        return rendered + ("\n" if text.endswith("\n") else ""), True
    return yaml.safe_dump(expected, default_flow_style=False, sort_keys=False), True
