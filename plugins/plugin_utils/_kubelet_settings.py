# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.kubelet_feature_gates, not a public API: it can change at any time.
#
# Pure functions: where a kubelet under systemd takes its feature gates from, read as systemd and the kubelet read
# them (the unit file and its drop-ins, their Environment= lines, the environment files, ExecStart= as systemd expands
# it: _systemd_syntax; the --config file and the --config-dir drop-ins: _kubelet_config), which gates it runs with,
# what the gate table says this kubelet version accepts, and the new text of each file to change, every other byte
# of it kept. No node I/O here.

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_config as kc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg
from ansible_collections.kubegpu.node.plugins.plugin_utils import _systemd_syntax as sd

GATES_FLAG = "--feature-gates"
TRUE_WORDS = {"1", "t", "true"}
FALSE_WORDS = {"0", "f", "false"}
GATE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
# The variable kubeadm's drop-in (and the kubelet packages) leave to the user for more flags.
EXTRA_ARGS = "KUBELET_EXTRA_ARGS"


class PlanError(ValueError):
    """The settings cannot be planned (or must not be changed); nothing was changed."""


# ---------------------------------------------------------------------------------------------------------------------
# The version
# ---------------------------------------------------------------------------------------------------------------------


def kubelet_version(text: str) -> tuple[int, int]:
    """`kubelet --version` ('Kubernetes v1.30.2') -> (1, 30)."""
    match = re.search(r"v?(\d+)\.(\d+)(?:\.\d+)?", text)
    if not match or "kubernetes" not in text.lower():
        raise PlanError(f"`kubelet --version` printed {text.strip()!r}, not 'Kubernetes vX.Y.Z'")
    return int(match.group(1)), int(match.group(2))


# ---------------------------------------------------------------------------------------------------------------------
# The unit as systemd has loaded it: systemctl show, and systemctl --version
# ---------------------------------------------------------------------------------------------------------------------

SHOW_PROPERTIES = (
    "Id",
    "LoadState",
    "FragmentPath",
    "DropInPaths",
    "EnvironmentFiles",
    "NeedDaemonReload",
)


@dataclass
class UnitFiles:
    """The files systemd reads for a unit, in its order, and what it says about them."""

    unit: str
    load_state: str
    files: list[str]  # the unit file, then its drop-ins
    env_files: list[tuple[str, bool]]  # EnvironmentFile= (path, optional), specifiers resolved by systemd
    need_reload: bool
    systemd_version: int | None


def parse_show(show: str, unit: str) -> UnitFiles:
    """`systemctl show UNIT --property=...` (SHOW_PROPERTIES) followed by `systemctl --version`."""
    props: dict[str, str] = {}
    env_files: list[tuple[str, bool]] = []
    version = None
    for line in show.splitlines():
        match = re.match(r"^systemd (\d+)\b", line)
        if match:
            version = int(match.group(1))
            continue
        key, sep, value = line.partition("=")
        if not sep:
            continue
        if key == "EnvironmentFiles":
            if value.strip():
                optional = re.search(r"\s+\(ignore_errors=(yes|no)\)$", value)
                path = value[: optional.start()] if optional else value.strip()
                env_files.append((path.strip(), bool(optional and optional.group(1) == "yes")))
            continue
        props.setdefault(key, value)
    files = [props.get("FragmentPath", "")] if props.get("FragmentPath") else []
    files += props.get("DropInPaths", "").split()
    return UnitFiles(
        unit=props.get("Id") or unit,
        load_state=props.get("LoadState", ""),
        files=files,
        env_files=env_files,
        need_reload=props.get("NeedDaemonReload") == "yes",
        systemd_version=version,
    )


# ---------------------------------------------------------------------------------------------------------------------
# What ExecStart= gives the kubelet, and where each piece is written
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VarDef:
    """Where the value of a variable the kubelet's command line uses is written (the definition systemd uses).

    kind "env": an EnvironmentFile=, [start, end) from the key to the end of its line; kind "unit": an Environment=
    word of a unit file, [start, end) the word (quotes included)."""

    name: str
    path: str
    kind: str
    value: sd.Text
    start: int
    end: int


