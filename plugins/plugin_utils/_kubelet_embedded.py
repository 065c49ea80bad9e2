# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.kubelet_feature_gates, not a public API: it can change at any time.
#
# Pure functions for the kubelet embedded in k3s and rke2: it is not a unit of its own but runs inside the k3s or rke2
# process, which passes it the flags listed under `kubelet-arg` in its configuration files. No node I/O here; the
# decision itself (which gates to write, which to take out) is _kubelet_settings.decide over _kubelet_gates' table.
#
# Facts (each checked against the distribution's own documentation):
# - The configuration is /etc/rancher/k3s/config.yaml (k3s) or /etc/rancher/rke2/config.yaml (rke2), then the drop-ins
#   <config>.d/*.yaml in alphabetical order; "the last value found for a given key will be used", and in k3s "a `+`
#   can be appended to the key to append the value to the existing string or slice, instead of replacing it"
#   (k3s-io/docs, docs/installation/configuration.md, "Configuration File" and "Multiple Config Files", from
#   v1.19.1+k3s1). rke2 documents the same files and order, "slices are replaced" (docs.rke2.io install/configuration,
#   "Multiple Config Files", from v1.21.2+rke2r1); rke2 runs k3s' agent code, so `kubelet-arg+` is read the same way.
# - Repeatable flags are YAML lists; `kubelet-arg: [feature-gates=A=true]` is the kubelet's --feature-gates=A=true
#   (k3s-io/docs configuration.md, "Kubelet configuration", option 3: `--kubelet-arg=$FLAG`).
# - From k3s v1.32 the kubelet also reads drop-ins from /var/lib/rancher/k3s/agent/etc/kubelet.conf.d, where k3s
#   itself writes (and rewrites at every start) 00-k3s-defaults.conf; flags override them as in upstream (k3s-io/docs
#   configuration.md, "Kubelet configuration", version gate v1.32; k3s-io/k3s#2116).

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_config as kc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_settings as ks
from ansible_collections.kubegpu.node.plugins.plugin_utils import _systemd_syntax as sd

KEY = "kubelet-arg"
APPEND = KEY + "+"
GATES_ARG = "feature-gates"
# k3s writes this drop-in itself at every start: never edited (an edit would be undone at the next start anyway).
K3S_DEFAULTS_DROPIN = "00-k3s-defaults.conf"


def embedded_version(text: str, name: str) -> tuple[int, int]:
    """`k3s --version` ('k3s version v1.30.4+k3s1 (98262b5d)') or `rke2 --version` -> (1, 30)."""
    match = re.search(r"\bversion v?(\d+)\.(\d+)\.\d+", text)
    if not match or name not in text.lower():
        raise ks.PlanError(f"`{name} --version` printed {text.strip()!r}, not '{name} version vX.Y.Z+...'")
    return int(match.group(1)), int(match.group(2))


# ---------------------------------------------------------------------------------------------------------------------
# kubelet-arg
# ---------------------------------------------------------------------------------------------------------------------


def _gates_of(arg: str) -> dict[str, bool] | None:
    """The gates of a `feature-gates=A=true,...` entry (with or without leading dashes); None for any other entry."""
    name, sep, value = arg.lstrip("-").partition("=")
    if name != GATES_ARG or not sep:
        return None
    return ks.parse_gate_list(value, f"{KEY} {GATES_ARG}")


def _as_list(value: Any, path: str, key: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, (str, int, float, bool)) for item in value):
        return [str(item) for item in value]
    raise ks.PlanError(f"{path}: {key} is neither a string nor a list of strings; it was left untouched")


def load_doc(text: str | None, path: str) -> dict[str, Any]:
    if not text or not text.strip():
        return {}
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ks.PlanError(f"{path} is not valid YAML ({exc}); it was left untouched") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ks.PlanError(f"{path} is not a YAML mapping of options; it was left untouched")
    return doc


