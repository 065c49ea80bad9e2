# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private helper of the kubegpu.node.service_config action, not a public API: it can change at any time.
# Pure functions only (the decisions and the messages), so the unit tests need no host.

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

# Lines a daemon writes when it refuses to start, in the formats of dockerd/containerd (logrus; dockerd's own
# "unable to configure the Docker daemon with file ...: EOF"), CRI-O, the kubelet (klog: "E1122 ..." / "F1122 ...")
# and plain programs.
DEFAULT_ERROR_PATTERN = (
    r"(?i)(level=(fatal|error)|\b(fatal|error|failed|unable|unrecognized|invalid|refus\w*)\b|^[EF]\d{4} )"
)
NEW_FILE_MODE = "0644"
NEW_FILE_OWNER = "root"
NEW_FILE_GROUP = "root"


class PlanError(ValueError):
    """A file that cannot be managed safely; the text names it and says what to do."""


@dataclass
class FileState:
    """What the node has at one managed path, as read before any change."""

    path: str  # the path the caller named
    real_path: str  # where the bytes live: the path itself, or the final target of a symbolic link
    is_link: bool = False
    exists: bool = False  # whether real_path exists
    checksum: str | None = None  # sha1 of real_path's bytes
    mode: str | None = None  # four octal digits
    owner: str | None = None
    group: str | None = None


@dataclass
class FileChange:
    """One file of the request, and what applying it means."""

    spec: dict[str, Any]
    state: FileState
    content_differs: bool = False
    attributes_differ: list[str] = field(default_factory=list)

    @property
    def wanted(self) -> bool:
        return self.spec.get("content") is not None

    @property
    def changed(self) -> bool:
        return self.content_differs or bool(self.attributes_differ)


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def normal_mode(mode: Any, path: str) -> str | None:
    """A mode given as "0644", "644" or 420 as four octal digits; symbolic modes are refused (they are ambiguous)."""
    if mode is None:
        return None
    if isinstance(mode, int) and not isinstance(mode, bool):
        if 0 <= mode <= 0o7777:
            return f"{mode:04o}"
    elif isinstance(mode, str) and re.fullmatch(r"0?[0-7]{3,4}", mode):
        return f"{int(mode, 8):04o}"
    raise PlanError(f"mode of {path} must be octal digits such as '0644', not {mode!r}")


def file_state(path: str, link_stat: dict[str, Any], target_stat: dict[str, Any] | None) -> FileState:
    """Combine the stat of `path` (not followed) and, for a link, the stat of its final target.

    A link whose target does not exist (dangling) is managed through the link too: the target is what gets written.
    """
    if link_stat.get("exists") and link_stat.get("islnk"):
        real = link_stat.get("lnk_source") or path
        target = target_stat or {}
        state = FileState(path=path, real_path=real, is_link=True, exists=bool(target.get("exists")))
        stat = target
    else:
        state = FileState(path=path, real_path=path, exists=bool(link_stat.get("exists")))
        stat = link_stat
    if state.exists:
        if not stat.get("isreg"):
            kind = "a directory" if stat.get("isdir") else "not a regular file"
            where = f"{path} (a link to {state.real_path})" if state.is_link else path
            raise PlanError(f"{where} is {kind}; it was left untouched")
        state.checksum = stat.get("checksum")
        state.mode = stat.get("mode")
        state.owner = stat.get("pw_name")
        state.group = stat.get("gr_name")
    return state


def plan_change(spec: dict[str, Any], state: FileState) -> FileChange:
    """What differs between a file as it is and as the request wants it."""
    change = FileChange(spec=spec, state=state)
    content = spec.get("content")
    if content is None:
        change.content_differs = state.exists
        return change
    if not state.exists:
        change.content_differs = True
        return change
    change.content_differs = sha1(content) != state.checksum
    wanted = {
        "mode": normal_mode(spec.get("mode"), spec["path"]),
        "owner": spec.get("owner"),
        "group": spec.get("group"),
    }
    current = {"mode": state.mode, "owner": state.owner, "group": state.group}
    change.attributes_differ = [key for key, value in wanted.items() if value is not None and value != current[key]]
    return change


