# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.kubelet_feature_gates, not a public API: it can change at any time.
#
# Pure functions: where a kubelet under systemd takes its feature gates from (the unit's ExecStart and environment,
# its environment files, the --config file and the --config-dir drop-ins), which gates it runs with, what the gate
# table says this kubelet version accepts, and the new text of each file to change. No node I/O here.

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from ansible_collections.kubegpu.node.plugins.plugin_utils import _kubelet_gates as kg

GATES_FLAG = "--feature-gates"
TRUE_WORDS = {"1", "t", "true"}
FALSE_WORDS = {"0", "f", "false"}


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
# The unit: systemctl show -p ExecStart -p Environment -p EnvironmentFiles
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class Unit:
    argv: list[str]
    environment: dict[str, str]
    env_files: list[str]


def _split_env_assignments(text: str) -> dict[str, str]:
    """systemctl show's Environment= value: space-separated assignments, a whole one quoted when it has spaces."""
    found: dict[str, str] = {}
    for match in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\S+)', text):
        item = match.group(1) if match.group(1) is not None else match.group(2)
        item = item.replace('\\"', '"').replace("\\\\", "\\")
        if "=" in item:
            name, value = item.split("=", 1)
            found[name] = value
    return found


def parse_unit(show: str) -> Unit:
    argv: list[str] = []
    environment: dict[str, str] = {}
    env_files: list[str] = []
    for line in show.splitlines():
        key, _sep, value = line.partition("=")
        if key == "ExecStart" and value.strip():
            match = re.search(r"argv\[\]=(.*?) ; ", value)
            if not match:
                raise PlanError(f"cannot read the kubelet's ExecStart from systemd: {value.strip()!r}")
            argv = match.group(1).split()
        elif key == "Environment":
            environment.update(_split_env_assignments(value))
        elif key == "EnvironmentFiles" and value.strip():
            env_files.append(re.sub(r"\s+\(ignore_errors=(yes|no)\)$", "", value.strip()))
    if not argv:
        raise PlanError("systemd shows no ExecStart for the kubelet unit: is it installed as a systemd service?")
    return Unit(argv=argv, environment=environment, env_files=env_files)


# ---------------------------------------------------------------------------------------------------------------------
# Environment files (systemd's EnvironmentFile= syntax, as kubeadm and the packages write them)
# ---------------------------------------------------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def _unquote(raw: str) -> tuple[str, str]:
    """The value and the quote it was written with ('"', "'" or '')."""
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        inner = raw[1:-1]
        return (inner.replace('\\"', '"') if raw[0] == '"' else inner), raw[0]
    return raw, ""