def merged_args(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The kubelet-arg list k3s ends with, file by file in order: `kubelet-arg` replaces, `kubelet-arg+` appends."""
    args: list[str] = []
    for path, doc in docs:
        if KEY in doc:
            args = _as_list(doc[KEY], path, KEY)
        if APPEND in doc:
            args = args + _as_list(doc[APPEND], path, APPEND)
    return args


def args_gates(args: list[str]) -> dict[str, bool]:
    """What the kubelet's repeated --feature-gates flags add up to (a later flag overrides an earlier one's gate)."""
    gates: dict[str, bool] = {}
    for arg in args:
        found = _gates_of(arg)
        if found:
            gates.update(found)
    return gates


def _edit_args(args: list[str], set_gates: dict[str, bool], drop: set[str], add: dict[str, bool]) -> list[str]:
    """The entries with each feature-gates entry edited, `add` appended to the last (or as a new entry)."""
    out: list[str] = []
    positions = [index for index, arg in enumerate(args) if _gates_of(arg) is not None]
    for index, arg in enumerate(args):
        found = _gates_of(arg)
        if found is None:
            out.append(arg)
            continue
        gates = {name: set_gates.get(name, value) for name, value in found.items() if name not in drop}
        if index == positions[-1]:
            gates.update(add)
            add = {}
        if gates:
            dashes = arg[: len(arg) - len(arg.lstrip("-"))]
            out.append(f"{dashes}{GATES_ARG}={ks.render_gate_list(gates)}")
    if add:
        out.append(f"{GATES_ARG}={ks.render_gate_list(add)}")
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Editing one configuration file: the kubelet-arg block edited line by line, every other byte kept
# ---------------------------------------------------------------------------------------------------------------------

_TOP_KEY = re.compile(r"^(?P<key>[^\s#'\"-][^:#]*?|'[^']*'|\"[^\"]*\")\s*:(?:\s+(?P<rest>.*?))?\s*$")
_ITEM = re.compile(r"^(?P<prefix>\s*-\s+)(?P<value>.*?)\s*$")


def _unquote_item(raw: str) -> tuple[str, str]:
    """A list item's value and its quote, without a trailing comment (an edited item loses its comment)."""
    quoted = re.match(r"""^(["'])((?:(?!\1).)*)\1\s*(?:#.*)?$""", raw)
    if quoted:
        return quoted.group(2), quoted.group(1)
    return re.sub(r"\s+#.*$", "", raw), ""


def _render_item(prefix: str, value: str, quote: str | None) -> str:
    """An item line: an edited item keeps its quoting (a plain one stays plain), a new one is double-quoted."""
    quote = '"' if quote is None else quote
    return f"{prefix}{quote}{value}{quote}\n"


def _edit_text(text: str, key: str, new: list[str] | None) -> str | None:
    """`text` with the top-level `key` list replaced by `new` (None: the key goes), editing only the lines that
    differ; None when the block is not a plain one-item-per-line list (the caller writes the file out whole)."""
    lines = text.splitlines(keepends=True)
    start = None
    for number, line in enumerate(lines):
        match = _TOP_KEY.match(line.rstrip("\r\n"))
        if match and match.group("key").strip("'\"") == key:
            if (match.group("rest") or "").split("#")[0].strip():
                return None  # an inline value (flow list or one string)
            start = number
            break
    if start is None:
        if new is None or not new:
            return text
        block = [f"{key}:\n"] + [_render_item("  - ", value, None) for value in new]
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        return "".join(lines + block)
    end = start + 1
    items: list[int] = []
    while end < len(lines):
        bare = lines[end].rstrip("\r\n")
        if bare.strip() and not bare[0].isspace() and not bare.startswith(("-", "#")):
            break
        if _ITEM.match(bare):
            items.append(end)
        end += 1
    old = [_unquote_item(_ITEM.match(lines[i].rstrip("\r\n")).group("value")) for i in items]  # type: ignore[union-attr]
    if any(value.startswith(("[", "{", "|", ">")) for value, _q in old):
        return None
    if new is None:
        kept = [line for line in lines[start + 1 : end] if not line.strip() or line.lstrip().startswith("#")]
        return "".join(lines[:start] + kept + lines[end:])
    if not new:
        return "".join([*lines[:start], f"{key}: []\n", *lines[end:]])
    prefix = _ITEM.match(lines[items[0]].rstrip("\r\n")).group("prefix") if items else "  - "  # type: ignore[union-attr]
    # Entries kept in order: an entry whose value is unchanged keeps its line; a changed one is rewritten in place;
    # the ones gone lose their line; new ones follow the last item.
    out = list(lines[: start + 1])
    remaining = list(new)
    for line_no in range(start + 1, end):
        if line_no not in items:
            out.append(lines[line_no])
            continue
        value, quote = old[items.index(line_no)]
        if value in remaining and remaining[0] == value:
            out.append(lines[line_no])
            remaining.pop(0)
        elif _gates_of(value) is not None and remaining and _gates_of(remaining[0]) is not None:
            out.append(_render_item(prefix, remaining.pop(0), quote))
        elif _gates_of(value) is not None:
            continue  # an entry left without gates goes
        else:
            return None
        if line_no == items[-1]:
            out.extend(_render_item(prefix, value, None) for value in remaining)
            remaining = []
    if remaining:
        out.extend(_render_item(prefix, value, None) for value in remaining)
    return "".join(out + lines[end:])