def write_attributes(change: FileChange) -> dict[str, str]:
    """owner/group/mode for the write: those asked for; for a new file, root's and 0644 where not asked for.

    An existing file keeps its own where nothing is asked for (the copy module's atomic move keeps them).
    """
    spec = change.spec
    attributes = {
        "mode": normal_mode(spec.get("mode"), spec["path"]),
        "owner": spec.get("owner"),
        "group": spec.get("group"),
    }
    if not change.state.exists:
        defaults = {"mode": NEW_FILE_MODE, "owner": NEW_FILE_OWNER, "group": NEW_FILE_GROUP}
        attributes = {key: value or defaults[key] for key, value in attributes.items()}
    return {key: value for key, value in attributes.items() if value is not None}


def restore_attributes(state: FileState) -> dict[str, str]:
    """owner/group/mode that put a file back exactly as it was."""
    return {"mode": state.mode or NEW_FILE_MODE, "owner": state.owner or "root", "group": state.group or "root"}


def backup_name(real_path: str, stamp: str) -> str:
    """A flat, unique-enough name for the copy of `real_path` in the backup folder."""
    flat = real_path.strip("/").replace("/", "_") or "root"
    return f"{flat}.{stamp}"


def daemon_error(journal: str, pattern: str = DEFAULT_ERROR_PATTERN) -> str | None:
    """The last line in the unit's own journal lines that reads like an error, whitespace folded; None if none."""
    matcher = re.compile(pattern)
    found = None
    for line in journal.splitlines():
        if matcher.search(line):
            found = line
    return " ".join(found.split()) if found else None


def restart_failure_message(
    service: str,
    result: str | None,
    error: str | None,
    step_message: str,
    rolled_back: bool,
    restored_running: bool,
) -> str:
    """Why the service did not come back, telling systemd's start limit apart from the daemon refusing its files."""
    if error:
        cause = f"{service} did not come back with the new configuration: {error}"
    elif result == "start-limit-hit":
        cause = (
            f"systemd refused to start {service}: its start limit was hit (too many starts in a short time, "
            "StartLimitBurst/StartLimitIntervalSec), and the service logged no error of its own, so this is not "
            "necessarily the new configuration"
        )
    else:
        cause = f"{service} did not come back with the new configuration ({step_message or 'no reason given'})"
        if result and result != "success":
            cause += f"; systemd says: {result}"
    if result == "start-limit-hit" and error:
        cause += " (systemd's start limit was also hit while it kept restarting)"
    if not rolled_back:
        return cause + ". Not every previous file could be put back (see below)."
    if restored_running:
        return cause + ". The previous files were put back and the service is running with them again."
    return (
        cause + f". The previous files were put back, but {service} does not start with them either: it is down; "
        f"see `journalctl -u {service}`."
    )


# ---------------------------------------------------------------------------------------------------------------------
# Restoring, and the note of a change the service may not run with yet
# ---------------------------------------------------------------------------------------------------------------------

# The steps of a change, in their order (kubegpu.node.service_config's documentation names them for its test hook).
# Every prefix leaves the node in a state the next run completes or undoes: the note (with the way back) is written
# before the first file and removed only once the service answers with the files, or runs with the previous ones again.
STEP_BACKED_UP = "backed-up"  # the previous files are copied; nothing else changed yet
STEP_NOTED = "noted"  # the note is written; no file changed yet
STEP_WROTE = "wrote-{}"  # the n-th changed file (1, 2, ...) is written or removed
STEP_DAEMON_RELOADED = "daemon-reloaded"  # systemctl daemon-reload ran; the service was not restarted yet
STEP_RESTARTED = "restarted"  # the restart (or reload) returned; not verified yet
STEP_VERIFIED = "verified"  # the service answers; the note is still there
STEP_RESTORED = "restored-{}"  # after a failure: the n-th file (counted from the last) is put back
STEP_ROLLED_BACK = "rolled-back"  # after a failure: the service was restarted with the previous files