@dataclass
class Resolved:
    unit: UnitFiles
    service: sd.Service
    argv0: str
    args: list[sd.Arg]
    used: list[str]
    defs: dict[str, VarDef]
    missing_env_files: list[str] = field(default_factory=list)  # not optional, not there: systemd refuses to start

    def values(self) -> list[str]:
        return [arg.value for arg in self.args]

    def describe(self, arg: sd.Arg) -> str:
        """Where an argument is written, for messages."""
        if arg.source:
            found = self.defs.get(arg.source)
            if found is None:
                return f"${arg.source}"
            how = "Environment=" if found.kind == "unit" else "environment file"
            return f"${arg.source} ({how} {found.path})"
        command = self.service.command
        return f"ExecStart= of {command.path}" if command else "ExecStart="


def resolve(unit: UnitFiles, texts: dict[str, str | None]) -> Resolved:
    """The kubelet's arguments as systemd starts it: the unit's files read in order, Environment= then the
    environment files (which override it; a later one wins), ExecStart= expanded."""
    if unit.load_state and unit.load_state != "loaded":
        raise PlanError(f"systemd says {unit.unit} is {unit.load_state!r}, not loaded: is the kubelet installed?")
    files = [(path, text) for path in unit.files if (text := texts.get(path)) is not None]
    try:
        service = sd.read_service(files, unit.unit)
    except sd.SyntaxProblem as exc:
        raise PlanError(f"systemd cannot start {unit.unit} as written: {exc}; nothing was changed") from None
    if service.command is None:
        read = ", ".join(unit.files) or "no unit file"
        raise PlanError(f"{unit.unit} has no ExecStart= (read: {read}): is the kubelet installed as a systemd service?")
    defs: dict[str, VarDef] = {}
    env: dict[str, sd.Value] = {}
    for item in service.environment:
        defs[item.name] = VarDef(item.name, item.path, "unit", item.value, item.start, item.end)
        env[item.name] = sd.Value(item.value, item.path)
    missing: list[str] = []
    for path, optional in unit.env_files:
        text = texts.get(path)
        if text is None:
            if not optional:
                missing.append(path)
            continue
        for assignment in sd.read_env_file(text, unit.systemd_version):
            defs[assignment.key] = VarDef(
                assignment.key, path, "env", assignment.value, assignment.start, assignment.end
            )
            env[assignment.key] = sd.Value(assignment.value, path)
    expansion = sd.expand_command(service.command, env)
    argv0 = expansion.args[0].value if expansion.args else ""
    return Resolved(unit, service, argv0, expansion.args[1:], expansion.used, defs, missing)


# ---------------------------------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------------------------------