def set_key(text: str | None, path: str, key: str, new: list[str] | None) -> tuple[str, bool]:
    """The file's text with `key` set to `new` (None: removed), and whether it had to be written out whole."""
    doc = load_doc(text, path)
    expected = dict(doc)
    if new is None:
        expected.pop(key, None)
    else:
        expected[key] = new
    edited = _edit_text(text or "", key, new)
    if edited is not None and load_doc(edited, path) == expected:
        return edited, False
    return yaml.safe_dump(expected, default_flow_style=False, sort_keys=False), True


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Layout:
    """The files a k3s or rke2 node's kubelet takes its settings from, in the order they are read."""

    config_files: list[str]  # config.yaml, then config.yaml.d/*.yaml sorted
    kubelet_dropins: list[str]  # kubelet.conf.d/*.conf sorted (k3s 1.32 and later), k3s' own defaults included


def plan(
    *,
    name: str,
    version: tuple[int, int],
    table: dict[str, list[kg.Stage]],
    managed: dict[str, bool],
    user: dict[str, bool],
    layout: Layout,
    texts: dict[str, str | None],
    healthz_override: str = "",
) -> ks.Plan:
    """The files to change so that the embedded kubelet runs with the gates its version accepts.

    `texts`: every file of `layout` (None: it does not exist). Every place that names a gate gets the same value; a
    gate no file names is appended to the kubelet-arg list of the last configuration file that has one (config.yaml
    when none has).
    """
    try:
        return _plan(
            name=name,
            version=version,
            table=table,
            managed=managed,
            user=user,
            layout=layout,
            texts=texts,
            healthz_override=healthz_override,
        )
    except kc.ConfigError as exc:
        raise ks.PlanError(str(exc)) from None