def restore_entry(change: FileChange, backup: str | None, created_dirs: list[str]) -> dict[str, Any]:
    """How to put one file back as it was before the change, and what it was (to tell whether it is back already).

    JSON, so that the note keeps it on the node."""
    state = change.state
    return {
        "path": state.path,
        "real_path": state.real_path,
        "backup": backup,
        "attributes": restore_attributes(state) if state.exists else None,
        "created_dirs": created_dirs,
        "existed": state.exists,
        "checksum": state.checksum if state.exists else None,
    }


def merge_restore_entries(earlier: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The entries that restore what the service runs with: for a file changed again while a restart is held back,
    the state before the first change wins (the service never read the later ones)."""
    known = {entry["real_path"] for entry in earlier}
    return [*earlier, *(entry for entry in now if entry["real_path"] not in known)]


def pending_is_current(marker: dict[str, Any] | None, boot_id: str, service_started_us: int | None) -> bool:
    """Whether the service has not (re)started since the note was written, so it still runs the files before it.

    `service_started_us` is the unit's ExecMainStartTimestampMonotonic (microseconds since boot; 0 or None when the
    service does not run). A reboot (another boot_id) or a restart since the note was written made it active.
    """
    if not isinstance(marker, dict) or marker.get("boot_id") != boot_id:
        return False
    written = marker.get("written_us")
    if not isinstance(written, int):
        return False
    return not service_started_us or service_started_us <= written


@dataclass(frozen=True)
class Planned:
    """What one file will be once this run's writes are done (or is, when this run does not touch it)."""

    exists: bool
    checksum: str | None = None
    mode: str | None = None
    owner: str | None = None
    group: str | None = None


def planned_state(change: FileChange) -> Planned:
    """The file as this run leaves it (as it is, when nothing differs)."""
    state = change.state
    if not change.changed:
        return current_as_planned(state)
    if not change.wanted:
        return Planned(exists=False)
    attributes = {"mode": state.mode, "owner": state.owner, "group": state.group} if state.exists else {}
    attributes.update(write_attributes(change))
    return Planned(exists=True, checksum=sha1(change.spec["content"]), **attributes)


def current_as_planned(state: FileState) -> Planned:
    if not state.exists:
        return Planned(exists=False)
    return Planned(exists=True, checksum=state.checksum, mode=state.mode, owner=state.owner, group=state.group)


def back_as_before(entries: list[dict[str, Any]], after: dict[str, Planned]) -> bool:
    """Whether every file of a note will be as it was before the noted change (`after`: by real path), so that a
    service that has not restarted since the note runs with exactly those files and needs no restart.

    An entry of an older note, which did not keep what the file was, never counts as back."""
    for entry in entries:
        planned = after.get(entry["real_path"])
        if planned is None or "existed" not in entry:
            return False
        if planned.exists != bool(entry["existed"]):
            return False
        if planned.exists:
            attributes = entry.get("attributes") or {}
            if planned.checksum != entry.get("checksum") or any(
                getattr(planned, key) != attributes.get(key) for key in ("mode", "owner", "group")
            ):
                return False
    return True


def parse_marker(text: str | None) -> dict[str, Any] | None:
    """A note of a change; None when there is none or it cannot be read (then it counts as none)."""
    if not text:
        return None
    try:
        marker = json.loads(text)
    except ValueError:
        return None
    if not isinstance(marker, dict) or not isinstance(marker.get("restore"), list):
        return None
    if not all(_is_restore_entry(entry) for entry in marker["restore"]):
        return None
    return marker


def _is_restore_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("path"), str)
        and isinstance(entry.get("real_path"), str)
        and (entry.get("backup") is None or isinstance(entry.get("backup"), str))
        and (entry.get("attributes") is None or isinstance(entry.get("attributes"), dict))
        and isinstance(entry.get("created_dirs"), list)
        and all(isinstance(folder, str) for folder in entry["created_dirs"])
        and (entry.get("backup") is None or isinstance(entry.get("attributes"), dict))
    )