def parse_env_file(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        match = _ASSIGNMENT.match(line)
        if match:
            values[match.group(1)] = _unquote(match.group(2))[0]
    return values


def set_env_var(text: str | None, name: str, args: list[str]) -> str | None:
    """`text` with `name` set to the arguments (its last assignment edited in place); None: the file can go."""
    value = " ".join(args)
    if any('"' in arg or "\\" in arg for arg in args):
        raise PlanError(f"cannot write {name}: an argument holds a quote or backslash ({value})")
    lines = (text or "").splitlines(keepends=True)
    index = None
    quote = '"'
    for number, line in enumerate(lines):
        match = _ASSIGNMENT.match(line)
        if match and match.group(1) == name and not line.lstrip().startswith(("#", ";")):
            index = number
            quote = _unquote(match.group(2))[1] or ('"' if " " in value else "")
    if quote != "'" and " " in value and not quote:
        quote = '"'
    if quote == "'" and "'" in value:
        quote = '"'
    assignment = f"{name}={quote}{value}{quote}\n"
    if index is None:
        if not args:
            return text
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        lines.append(assignment)
    else:
        prefix = re.match(r"^\s*(?:export\s+)?", lines[index])
        lines[index] = (prefix.group(0) if prefix else "") + assignment
    return "".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------------------------------


def parse_bool(text: str, where: str) -> bool:
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise PlanError(f"{where}: {text!r} is not true or false")


def parse_gate_list(text: str, where: str) -> dict[str, bool]:
    """'A=true,B=false' (the --feature-gates and k3s forms) -> {'A': True, 'B': False}."""
    gates: dict[str, bool] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep:
            raise PlanError(f"{where}: {item!r} is not NAME=true|false")
        gates[name.strip()] = parse_bool(value, where)
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


def edit_flag_gates(args: list[str], set_gates: dict[str, bool], drop: set[str], add: dict[str, bool]) -> list[str]:
    """The arguments with each --feature-gates edited: gates in `set_gates` get that value, those in `drop` go,
    `add` is appended to the last such flag (or as a new flag); a flag left empty goes."""
    out: list[str] = []
    pending = dict(add)
    occurrences = len(flag_values(args, GATES_FLAG))
    seen = 0
    index = 0
    while index < len(args):
        arg = args[index]
        separate = arg == GATES_FLAG and index + 1 < len(args)
        if not (separate or arg.startswith(GATES_FLAG + "=")):
            out.append(arg)
            index += 1
            continue
        value = args[index + 1] if separate else arg[len(GATES_FLAG) + 1 :]
        index += 2 if separate else 1
        seen += 1
        gates = {n: set_gates.get(n, v) for n, v in parse_gate_list(value, GATES_FLAG).items() if n not in drop}
        if seen == occurrences:
            gates.update(pending)
            pending = {}
        if gates:
            out.extend(
                [GATES_FLAG, render_gate_list(gates)] if separate else [f"{GATES_FLAG}={render_gate_list(gates)}"]
            )
    if pending:
        out.append(f"{GATES_FLAG}={render_gate_list(pending)}")
    return out


# ---------------------------------------------------------------------------------------------------------------------
# KubeletConfiguration files (YAML or JSON): featureGates edited in place, every other byte kept
# ---------------------------------------------------------------------------------------------------------------------


def load_config(text: str, path: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise PlanError(
            f"{path} is not valid YAML ({exc}); the kubelet could not read it either. Nothing changed"
        ) from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PlanError(f"{path} is not a KubeletConfiguration (not a mapping); nothing changed")
    gates = doc.get("featureGates") or {}
    if not isinstance(gates, dict) or not all(isinstance(v, bool) for v in gates.values()):
        raise PlanError(f"{path}: featureGates must map gate names to true or false; nothing changed")
    return doc


def config_gates(text: str | None, path: str) -> dict[str, bool]:
    if text is None:
        return {}
    return dict(load_config(text, path).get("featureGates") or {})


_TOP_GATES = re.compile(r"^featureGates\s*:\s*(#.*)?$")
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


def set_config_gates(text: str | None, path: str, gates: dict[str, bool]) -> tuple[str, bool]:
    """The file's new text with featureGates == `gates` (in this order), and whether it had to be re-serialised."""
    original = load_config(text or "", path)
    edited = _edit_block(text or "", gates)
    rewritten = False
    if edited is not None:
        check = load_config(edited, path)
        expected = dict(original)
        expected.pop("featureGates", None)
        if gates:
            expected["featureGates"] = gates
        if check != expected:
            edited = None
    if edited is None:
        doc = dict(original)
        doc.pop("featureGates", None)
        if gates:
            doc["featureGates"] = gates
        edited = yaml.safe_dump(doc, default_flow_style=False, sort_keys=False)
        rewritten = True
    return edited, rewritten


# ---------------------------------------------------------------------------------------------------------------------
# Where the kubelet reads its gates
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class FlagSource:
    """One $VAR of ExecStart: where it is defined and the arguments it gives the kubelet."""

    var: str
    path: str | None  # the environment file that defines it; None: the unit itself (Environment=)
    args: list[str]


@dataclass
class Sources:
    flags: list[FlagSource]
    fixed_args: list[str]  # arguments written in ExecStart itself
    config_path: str | None
    config_dir: str | None

    def all_args(self) -> list[str]:
        return self.fixed_args + [arg for source in self.flags for arg in source.args]


def resolve_sources(unit: Unit, env_texts: dict[str, str | None]) -> Sources:
    """What ExecStart expands to, var by var (systemd: EnvironmentFile= overrides Environment=, later files win)."""
    defined: dict[str, tuple[str | None, str]] = {name: (None, value) for name, value in unit.environment.items()}
    for path in unit.env_files:
        text = env_texts.get(path)
        if text is None:
            continue
        for name, value in parse_env_file(text).items():
            defined[name] = (path, value)
    flags: list[FlagSource] = []
    fixed: list[str] = []
    for token in unit.argv[1:]:
        match = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", token)
        if match:
            path, value = defined.get(match.group(1), (None, ""))
            flags.append(FlagSource(match.group(1), path, value.split()))
        else:
            fixed.append(token)
    sources = Sources(flags=flags, fixed_args=fixed, config_path=None, config_dir=None)
    args = sources.all_args()
    configs = flag_values(args, "--config")
    dirs = flag_values(args, "--config-dir")
    sources.config_path = configs[-1][1] if configs else None
    sources.config_dir = dirs[-1][1] if dirs else None
    return sources


def flag_gates(sources: Sources) -> dict[str, bool]:
    gates: dict[str, bool] = {}
    for _index, value in flag_values(sources.all_args(), GATES_FLAG):
        gates.update(parse_gate_list(value, GATES_FLAG))
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
        if stage is None:
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


def effective(config: dict[str, bool], dropins: list[dict[str, bool]], flags: dict[str, bool]) -> dict[str, bool]:
    gates = dict(config)
    for dropin in dropins:
        gates.update(dropin)
    gates.update(flags)
    return dict(sorted(gates.items()))


def plan(
    *,
    version: tuple[int, int],
    table: dict[str, list[kg.Stage]],
    managed: dict[str, bool],
    user: dict[str, bool],
    unit: Unit,
    env_texts: dict[str, str | None],
    config_text: str | None,
    dropin_texts: dict[str, str],
    default_env_file: str,
) -> Plan:
    sources = resolve_sources(unit, env_texts)
    config_path = sources.config_path
    if config_path and config_text is None:
        raise PlanError(f"the kubelet is started with --config={config_path}, which does not exist; nothing changed")
    cfg = config_gates(config_text, config_path or "") if config_path else {}
    dropin_paths = sorted(dropin_texts)
    dropins = {path: config_gates(dropin_texts[path], path) for path in dropin_paths}
    flags = flag_gates(sources)
    before = effective(cfg, [dropins[p] for p in dropin_paths], flags)
    present: dict[str, bool] = {}
    for gates in [cfg, *[dropins[p] for p in dropin_paths], flags]:
        present.update(gates)
    decision = decide(table, version, managed, user, present)

    # Every source that names a gate gets the same value (flags override files, so both must agree); a gate that no
    # source names goes into the config file, or into the flags where there is none.
    mentioned = set(present)
    add = {name: value for name, value in decision.set.items() if name not in mentioned}
    drop = set(decision.drop)
    files: list[dict[str, Any]] = []
    warnings: list[str] = []

    def new_gates(current: dict[str, bool], extra: dict[str, bool]) -> dict[str, bool]:
        gates = {name: decision.set.get(name, value) for name, value in current.items() if name not in drop}
        gates.update(extra)
        return gates

    if config_path:
        wanted = new_gates(cfg, add)
        if wanted != cfg or list(wanted) != list(cfg):
            text, rewritten = set_config_gates(config_text, config_path, wanted)
            if text != config_text:
                files.append({"path": config_path, "content": text})
            if rewritten:
                warnings.append(f"{config_path} was written out again whole (its featureGates are not a plain block)")
        add = {}
    for path in dropin_paths:
        wanted = new_gates(dropins[path], {})
        if wanted != dropins[path]:
            text, rewritten = set_config_gates(dropin_texts[path], path, wanted)
            # A drop-in that no longer sets anything goes (the kubelet would read an empty configuration from it).
            left = {k: v for k, v in load_config(text, path).items() if k not in ("apiVersion", "kind")}
            files.append({"path": path, "content": text if left else None})
            if rewritten:
                warnings.append(f"{path} was written out again whole (its featureGates are not a plain block)")

    # Flags: edit each variable that carries --feature-gates; add to the home variable when nothing else can hold it.
    home = _home(sources, unit, default_env_file) if add else None
    texts: dict[str, str | None] = {}
    for source in sources.flags:
        has_gates = bool(flag_values(source.args, GATES_FLAG))
        is_home = home is not None and source.var == home[0]
        if not has_gates and not is_home:
            continue
        gates_here: dict[str, bool] = {}
        for _i, value in flag_values(source.args, GATES_FLAG):
            gates_here.update(parse_gate_list(value, GATES_FLAG))
        touched = any(name in drop or name in decision.set for name in gates_here)
        if not touched and not is_home:
            continue
        new_args = edit_flag_gates(source.args, decision.set, drop, add if is_home else {})
        if new_args == source.args:
            continue
        path = source.path if source.path else (home[1] if is_home and home else None)
        if path is None:
            raise PlanError(
                f"the kubelet unit sets {source.var} itself (Environment=) with {GATES_FLAG}; edit that unit "
                f"drop-in by hand, or move the flag into an environment file. Nothing changed"
            )
        current = texts.get(path, env_texts.get(path))
        texts[path] = set_env_var(current, source.var, new_args)
    for path, text in texts.items():
        if text != env_texts.get(path):
            files.append({"path": path, "content": text})

    after_cfg = new_gates(cfg, {name: v for name, v in decision.set.items() if name not in mentioned})
    after_cfg = after_cfg if config_path else {}
    after_flags = new_gates(flags, {} if config_path else add)
    after = effective(after_cfg, [new_gates(dropins[p], {}) for p in dropin_paths], after_flags)
    removed = {name: why for name, why in decision.drop.items() if name in present}
    if removed:
        warnings.insert(
            0,
            "feature gates taken out of the kubelet's settings: "
            + "; ".join(f"{name} ({why})" for name, why in removed.items()),
        )
    return Plan(
        version=_version(version),
        files=files,
        before=before,
        after=after,
        removed=removed,
        warnings=warnings,
    )


def _home(sources: Sources, unit: Unit, default_env_file: str) -> tuple[str, str]:
    """The variable and environment file that take a new --feature-gates flag."""
    referenced = [source.var for source in sources.flags]
    if "KUBELET_EXTRA_ARGS" in referenced:
        source = next(s for s in sources.flags if s.var == "KUBELET_EXTRA_ARGS")
        if source.path:
            return source.var, source.path
        if default_env_file in unit.env_files:
            return source.var, default_env_file
        files = [path for path in unit.env_files if path.endswith(("/default/kubelet", "/sysconfig/kubelet"))]
        if files:
            return source.var, files[-1]
    for source in reversed(sources.flags):
        if source.path:
            return source.var, source.path
    raise PlanError(
        "the kubelet unit reads no environment file that could carry --feature-gates (no $KUBELET_EXTRA_ARGS from "
        f"{default_env_file}) and has no --config file; nothing changed"
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