def parse_bool(text: str, where: str, gate: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise PlanError(f"{where}: {gate}={text}: {text!r} is not true or false (the kubelet refuses it too)")


def parse_gate_list(text: str, where: str) -> dict[str, bool]:
    """'A=true,B=false' (the --feature-gates and k3s forms) -> {'A': True, 'B': False}; `where` names the place."""
    gates: dict[str, bool] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise PlanError(f"{where}: {item!r} is not NAME=true|false (the kubelet refuses it too)")
        gates[name.strip()] = parse_bool(value, where, name.strip())
    return gates


def render_gate_list(gates: dict[str, bool]) -> str:
    return ",".join(f"{name}={'true' if value else 'false'}" for name, value in gates.items())


def flag_values(args: list[str], flag: str) -> list[tuple[int, str]]:
    """(index of the argument holding the value, value) of each `--flag=value` or `--flag value`."""
    found: list[tuple[int, str]] = []
    for index, arg in enumerate(args):
        if arg.startswith(flag + "="):
            found.append((index, arg[len(flag) + 1 :]))
        elif arg == flag and index + 1 < len(args):
            found.append((index + 1, args[index + 1]))
    return found


def last_flag(args: list[str], flag: str) -> str | None:
    found = flag_values(args, flag)
    return found[-1][1] if found else None


@dataclass(frozen=True)
class GateFlag:
    """One --feature-gates on the kubelet's command line: the argument(s) it takes and where they are written."""

    flag: int  # index of the argument that names the flag
    value: int  # index of the argument holding the list (the same one for --feature-gates=LIST)
    gates: dict[str, bool]
    where: str


def gate_flags(resolved: Resolved) -> list[GateFlag]:
    values = resolved.values()
    found: list[GateFlag] = []
    for index, text in flag_values(values, GATES_FLAG):
        flag_index = index if values[index].startswith(GATES_FLAG + "=") else index - 1
        arg = resolved.args[index]
        where = f"{GATES_FLAG} in {resolved.describe(arg)}"
        found.append(GateFlag(flag_index, index, parse_gate_list(text, where), where))
    return found


def merged(flags: list[GateFlag]) -> dict[str, bool]:
    """Repeated --feature-gates flags add up (a later one overrides an earlier one's gate), as in the kubelet."""
    gates: dict[str, bool] = {}
    for flag in flags:
        gates.update(flag.gates)
    return gates


# ---------------------------------------------------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Decision:
    set: dict[str, bool] = field(default_factory=dict)
    drop: dict[str, str] = field(default_factory=dict)  # gate -> why
    warnings: list[str] = field(default_factory=list)


def _version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def decide(
    table: dict[str, list[kg.Stage]],
    version: tuple[int, int],
    managed: dict[str, bool],
    user: dict[str, bool],
    present: dict[str, bool],
) -> Decision:
    """Which gates to write and which to take out, for kubelet `version`.

    `managed`: the gates the collection wants on (DevicePlugins, DevicePluginCDIDevices), written only where the
    kubelet has them off by default. `user`: the user's gates, written as asked where the kubelet accepts them.
    `present`: what the node's files set now. Raises PlanError for a user gate this kubelet would refuse.
    """
    v = _version(version)
    decision = Decision()
    refused: list[str] = []
    for name, value in user.items():
        stage = kg.stage_at(table, name, version)
        if not GATE_NAME.match(name):
            refused.append(f"{name!r} is not a feature gate name")
        elif stage is None:
            gone = kg.removal(table, name, version)
            if gone:
                refused.append(f"{name} was removed in Kubernetes {_version(gone.since)} (source: {gone.source})")
            elif name in table:
                first = table[name][0]
                refused.append(f"{name} does not exist yet in kubelet {v} (added in {_version(first.since)})")
            else:
                refused.append(
                    f"{name} is not in the gate table (add it with kubelet_feature_gate_table if kubelet {v} knows it)"
                )
        elif stage.locked and value != stage.default:
            refused.append(
                f"{name} is locked to {str(stage.default).lower()} in kubelet {v} (source: {stage.source}); "
                f"it cannot be set to {str(value).lower()}"
            )
        elif stage.locked:
            decision.drop[name] = f"locked to {str(stage.default).lower()} in kubelet {v}: setting it is redundant"
        else:
            decision.set[name] = value
    if refused:
        raise PlanError(
            f"kubelet {v} would refuse to start with the feature gates asked for in kubelet_feature_gates: "
            + "; ".join(refused)
            + ". Nothing was changed."
        )
    for name, value in managed.items():
        if name in user:
            continue
        stage = kg.stage_at(table, name, version)
        if stage is None:
            gone = kg.removal(table, name, version)
            decision.drop[name] = (
                f"removed in Kubernetes {_version(gone.since)}; source: {gone.source}"
                if gone
                else f"unknown to kubelet {v}"
            )
        elif stage.default == value:
            decision.drop[name] = (
                f"{stage.stage.upper() if stage.stage == 'ga' else stage.stage} and "
                f"{'locked ' if stage.locked else ''}{'on' if value else 'off'} by default in kubelet {v}"
            )
        else:
            decision.set[name] = value
    for name, value in present.items():
        if name in decision.set or name in decision.drop:
            continue
        stage = kg.stage_at(table, name, version)
        if stage is None and name in table:
            gone = kg.removal(table, name, version)
            decision.drop[name] = (
                f"removed in Kubernetes {_version(gone.since)}; source: {gone.source}"
                if gone
                else f"unknown to kubelet {v}"
            )
        elif stage is not None and stage.locked and value != stage.default:
            decision.drop[name] = f"locked to {str(stage.default).lower()} in kubelet {v}: the kubelet refuses it"
    return decision


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Plan:
    version: str
    files: list[dict[str, Any]]
    before: dict[str, bool]
    after: dict[str, bool]
    removed: dict[str, str]
    warnings: list[str]
    daemon_reload: bool = False
    healthz_url: str | None = None
    argv: list[str] = field(default_factory=list)
    # gate -> the places that set it now (files and variables), for messages
    places: dict[str, list[str]] = field(default_factory=dict)
    read: list[str] = field(default_factory=list)  # every file read, for messages


def effective(config: dict[str, bool], dropins: list[dict[str, bool]], flags: dict[str, bool]) -> dict[str, bool]:
    gates = dict(config)
    for dropin in dropins:
        gates.update(dropin)
    gates.update(flags)
    return dict(sorted(gates.items()))


def _config_error(exc: kc.ConfigError) -> PlanError:
    return PlanError(str(exc))


@dataclass
class _Edits:
    """Splices per file, applied at the end."""

    texts: dict[str, str | None]
    splices: dict[str, list[kc.Splice]] = field(default_factory=dict)
    appended: dict[str, str] = field(default_factory=dict)  # new lines for files (a new assignment)

    def splice(self, path: str, start: int, end: int, text: str) -> None:
        self.splices.setdefault(path, []).append((start, end, text))

    def result(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for path in dict.fromkeys([*self.splices, *self.appended]):
            text = self.texts.get(path) or ""
            try:
                text = kc.apply_splices(text, self.splices.get(path, []))
            except ValueError:
                raise PlanError(f"{path}: the edits planned for it overlap; nothing was changed") from None
            if path in self.appended:
                if text and not text.endswith("\n"):
                    text += "\n"
                text += self.appended[path]
            out[path] = text
        return out


def _remove_args(edits: _Edits, resolved: Resolved, first: int, last: int) -> None:
    """Take arguments first..last (one flag) out of the text they are written in, with the whitespace that
    separated them from their neighbours in the same place (the same variable, or ExecStart=)."""
    args = resolved.args
    head, tail = args[first], args[last]
    if head.path is None or tail.path is None:
        raise PlanError(
            f"cannot take {' '.join(a.value for a in args[first : last + 1])} out of {resolved.describe(head)}: it "
            "is built from ${...} inside a word; take it out by hand. Nothing was changed"
        )
    if (head.source, head.path) != (tail.source, tail.path):
        for index in range(last, first - 1, -1):  # flag and list written in different places: each on its own
            _remove_args(edits, resolved, index, index)
        return

    def same_place(index: int) -> bool:
        return 0 <= index < len(args) and args[index].source == head.source and args[index].path == head.path

    if same_place(last + 1):
        edits.splice(head.path, head.start, args[last + 1].start, "")
    elif same_place(first - 1):
        edits.splice(head.path, args[first - 1].end, tail.end, "")
    else:
        edits.splice(head.path, head.start, tail.end, "")


def _append_to_var(edits: _Edits, found: VarDef, addition: str) -> None:
    """Add ` addition` to the end of a variable's value, where it is written."""
    value = found.value
    if value.value and (found.kind == "env" or value.quoted[-1]):
        edits.splice(found.path, value.ends[-1], value.ends[-1], " " + addition)
        return
    new = (value.value + " " + addition).strip()
    if found.kind == "env":
        edits.splice(found.path, found.start, found.end, f"{found.name}={sd.quote_env_value(new)}")
    else:
        edits.splice(found.path, found.start, found.end, sd.quote_unit_word(f"{found.name}={new}"))


@dataclass(frozen=True)
class _Home:
    """Where a new --feature-gates flag goes when the kubelet has no config file."""

    var: str
    found: VarDef | None  # the definition to extend; None: a new assignment
    path: str
    kind: str  # env | unit
    insert_at: int | None = None  # unit: where the new Environment= line goes


def _home(resolved: Resolved, texts: dict[str, str | None], default_env_file: str, gates: dict[str, bool]) -> _Home:
    used = resolved.used
    if EXTRA_ARGS in used:
        found = resolved.defs.get(EXTRA_ARGS)
        if found is not None:
            return _Home(EXTRA_ARGS, found, found.path, found.kind)
        env_paths = [path for path, _optional in resolved.unit.env_files]
        if default_env_file in env_paths:
            return _Home(EXTRA_ARGS, None, default_env_file, "env")
        conventional = [p for p in env_paths if p.endswith(("/default/kubelet", "/sysconfig/kubelet"))]
        if conventional:
            return _Home(EXTRA_ARGS, None, conventional[-1], "env")
        command = resolved.service.command
        if command is not None:
            # A new Environment= line goes before the first ExecStart= line of the file that starts the kubelet.
            settings = sd.read_unit_file(texts.get(command.path) or "")
            first = next(s for s in settings if s.section == "Service" and s.key == "ExecStart")
            return _Home(EXTRA_ARGS, None, command.path, "unit", first.line_start)
    for kind in ("env", "unit"):
        for name in reversed(used):
            found = resolved.defs.get(name)
            if found is not None and found.kind == kind:
                return _Home(name, found, found.path, kind)
    raise PlanError(
        f"nowhere to add {GATES_FLAG}={render_gate_list(gates)} for the kubelet: it has no --config file and its "
        f"ExecStart= uses no variable that could carry flags (read: {', '.join(resolved.unit.files)}). Add "
        f"{GATES_FLAG}={render_gate_list(gates)} to its command line by hand. Nothing was changed"
    )


def plan(
    *,
    version: tuple[int, int],
    table: dict[str, list[kg.Stage]],
    managed: dict[str, bool],
    user: dict[str, bool],
    unit: UnitFiles,
    texts: dict[str, str | None],
    config_text: str | None,
    dropin_texts: dict[str, str],
    default_env_file: str,
    healthz_override: str = "",
) -> Plan:
    """The files to change so that the kubelet runs with the gates its version accepts.

    `texts`: every unit file and environment file of `unit` (None: it does not exist), and the default environment
    file. `config_text`: the --config file; `dropin_texts`: its --config-dir drop-ins."""
    resolved = resolve(unit, texts)
    values = resolved.values()
    config_path = last_flag(values, "--config")
    config_dir = last_flag(values, "--config-dir")
    if config_path and config_text is None:
        raise PlanError(f"the kubelet is started with --config={config_path}, which does not exist; nothing changed")
    try:
        config_doc = kc.load_config(config_text, config_path) if config_path and config_text is not None else {}
        cfg = dict(config_doc.get(kc.GATES_KEY) or {})
        dropin_paths = sorted(dropin_texts) if config_dir else []
        dropin_docs = {path: kc.load_config(dropin_texts[path], path) for path in dropin_paths}
    except kc.ConfigError as exc:
        raise _config_error(exc) from None
    dropins = {path: dict(dropin_docs[path].get(kc.GATES_KEY) or {}) for path in dropin_paths}
    flags = gate_flags(resolved)
    flag_gates = merged(flags)
    before = effective(cfg, [dropins[p] for p in dropin_paths], flag_gates)
    present: dict[str, bool] = {}
    places: dict[str, list[str]] = {}
    for where, gates in [
        (config_path or "", cfg),
        *[(p, dropins[p]) for p in dropin_paths],
        *[(f.where, f.gates) for f in flags],
    ]:
        present.update(gates)
        for name in gates:
            places.setdefault(name, []).append(where)
    decision = decide(table, version, managed, user, present)

    # Every source that names a gate gets the same value (flags override files, so both must agree); a gate that no
    # source names goes into the config file, or into the flags where there is none.
    add = {name: value for name, value in decision.set.items() if name not in present}
    drop = set(decision.drop)
    files: list[dict[str, Any]] = []
    warnings: list[str] = []

    def new_gates(current: dict[str, bool], extra: dict[str, bool]) -> dict[str, bool]:
        gates = {name: decision.set.get(name, value) for name, value in current.items() if name not in drop}
        gates.update(extra)
        return gates

    try:
        if config_path:
            wanted = new_gates(cfg, add)
            if wanted != cfg or list(wanted) != list(cfg):
                text, rewritten = kc.set_config_gates(config_text, config_path, wanted)
                if text != config_text:
                    files.append({"path": config_path, "content": text})
                if rewritten:
                    warnings.append(f"{config_path} was written out again whole (its featureGates could not be edited)")
            add_to_flags: dict[str, bool] = {}
        else:
            add_to_flags = add
        for path in dropin_paths:
            wanted = new_gates(dropins[path], {})
            if wanted != dropins[path]:
                text, rewritten = kc.set_config_gates(dropin_texts[path], path, wanted)
                # A drop-in that no longer sets anything goes (the kubelet would read an empty configuration from it).
                files.append({"path": path, "content": text if kc.meaningful(kc.load_config(text, path)) else None})
                if rewritten:
                    warnings.append(f"{path} was written out again whole (its featureGates could not be edited)")
    except kc.ConfigError as exc:
        raise _config_error(exc) from None

    # Flags: edit each --feature-gates that names a gate to change, in the text it is written in.
    edits = _Edits(texts=dict(texts))
    home = _home(resolved, texts, default_env_file, add_to_flags) if add_to_flags else None
    target = None
    if home is not None:
        in_home = [f for f in flags if resolved.args[f.value].source == home.var and home.found is not None]
        target = in_home[-1] if in_home else None
    seen_spans: set[tuple[str | None, int, int]] = set()
    for flag in flags:
        arg = resolved.args[flag.value]
        wanted = new_gates(flag.gates, add_to_flags if flag is target else {})
        if wanted == flag.gates and list(wanted) == list(flag.gates):
            continue
        span = (arg.path, arg.start, arg.end)
        if span in seen_spans:
            continue  # the same text reached the command line twice ($VAR used twice): edited once
        seen_spans.add(span)
        if arg.path is None:
            raise PlanError(
                f"{flag.where} is built from ${{...}} inside a word; change it to "
                f"{GATES_FLAG}={render_gate_list(wanted)} by hand. Nothing was changed"
            )
        if wanted:
            rendered = render_gate_list(wanted)
            new_text = rendered if flag.flag != flag.value else f"{GATES_FLAG}={rendered}"
            edits.splice(arg.path, arg.start, arg.end, new_text)
        else:
            _remove_args(edits, resolved, flag.flag, flag.value)
    if home is not None and target is None:
        addition = f"{GATES_FLAG}={render_gate_list(add_to_flags)}"
        if home.found is not None:
            _append_to_var(edits, home.found, addition)
        elif home.kind == "env":
            edits.appended[home.path] = f"{home.var}={sd.quote_env_value(addition)}\n"
        else:
            line = "Environment=" + sd.quote_unit_word(f"{home.var}={addition}") + "\n"
            edits.splice(home.path, home.insert_at or 0, home.insert_at or 0, line)
    new_texts = edits.result()
    for path, text in new_texts.items():
        if text != texts.get(path):
            files.append({"path": path, "content": text})

    after_cfg = new_gates(cfg, add) if config_path else {}
    after_flags = new_gates(flag_gates, add_to_flags)
    after = effective(after_cfg, [new_gates(dropins[p], {}) for p in dropin_paths], after_flags)
    edited_vars = {resolved.args[f.value].source for f in flags} | ({home.var} if home else set())
    _verify(resolved, texts, new_texts, after_flags, edited_vars)

    removed = {name: why for name, why in decision.drop.items() if name in present}
    if removed:
        warnings.insert(
            0,
            "feature gates taken out of the kubelet's settings: "
            + "; ".join(f"{name} ({why}, in {', '.join(places.get(name, []))})" for name, why in removed.items()),
        )
    unit_files = set(unit.files)
    daemon_reload = unit.need_reload or any(f["path"] in unit_files for f in files)
    if unit.need_reload:
        warnings.append(
            f"{unit.unit} changed on disk since systemd last read it: its files were read as they are now, and "
            "systemd reloads them before the kubelet restarts"
        )
    if resolved.missing_env_files:
        warnings.append(
            f"{unit.unit} names environment files that do not exist (systemd refuses to start it): "
            + ", ".join(resolved.missing_env_files)
        )
    try:
        docs = [(config_path, config_doc)] if config_path else []
        docs += [(p, dropin_docs[p]) for p in dropin_paths]
        flag_map = {
            name: value
            for name in ("--healthz-port", "--healthz-bind-address")
            if (value := last_flag(values, name)) is not None
        }
        endpoint = kc.healthz(docs, flag_map)
    except kc.ConfigError as exc:
        raise _config_error(exc) from None
    return Plan(
        version=_version(version),
        files=files,
        before=before,
        after=after,
        removed=removed,
        warnings=warnings,
        daemon_reload=daemon_reload,
        healthz_url=healthz_override or endpoint.url(),
        argv=[resolved.argv0, *values],
        places=places,
        read=[*unit.files, *[p for p, _o in unit.env_files], *([config_path] if config_path else []), *dropin_paths],
    )


def _other_args(values: list[str]) -> list[str]:
    """The arguments that are not --feature-gates (nor its list)."""
    out: list[str] = []
    skip = False
    for value in values:
        if skip:
            skip = False
        elif value == GATES_FLAG:
            skip = True
        elif not value.startswith(GATES_FLAG + "="):
            out.append(value)
    return out


def _verify(
    resolved: Resolved,
    texts: dict[str, str | None],
    new_texts: dict[str, str | None],
    expected: dict[str, bool],
    edited_vars: set[str | None],
) -> None:
    """Read the planned files back as systemd would and check that the kubelet gets exactly the flag gates planned,
    every other argument as before, and every variable not edited the same value: an edit that systemd would read
    otherwise is never written."""
    if not new_texts:
        return
    after = dict(texts)
    after.update(new_texts)
    changed = ", ".join(sorted(new_texts))
    try:
        again = resolve(resolved.unit, after)
        got = merged(gate_flags(again))
    except PlanError as exc:
        raise PlanError(f"the edit planned for {changed} would not read back ({exc}); nothing was changed") from None
    others_kept = _other_args(again.values()) == _other_args(resolved.values())
    vars_kept = all(
        again.defs.get(name) is not None and again.defs[name].value.value == found.value.value
        for name, found in resolved.defs.items()
        if name not in edited_vars
    )
    if got != expected or not others_kept or not vars_kept:
        raise PlanError(
            f"the edit planned for {changed} would not read back as intended (--feature-gates "
            f"{render_gate_list(got) or 'none'} instead of {render_gate_list(expected) or 'none'}"
            f"{'' if others_kept else ', other arguments changed'}{'' if vars_kept else ', other variables changed'}"
            "); nothing was changed. Please report this with those files"
        )


def provisioner_message(name: str, setting: str, planned: Plan) -> str:
    """Why a node whose kubelet settings a provisioner regenerates is not edited, and what to change instead."""
    wanted = ", ".join(f"{gate}={'true' if value else 'false'}" for gate, value in planned.after.items()) or "none"
    removed = ", ".join(planned.removed) or "none"
    return (
        f"this node's kubelet settings are generated by {name}, which would undo a local edit at its next run. "
        f"Change them at the source: {setting}. The kubelet {planned.version} feature gates should be: {wanted} "
        f"(take out: {removed}). Or set kubelet_allow_provisioned_edit to true to edit this node anyway. "
        "Nothing was changed."
    )


# ---------------------------------------------------------------------------------------------------------------------
# The kubelet's health, when nothing this role does restarts it
# ---------------------------------------------------------------------------------------------------------------------

HEALTH_SHOW_PROPERTIES = ("ActiveState", "SubState", "Result", "NRestarts", "ExecMainPID")


def is_down(state: dict[str, str]) -> bool:
    """Whether systemd says the service is not running now (failed, stopped, or waiting to be restarted after it
    exited); a unit that is starting or running may still come to answer."""
    return state.get("ActiveState") in ("failed", "inactive", "deactivating") or state.get("SubState") == "auto-restart"


UNRECOGNIZED = re.compile(r"unrecognized feature gate:? (\w+)|cannot set feature gate (\w+)")


def unhealthy_message(
    service: str, url: str | None, said: str, state: dict[str, str], error: str | None, planned: Plan
) -> str:
    """Why the kubelet does not answer, when this run did not restart it: systemd's word, the kubelet's own last
    error, and where a gate it names is set."""
    systemd = f"{state.get('ActiveState', '?')} ({state.get('SubState', '?')})"
    restarts = state.get("NRestarts")
    if restarts and restarts != "0":
        systemd += f", restarted {restarts} times"
    if state.get("Result") not in (None, "", "success"):
        systemd += f", result {state['Result']}"
    target = url or "systemd"
    message = f"{service} does not answer {target} ({said}); systemd says it is {systemd}."
    if error:
        message += f" Its last error: {error}."
        match = UNRECOGNIZED.search(error)
        gate = (match.group(1) or match.group(2)) if match else None
        if gate:
            where = planned.places.get(gate)
            message += (
                f" {gate} is set in {', '.join(where)}."
                if where
                else f" {gate} is set nowhere this role read ({', '.join(planned.read)})."
            )
            if gate not in planned.removed:
                message += (
                    f" The role's gate table does not say that kubelet {planned.version} refuses {gate}; if it is "
                    "wrong, correct it with kubelet_feature_gate_table (with a source), or take the gate out by hand."
                )
    if planned.files:
        message += (
            f" The feature gates this run plans for kubelet {planned.version} "
            f"({', '.join(f['path'] for f in planned.files)}) take effect only when it restarts, and its restart was "
            "held back (see the warning): restart it when that is safe, or run again with restarts allowed."
        )
    else:
        message += (
            f" Its feature gates are already right for kubelet {planned.version} as far as this role knows "
            f"(read: {', '.join(planned.read)}), so the cause is elsewhere: fix it, then run the role again."
        )
    return message