def uptime_us(proc_uptime: str) -> int:
    """Microseconds since boot from /proc/uptime ("12345.67 8910.11")."""
    return int(float(proc_uptime.split()[0]) * 1_000_000)


# ---------------------------------------------------------------------------------------------------------------------
# The journal lines of the processes a restart started (not those of the process it replaced)
# ---------------------------------------------------------------------------------------------------------------------

# Read on the node right before a restart or reload, in one command: systemd's start limit and failed state are
# cleared (a unit that failed or restarted often must not be refused by its start limit and mistaken for refusing its
# configuration), then the journal's position (`-- cursor: ...`) and the unit's invocation ID are printed.
BEFORE_RESTART_SCRIPT = """
systemctl reset-failed "$1" 2>/dev/null
journalctl --lines=0 --show-cursor --no-pager 2>/dev/null | sed -n 's/^-- cursor: //p'
echo
systemctl show "$1" --property=InvocationID --value
"""

# The fields read from the unit's journal after a failed restart (journalctl --output=json --output-fields=...).
JOURNAL_FIELDS = "MESSAGE,_PID,_SYSTEMD_UNIT,_SYSTEMD_INVOCATION_ID,INVOCATION_ID"


@dataclass(frozen=True)
class RestartMark:
    """Where a restart started: the journal's position and the unit's invocation ID then (either may be empty)."""

    cursor: str = ""
    invocation: str = ""


def parse_restart_mark(text: str) -> RestartMark:
    """BEFORE_RESTART_SCRIPT's output: the cursor line (may be missing), an empty line, the invocation ID."""
    head, _sep, tail = text.partition("\n\n")
    if not _sep:  # no cursor line at all (an empty journal): the output starts with the empty line
        head, tail = "", text.lstrip("\n")
    return RestartMark(cursor=head.strip(), invocation=tail.strip())


def journal_entries(text: str) -> list[dict[str, Any]]:
    """The entries of `journalctl --output=json` (one JSON object a line); lines that are not JSON are skipped."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def _message(entry: dict[str, Any]) -> str:
    """An entry's MESSAGE: journalctl writes text that is not valid UTF-8 as a list of byte values."""
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        return bytes(b for b in message if isinstance(b, int) and 0 <= b < 256).decode("utf-8", errors="replace")
    return message if isinstance(message, str) else ""


def started_invocations(entries: list[dict[str, Any]], before: str, after: str) -> set[str]:
    """The invocations of the unit started by a restart: `after` (the unit's invocation ID right after the restart
    returned) and those systemd started after it (automatic restarts, Restart=), never `before`.

    The order of invocations comes from systemd's own entries about the unit (PID 1, field INVOCATION_ID): the journal
    orders the entries of different processes only roughly, systemd's own in the order it logged them. No invocation
    when `after` is empty or equals `before`: the restart started no process (systemd's start limit refused it)."""
    if not after or after == before:
        return set()
    order: list[str] = []
    for entry in entries:
        invocation = entry.get("INVOCATION_ID")
        if str(entry.get("_PID")) == "1" and isinstance(invocation, str) and invocation not in order:
            order.append(invocation)
    started = set(order[order.index(after) :]) if after in order else {after}
    started.discard(before)
    return started


