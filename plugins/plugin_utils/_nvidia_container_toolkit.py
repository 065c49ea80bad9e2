# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of kubegpu.node.nvidia_container_toolkit_plan (the role kubegpu.node.nvidia_container_toolkit), not a
# public API: it can change at any time.
#
# Pure: the action reads the node (one command, with _apt's key fetch; _apt's source check when the source or the
# packages must change) and this module parses what it read and decides: the package plan (all four packages at one
# version, moved together), the files, the refusals, config.toml's edit (only the lines of keys that change, comments
# kept), what CDI and the /dev/char links still need.

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tomllib
from ansible_collections.kubegpu.node.plugins.plugin_utils import _apt

# The four packages of the toolkit, installed, held and moved together (NVIDIA's dependency order: each needs the next).
PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
# Debian architecture names of the machine architectures NVIDIA publishes the toolkit for.
ARCHES = {"x86_64": "amd64", "aarch64": "arm64"}
RUNTIME_CONFIG_FILE = "/etc/nvidia-container-runtime/config.toml"
# The udev rule NVIDIA documents for keeping the /dev/char links when the driver loads.
UDEV_RULE_FILE = "/etc/udev/rules.d/71-nvidia-dev-char.rules"
UDEV_RULE = (
    "# Managed by kubegpu.node.nvidia_container_toolkit: /dev/char links to the NVIDIA device nodes, so that systemd\n"
    "# keeps GPUs attached to running containers across daemon-reload (NVIDIA/nvidia-docker#1730).\n"
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="/usr/bin/nvidia-ctk system create-dev-char-symlinks '
    '--create-all"\n'
)
# Where the toolkit's CDI refresh units (1.18 and later) keep the specification.
REFRESH_SPEC = "/var/run/cdi/nvidia.yaml"
NOTHING_CHANGED = "Nothing was changed."


class Refusal(Exception):
    """A reason not to touch the node; its text says what to do, and that nothing was changed."""


# ---------------------------------------------------------------------------------------------------------------------
# The package plan
# ---------------------------------------------------------------------------------------------------------------------


def package_plan(
    current: dict[str, _apt.Installed],
    version: str,
    state: str = "present",
    allow_downgrade: bool = False,
    packages: Sequence[str] = PACKAGES,
) -> dict[str, Any]:
    """What apt and dpkg must do for `packages` to be installed at `version` and held (or removed, unheld)."""
    if state not in ("present", "absent"):
        raise ValueError(f"state must be present or absent, not {state!r}")
    installed = {name: info.version for name, info in current.items() if name in packages and info.installed}
    held = sorted(name for name, info in current.items() if name in packages and info.held)
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
            name for name, info in current.items() if name in packages and info.state not in ("", "not-installed")
        ),
        "problem": "",
    }
    if state == "absent":
        return plan
    change = [name for name in packages if installed.get(name) != version]
    downgrades = [
        name for name in change if name in installed and _apt.debian_version_compare(installed[name], version) > 0
    ]
    upgrades = [name for name in change if name in installed and name not in downgrades]
    plan.update(
        change=change,
        downgrades=downgrades,
        install=[f"{name}={version}" for name in packages] if change else [],
        to_hold=[name for name in packages if name not in held and name in installed],
        to_unhold=[],
    )
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


# ---------------------------------------------------------------------------------------------------------------------
# config.toml
# ---------------------------------------------------------------------------------------------------------------------

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
    raise ValueError(f"{where} must be a string, number, boolean or list")


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


def runtime_config(current: str | None, settings: dict | None) -> dict[str, Any]:
    """config.toml of nvidia-container-runtime with `settings` (nested tables as dicts) applied.

    Only the lines of keys that change are touched: an active line is replaced, a commented-out default
    (``#key = value``, as NVIDIA ships most settings) is replaced by the active one in place, a key not there is
    added at the end of its table, a missing table at the end of the file. Comments and every other key stay.
    {content, changed: [keys], problem}; content is `current` when nothing changes or there is a problem.
    """
    settings = settings or {}
    if not isinstance(settings, dict):
        raise ValueError("the runtime settings must be a dict (tables as nested dicts)")
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