def _plan(
    *,
    name: str,
    version: tuple[int, int],
    table: dict[str, list[kg.Stage]],
    managed: dict[str, bool],
    user: dict[str, bool],
    layout: Layout,
    texts: dict[str, str | None],
    healthz_override: str,
) -> ks.Plan:
    docs = [(path, load_doc(texts.get(path), path)) for path in layout.config_files]
    flags = args_gates(merged_args(docs))
    dropins = {path: kc.config_gates(texts.get(path), path) for path in layout.kubelet_dropins}
    before = ks.effective({}, list(dropins.values()), flags)
    present: dict[str, bool] = {}
    places: dict[str, list[str]] = {}
    for where, gates in [
        *dropins.items(),
        *[(f"{KEY} in {path}", args_gates(_doc_args(doc, path))) for path, doc in docs],
    ]:
        present.update(gates)
        for gate in gates:
            places.setdefault(gate, []).append(where)
    present.update(flags)
    decision = ks.decide(table, version, managed, user, present)
    drop = set(decision.drop)
    add = {gate: value for gate, value in decision.set.items() if gate not in present}
    home = next((path for path, doc in reversed(docs) if KEY in doc or APPEND in doc), layout.config_files[0])
    files: list[dict[str, Any]] = []
    warnings: list[str] = []
    new_texts = dict(texts)
    for position, (path, doc) in enumerate(docs):
        text = texts.get(path)
        target = (APPEND if APPEND in doc else KEY) if add and path == home else None
        earlier = any(KEY in d or APPEND in d for _p, d in docs[:position])
        for key in (KEY, APPEND):
            if key not in doc and key != target:
                continue
            current = _as_list(doc.get(key), path, key)
            wanted = _edit_args(current, decision.set, drop, add if key == target else {})
            if wanted == current and key in doc:
                continue
            value: list[str] | None = wanted
            if not wanted and (key == APPEND or not earlier):
                value = None  # nothing left, and no earlier list that an empty one would hide: the key goes
            text, rewritten = set_key(text, path, key, value)
            if rewritten:
                warnings.append(f"{path} was written out again whole (its {key} is not a plain list)")
        if text != texts.get(path):
            new_texts[path] = text
            # A configuration file the role creates gets k3s' own advice for it (it may hold the join token);
            # an existing one keeps its mode.
            files.append({"path": path, "content": text, **({"mode": "0600"} if texts.get(path) is None else {})})
    for path in layout.kubelet_dropins:
        if path.endswith("/" + K3S_DEFAULTS_DROPIN):
            continue
        wanted_gates = {g: decision.set.get(g, v) for g, v in dropins[path].items() if g not in drop}
        if wanted_gates != dropins[path]:
            text, rewritten = kc.set_config_gates(texts.get(path), path, wanted_gates)
            new_texts[path] = text if kc.meaningful(kc.load_config(text, path)) else None
            files.append({"path": path, "content": new_texts[path]})
            if rewritten:
                warnings.append(f"{path} was written out again whole (its featureGates are not a plain block)")

    after_docs = [(path, load_doc(new_texts.get(path), path)) for path in layout.config_files]
    after_dropins = [kc.config_gates(new_texts.get(path), path) for path in layout.kubelet_dropins]
    after = ks.effective({}, after_dropins, args_gates(merged_args(after_docs)))
    removed = {gate: why for gate, why in decision.drop.items() if gate in present}
    if removed:
        warnings.insert(
            0,
            f"feature gates taken out of {name}'s kubelet settings: "
            + "; ".join(f"{gate} ({why})" for gate, why in removed.items()),
        )
    arg_flags: dict[str, str] = {}
    for entry in merged_args(docs):
        flag, sep, value = ("--" + entry.lstrip("-")).partition("=")
        if sep:
            arg_flags[flag] = value
    dropin_docs = [(p, kc.load_config(texts[p] or "", p)) for p in layout.kubelet_dropins if texts.get(p)]
    endpoint = kc.healthz(dropin_docs, arg_flags)
    return ks.Plan(
        version=f"{version[0]}.{version[1]}",
        files=files,
        before=before,
        after=after,
        removed=removed,
        warnings=warnings,
        healthz_url=healthz_override or endpoint.url(),
        argv=[f"--{entry.lstrip('-')}" for entry in merged_args(docs)],
        places=places,
        read=[path for path in [*layout.config_files, *layout.kubelet_dropins] if texts.get(path) is not None],
    )


def unit_in_use(show: str) -> bool:
    """`systemctl show UNIT --property=LoadState,UnitFileState,ActiveState`: installed, and enabled or running (a node
    that merely has the package's unit file, disabled and stopped, is not a k3s/rke2 node)."""
    props = sd.show_properties(show)
    return props.get("LoadState") == "loaded" and (
        props.get("UnitFileState", "").startswith("enabled")
        or props.get("ActiveState") in ("active", "activating", "reloading")
    )


def units_in_use(show: str) -> list[str]:
    """`systemctl show UNIT... --property=Id,LoadState,UnitFileState,ActiveState` (one block per unit, blank lines
    between them): the units that are in use, in the order shown."""
    found: list[str] = []
    for block in show.split("\n\n"):
        props = sd.show_properties(block)
        if props.get("Id") and unit_in_use(block):
            found.append(props["Id"])
    return found


def unit_overrides(argv: list[str], environment: dict[str, str], name: str, default: str) -> tuple[str, list[str]]:
    """The configuration file the unit's command line (--config/-c) or environment ({NAME}_CONFIG_FILE) names, and
    the --kubelet-arg values on its command line (they replace config.yaml's whole list, as the docs say)."""
    config = environment.get(f"{name.upper()}_CONFIG_FILE") or default
    cli: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        flag, sep, value = arg.partition("=")
        if flag in ("--config", "-c", "--kubelet-arg"):
            if not sep and index + 1 < len(argv):
                value = argv[index + 1]
                index += 1
            if flag == "--kubelet-arg":
                cli.append(value)
            else:
                config = value
        index += 1
    return config, cli


def _doc_args(doc: dict[str, Any], path: str) -> list[str]:
    return _as_list(doc.get(KEY), path, KEY) + _as_list(doc.get(APPEND), path, APPEND)