def lines_of(
    entries: list[dict[str, Any]], unit: str, invocations: set[str] | None, main_pid: str | None = None
) -> list[str]:
    """What the unit's own processes logged (not systemd about it), of the given invocations (None: of any).

    An entry the journal could not attribute to an invocation (a process that exited before journald looked it up)
    counts when another entry of the same process is attributed, or when it is `main_pid`'s (the main process systemd
    started last, `systemctl show --property=ExecMainPID`, which is one of the invocations asked for): a process that
    writes one line and exits leaves no attributed entry beside it."""
    own = [entry for entry in entries if entry.get("_SYSTEMD_UNIT") == unit and str(entry.get("_PID")) != "1"]
    invocation_of_pid = {
        str(entry.get("_PID")): entry["_SYSTEMD_INVOCATION_ID"]
        for entry in own
        if isinstance(entry.get("_SYSTEMD_INVOCATION_ID"), str) and entry.get("_PID") is not None
    }
    lines = []
    for entry in own:
        pid = str(entry.get("_PID"))
        invocation = entry.get("_SYSTEMD_INVOCATION_ID") or invocation_of_pid.get(pid)
        if invocations is None or invocation in invocations or (invocation is None and main_pid and pid == main_pid):
            lines.append(_message(entry))
    return lines


def new_process_error(
    journal_json: str,
    unit: str,
    mark: RestartMark,
    after: str,
    reloaded: bool,
    pattern: str = DEFAULT_ERROR_PATTERN,
    main_pid: str | None = None,
) -> str | None:
    """The last line reading like an error that the unit logged after its restart (or reload), from the output of
    `journalctl --unit=UNIT --after-cursor=MARK --output=json`.

    After a restart, only lines of the processes that restart started count: a crash loop of the previous process,
    or the previous process's words while it stopped, are not the new configuration's error. After a reload the
    process stays the same: its lines after the mark count. `main_pid`: see lines_of."""
    entries = journal_entries(journal_json)
    if reloaded:
        invocations = {after} if after else None
    else:
        invocations = started_invocations(entries, mark.invocation, after)
        if not invocations:
            return None
    return daemon_error("\n".join(lines_of(entries, unit, invocations, main_pid)), pattern)


# ---------------------------------------------------------------------------------------------------------------------
# systemctl daemon-reload and running GPU containers (NVIDIA/nvidia-docker#1730)
# ---------------------------------------------------------------------------------------------------------------------

# With the systemd cgroup driver, a container's device rules are a systemd unit's DeviceAllow= entries. On
# `systemctl daemon-reload` systemd writes them again, resolving each device through /dev/char/MAJOR:MINOR; a device
# without that link is left out, and the containers lose it ("Failed to initialize NVML: Unknown Error").
# One round trip reads, with GNU stat and find: every NVIDIA character device with its number and whether
# /dev/char/MAJOR:MINOR leads to that same device, then every open file descriptor of a /dev/nvidia* device, with the
# process's executable and name. Lines, tab-separated:
#   device <path> <major>:<minor> <1 when linked, else 0>
#   open <pid> <device path> <executable> <process name>
GPU_PROBE_SCRIPT = r"""
export LC_ALL=C
for dev in /dev/nvidia* /dev/nvidia-caps/*; do
  [ -c "$dev" ] || continue
  set -- $(stat -c '%t %T' "$dev")
  number="$((0x$1)):$((0x$2))"
  linked=0
  if [ -c "/dev/char/$number" ] && [ "$(stat -L -c '%t %T' "/dev/char/$number" 2>/dev/null)" = "$1 $2" ]; then
    linked=1
  fi
  printf 'device\t%s\t%s\t%s\n' "$dev" "$number" "$linked"
done
find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 -lname '/dev/nvidia*' -printf '%h\t%l\n' 2>/dev/null |
  while IFS='	' read -r fds target; do
    pid=${fds#/proc/}
    pid=${pid%/fd}
    printf 'open\t%s\t%s\t%s\t%s\n' "$pid" "$target" "$(readlink "/proc/$pid/exe" 2>/dev/null)" \
      "$(cat "/proc/$pid/comm" 2>/dev/null)"
  done
exit 0
"""

# NVIDIA's own host daemons hold the devices open from a plain system service, which has no device rules for a
# reload to rewrite: they are not GPU workloads.
HOST_GPU_DAEMONS = frozenset({"nvidia-persistenced", "nv-fabricmanager"})