# ---------------------------------------------------------------------------------------------------------------------
# The inputs, the source, the node read
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    state: str = "present"
    version: str = "1.18.2-1"
    allow_downgrade: bool = False
    channel: str = "stable"
    repo_url: str = "https://nvidia.github.io/libnvidia-container"
    repo_key_url: str = "https://nvidia.github.io/libnvidia-container/gpgkey"
    repo_key_fingerprints: tuple[str, ...] = ("C95B321B61E88C1809C4F759DDCAE044F796ECB0",)
    hold: bool = True
    cdi: bool = False
    cdi_spec: str = "/etc/cdi/nvidia.yaml"
    runtime_config: dict = field(default_factory=dict)
    dev_char_symlinks: bool = True
    keyring: str = "/etc/apt/keyrings/nvidia-container-toolkit.asc"
    source: str = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"
    architecture: str = "x86_64"
    os_family: str = "Debian"
    distribution: str = "Debian"

    @property
    def uris(self) -> list[str]:
        """The repositories of the channel (experimental comes in addition to stable, as NVIDIA's list file has it)."""
        base = self.repo_url.rstrip("/")
        arch = ARCHES.get(self.architecture, "")
        channels = ["stable", *(["experimental"] if self.channel == "experimental" else [])]
        return [f"{base}/{channel}/deb/{arch}" for channel in channels]

    def source_text(self, keyring: str | None = None) -> str:
        """The deb822 source: flat repositories ("Suites: /"), checked with the keyring the role verified."""
        return _apt.deb822(
            f"Managed by kubegpu.node.nvidia_container_toolkit: NVIDIA Container Toolkit, {self.channel} channel.",
            self.uris,
            ["/"],
            [],
            keyring or self.keyring,
        )


def check_platform(inputs: Inputs) -> None:
    """The node's system and architecture (from its facts) are ones NVIDIA publishes the toolkit's apt packages for."""
    if inputs.os_family == "RedHat":
        raise Refusal(
            f"kubegpu.node.nvidia_container_toolkit does not support {inputs.distribution} (RHEL family) yet: NVIDIA's "
            "rpm repository (gpgcheck, dnf versionlock) is not implemented because it cannot be tested here. Install "
            "the toolkit with dnf from https://nvidia.github.io/libnvidia-container/stable/rpm/ and lock its four "
            f"packages, then run kubegpu.node.container_runtime. {NOTHING_CHANGED}"
        )
    if inputs.os_family != "Debian" or inputs.architecture not in ARCHES:
        raise Refusal(
            f"kubegpu.node.nvidia_container_toolkit supports the Debian family (Debian, Ubuntu) on "
            f"{' and '.join(ARCHES)}; it runs {inputs.distribution} on {inputs.architecture}. {NOTHING_CHANGED}"
        )


def check_inputs(inputs: Inputs) -> None:
    if inputs.state != "present":
        return
    if not re.fullmatch(r"[0-9][A-Za-z0-9.+~:-]*", inputs.version) or inputs.channel not in ("stable", "experimental"):
        raise Refusal(
            "nvidia_container_toolkit_version must be one exact package version as apt shows it (for example "
            f'1.18.2-1), not "{inputs.version}"; nvidia_container_toolkit_channel is stable or experimental. '
            f"{NOTHING_CHANGED}"
        )
    if not inputs.repo_key_fingerprints:
        raise Refusal(
            f"the repository's key is fetched from {inputs.repo_key_url} and trusted only by its fingerprint: set "
            f"nvidia_container_toolkit_repo_key_fingerprints. {NOTHING_CHANGED}"
        )


def check_key(inputs: Inputs, key: str | None, key_error: str) -> None:
    if key_error or not key:
        raise Refusal(
            f"could not fetch the repository's signing key from {inputs.repo_key_url} ({key_error or 'no answer'}). "
            "Check nvidia_container_toolkit_repo_key_url (a mirror publishes it at <url>/gpgkey) and the node's access "
            f"to it. {NOTHING_CHANGED}"
        )
    try:
        found, untrusted = _apt.untrusted_fingerprints(key, inputs.repo_key_fingerprints)
    except _apt.OpenPGPError as exc:
        raise Refusal(
            f"the key at {inputs.repo_key_url} is not an OpenPGP public key ({exc}). {NOTHING_CHANGED}"
        ) from None
    if untrusted:
        raise Refusal(
            f"the key at {inputs.repo_key_url} has the fingerprint(s) {', '.join(found)}, and only "
            f"{', '.join(inputs.repo_key_fingerprints)} {'is' if len(inputs.repo_key_fingerprints) == 1 else 'are'} "
            "trusted (nvidia_container_toolkit_repo_key_fingerprints). "
            "The key was not written and nothing was changed. If the repository's owner really changed its key, check "
            "the new fingerprint through another channel and set it."
        )


def check_offer(inputs: Inputs, found: _apt.SourceCheck) -> None:
    if found.update_error:
        raise Refusal(
            f"apt refuses the NVIDIA Container Toolkit repository {' '.join(inputs.uris)} with the key "
            f"{inputs.repo_key_url}: {found.update_error}. Nothing was installed or changed. A signature that does "
            "not verify means the repository is not signed with the trusted key: check the mirror "
            "(nvidia_container_toolkit_repo_url) and its key, never trust it blindly."
        )
    missing = [name for name in PACKAGES if inputs.version not in found.offered.get(name, [])]
    if missing:
        offers = "; ".join(f"{name}: {', '.join(found.offered.get(name, [])) or 'no version'}" for name in missing)
        raise Refusal(
            f"the repository {' '.join(inputs.uris)} has no version {inputs.version} of {', '.join(missing)}. It "
            f"offers {offers}. Set nvidia_container_toolkit_version to one of them (all four packages move together). "
            f"{NOTHING_CHANGED}"
        )