@dataclass(frozen=True)
class GpuDevice:
    path: str  # /dev/nvidia0
    number: str  # 195:0
    linked: bool  # /dev/char/195:0 leads to this device


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    command: str  # the process's name (/proc/PID/comm), else its executable
    devices: tuple[str, ...]  # the NVIDIA devices it holds open


@dataclass(frozen=True)
class GpuProbe:
    devices: tuple[GpuDevice, ...] = ()
    processes: tuple[GpuProcess, ...] = ()

    @property
    def unlinked(self) -> list[str]:
        return [device.path for device in self.devices if not device.linked]


@dataclass(frozen=True)
class ReloadDecision:
    """Whether `systemctl daemon-reload` may run now; when not, what it would hurt."""

    allowed: bool
    unlinked: tuple[str, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    drained: bool = False  # the caller said the node is drained (then the node was not read)

    def as_result(self) -> dict[str, Any]:
        return {
            "held_back": not self.allowed,
            "drained": self.drained,
            "unlinked": list(self.unlinked),
            "processes": [{"pid": p.pid, "command": p.command, "devices": list(p.devices)} for p in self.processes],
        }


def parse_gpu_probe(text: str) -> GpuProbe:
    """The NVIDIA devices and the processes holding them, from GPU_PROBE_SCRIPT's output (other lines are ignored)."""
    devices: list[GpuDevice] = []
    held: dict[int, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if fields[0] == "device" and len(fields) == 4:
            devices.append(GpuDevice(path=fields[1], number=fields[2], linked=fields[3].strip() == "1"))
        elif fields[0] == "open" and len(fields) >= 4 and fields[1].isdigit():
            executable = fields[3].removesuffix(" (deleted)")
            name = executable.rsplit("/", 1)[-1]
            if name in HOST_GPU_DAEMONS:
                continue
            command = (fields[4].strip() if len(fields) > 4 else "") or name or "?"
            pid = int(fields[1])
            paths = held.setdefault(pid, (command, []))[1]
            if fields[2] not in paths:
                paths.append(fields[2])
    processes = tuple(
        GpuProcess(pid=pid, command=command, devices=tuple(paths)) for pid, (command, paths) in held.items()
    )
    return GpuProbe(devices=tuple(devices), processes=tuple(sorted(processes, key=lambda p: p.pid)))


def daemon_reload_decision(probe: GpuProbe | None, drained: bool) -> ReloadDecision:
    """A reload is held back only when all three hold: an NVIDIA device lacks its /dev/char link, a process holds an
    NVIDIA device open, and the caller has not said that the node is drained. `probe` may be None when drained (the
    node is not read then)."""
    if drained or probe is None:
        return ReloadDecision(allowed=True, drained=drained)
    unlinked = tuple(probe.unlinked)
    if unlinked and probe.processes:
        return ReloadDecision(allowed=False, unlinked=unlinked, processes=probe.processes)
    return ReloadDecision(allowed=True, unlinked=unlinked, processes=probe.processes)


def daemon_reload_warning(service: str, decision: ReloadDecision, limit: int = 5) -> str:
    """What the user reads when the reload (and so the restart) of `service` is held back."""
    shown = [f"{p.command} (pid {p.pid})" for p in decision.processes[:limit]]
    if len(decision.processes) > limit:
        shown.append(f"{len(decision.processes) - limit} more")
    unlinked = ", ".join(decision.unlinked[:limit]) + (" and more" if len(decision.unlinked) > limit else "")
    return (
        f"{service} was not restarted: it needs `systemctl daemon-reload`, and with the systemd cgroup driver a "
        f"reload takes the GPUs away from running containers while NVIDIA devices have no /dev/char link "
        f"(NVIDIA/nvidia-docker#1730). Processes holding GPUs: {', '.join(shown)}; devices without a link: "
        f"{unlinked}. The new files are written but not active. Create the links with the role "
        f"kubegpu.node.nvidia_container_toolkit (nvidia_container_toolkit_dev_char_symlinks, or `nvidia-ctk system "
        f"create-dev-char-symlinks --create-all`) and run again, or run it inside a drain window with drained: true."
    )