# Environment: FULL=1 for the role's source and keyring (read once per run); FILES; CDI=1 to list CDI's devices.
READ_SCRIPT = r"""echo "@@dpkg"
dpkg-query -W -f='${Package}|${Version}|${Status}\n' nvidia-container-toolkit nvidia-container-toolkit-base \
  libnvidia-container-tools libnvidia-container1 2>/dev/null
for f in ${FILES:-}; do
  if [ -f "$f" ]; then echo "@@file $(stat -c %a "$f") $f"; base64 "$f"; else echo "@@nofile $f"; fi
done
for dir in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
  if [ -e "$dir/nvidia-cdi-refresh.path" ]; then
    echo "@@cdi-units"
    systemctl is-enabled nvidia-cdi-refresh.path 2>/dev/null || true
    systemctl is-active nvidia-cdi-refresh.path 2>/dev/null || true
    systemctl is-enabled nvidia-cdi-refresh.service 2>/dev/null || true
    break
  fi
done
[ -e "$REFRESH_SPEC" ] && echo "@@cdi-spec"
[ -e "$CDI_SPEC" ] && [ "$CDI_SPEC" != "$REFRESH_SPEC" ] && echo "@@cdi-own-spec"
if [ "${CDI:-0}" = 1 ] && command -v nvidia-ctk >/dev/null 2>&1; then
  out=$(nvidia-ctk cdi list 2>&1); echo "@@cdi-list $?"; printf '%s\n' "$out"
fi
"""
# The NVIDIA device nodes without their /dev/char/MAJOR:MINOR link: the GPUs and control devices, and the MIG
# capability devices under /dev/nvidia-caps (config, monitor, each GPU and compute instance), which `nvidia-ctk system
# create-dev-char-symlinks --create-all` links too (NVIDIA/nvidia-container-toolkit,
# cmd/nvidia-ctk/system/create-dev-char-symlinks/all.go: the MIG minors of /proc/driver/nvidia-caps/mig-minors) and
# which kubegpu.node.service_config's reload guard counts as well.
LINKS_SCRIPT = r"""echo "@@unlinked"
for dev in /dev/nvidia* /dev/nvidia-caps/*; do
  [ -c "$dev" ] || continue
  link=$(printf '/dev/char/%d:%d' "0x$(stat -c %t "$dev")" "0x$(stat -c %T "$dev")")
  [ -e "$link" ] || echo "$dev"
done
"""


def links_argv() -> list[str]:
    return ["sh", "-c", LINKS_SCRIPT + "exit 0\n", "toolkit-links"]


def read_argv(inputs: Inputs, full: bool, key_url: str = "", own_files: bool = True) -> list[str]:
    """The node read; with key_url, the key is fetched in the same command (_apt's source check without a probe).
    full: the source and keyring too; own_files: config.toml and the udev rule (a node-only read later in the run
    takes them from the full read, unless apt changed the packages since)."""
    files = [
        *([RUNTIME_CONFIG_FILE, UDEV_RULE_FILE] if own_files else []),
        *([inputs.keyring, inputs.source] if full else []),
    ]
    script = READ_SCRIPT + LINKS_SCRIPT + (_apt.SOURCE_CHECK_SCRIPT if key_url else "exit 0\n")
    env = [
        f"FILES={' '.join(files)}",
        f"CDI={1 if inputs.cdi else 0}",
        f"REFRESH_SPEC={REFRESH_SPEC}",
        f"CDI_SPEC={inputs.cdi_spec}",
        f"KEY_URL={key_url}",
        "PROBE=0",
    ]
    return ["env", *env, "sh", "-c", script, "toolkit-read"]


@dataclass
class NodeRead:
    dpkg: dict[str, _apt.Installed] = field(default_factory=dict)
    files: dict[str, str | None] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)
    cdi_units: bool = False
    cdi_path_enabled: bool = False
    cdi_path_active: bool = False
    cdi_service_enabled: bool = False
    cdi_spec: bool = False
    cdi_own_spec: bool = False
    cdi_list_rc: int | None = None
    cdi_list: list[str] = field(default_factory=list)
    unlinked: list[str] = field(default_factory=list)
    source: _apt.SourceCheck = field(default_factory=_apt.SourceCheck)


def parse_read(stdout: str) -> NodeRead:
    node = NodeRead()
    node.source = _apt.parse_source_check(stdout)
    for header, lines in _apt.sections(stdout):
        name, _sep, rest = header.partition(" ")
        if name == "dpkg":
            node.dpkg = _apt.parse_dpkg_query("\n".join(lines))
        elif name == "file":
            mode, _sep, path = rest.partition(" ")
            data = "".join(line.strip() for line in lines)
            node.files[path] = base64.b64decode(data).decode("utf-8", "replace") if data else ""
            node.modes[path] = mode.zfill(4)
        elif name == "nofile":
            node.files[rest] = None
        elif name == "cdi-units":
            states = [line.strip() for line in lines] + ["", "", ""]
            node.cdi_units = True
            node.cdi_path_enabled = states[0] == "enabled"
            node.cdi_path_active = states[1] == "active"
            node.cdi_service_enabled = states[2] in ("enabled", "static", "indirect")
        elif name == "cdi-spec":
            node.cdi_spec = True
        elif name == "cdi-own-spec":
            node.cdi_own_spec = True
        elif name == "cdi-list":
            node.cdi_list_rc = int(rest) if rest.strip().lstrip("-").isdigit() else None
            node.cdi_list = [line for line in lines if line.strip()]
        elif name == "unlinked":
            node.unlinked = [line.strip() for line in lines if line.strip()]
    return node


# ---------------------------------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------------------------------


def plan(inputs: Inputs, node: NodeRead, key: str | None, files: dict[str, str | None], probed: bool) -> dict[str, Any]:
    """What the role does on this node: the packages, the key and source files, the lists update, config.toml, the
    /dev/char links, CDI. `files` holds the keyring and the source as a full read found them."""
    packages = package_plan(node.dpkg, inputs.version, inputs.state, inputs.allow_downgrade)
    if inputs.state == "absent":
        return {"packages": packages, "remove_files": [inputs.source, inputs.keyring, UDEV_RULE_FILE, inputs.cdi_spec]}
    source = inputs.source_text()
    want_files = [(inputs.keyring, key or ""), (inputs.source, source)]
    file_plan = [
        {"path": path, "content": content, "mode": "0644", "changed": files.get(path) != content}
        for path, content in want_files
    ]
    repo_changes = any(f["changed"] for f in file_plan)
    update_needed = repo_changes or bool(packages["change"])
    merged = {"content": None, "changed": [], "problem": ""}
    if inputs.runtime_config:
        merged = runtime_config(node.files.get(RUNTIME_CONFIG_FILE), inputs.runtime_config)
    config_file = node.files.get(RUNTIME_CONFIG_FILE)
    write_config = (
        bool(
            inputs.runtime_config
            and merged["content"] is not None
            and not merged["problem"]
            and (merged["changed"] or node.modes.get(RUNTIME_CONFIG_FILE) != "0644")
        )
        and config_file is not None
    )
    write_udev = inputs.dev_char_symlinks and (
        node.files.get(UDEV_RULE_FILE) != UDEV_RULE or node.modes.get(UDEV_RULE_FILE) != "0644"
    )
    spec_ok = bool(node.cdi_list) and any(line.startswith("nvidia.com/gpu=") for line in node.cdi_list)
    to_hold = packages["to_hold"] if inputs.hold else []
    to_unhold = packages["held"] if not inputs.hold else []
    unlinked = node.unlinked if inputs.dev_char_symlinks else []
    # Which task files have anything to do (tasks/main.yml includes only those: on a node in place a skipped task
    # costs the controller about what a run one does): `packages`, any task of tasks/packages.yml; `configure`, of
    # tasks/configure.yml (config.toml, the udev rule, the /dev/char links).
    steps = {
        "packages": bool(repo_changes or update_needed or packages["install"] or to_hold or to_unhold),
        "configure": bool(write_config or write_udev or unlinked),
    }
    return {
        "packages": packages,
        "hold_after_apt": list(PACKAGES) if inputs.hold else [],
        "to_hold": to_hold,
        "to_unhold": to_unhold,
        "files": file_plan,
        "repo_changes": repo_changes,
        "update_needed": update_needed,
        "probe_needed": update_needed and not probed,
        "update_lists_argv": _apt.update_lists_argv(inputs.source),
        "runtime_config": {**merged, "write": write_config, "file": RUNTIME_CONFIG_FILE},
        "udev_rule": {"write": write_udev, "file": UDEV_RULE_FILE, "content": UDEV_RULE},
        "cdi": {
            "units": node.cdi_units,
            "change_units": node.cdi_units
            and not (node.cdi_path_enabled and node.cdi_path_active and node.cdi_service_enabled),
            "generated": node.cdi_spec,
            # Two specifications of the same devices make CDI device names ambiguous: with the refresh units, the
            # one the role wrote before they existed goes.
            "remove_own_spec": node.cdi_units and node.cdi_own_spec,
            "list": node.cdi_list,
            "list_rc": node.cdi_list_rc,
            "ok": spec_ok,
        },
        "unlinked": unlinked,
        "steps": steps,
    }
