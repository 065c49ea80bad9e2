# Copyright (c) kubegpu.node contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
#
# Private helper of the container_runtime role (through the private filter kubegpu.node._restart_safety), not a
# public API: it can change at any time. Whether restarting a container runtime would stop running workloads, from
# what the role's probe prints on the node: `systemctl show UNIT --property=ActiveState --property=KillMode
# --property=MainPID`, `UnitProcesses=N` (the processes in the unit), and for Docker `LiveRestoreEnabled=` and
# `ContainersRunning=` from `docker info`. Pure: the role asks the node, this decides.
# - A runtime that is not running is safe to (re)start.
# - Docker: safe with live-restore or no running container (dockerd stops its containers when it stops).
# - containerd and CRI-O: safe when systemd kills only the daemon on a restart (KillMode=process or none, as Debian's
#   and Ubuntu's containerd units have), or when nothing else runs in the unit; otherwise the container shims (and
#   their containers) would be killed.

from __future__ import annotations

from typing import Any

from ansible_collections.kubegpu.node.plugins.plugin_utils import _systemd_syntax as sd

ENGINES = ("docker", "containerd", "cri-o")
# systemd kills only the main process on a restart with these KillMode values; the container shims (containerd-shim,
# conmon) that keep containers running are left alone.
SPARING_KILL_MODES = ("process", "none")


def _count(facts: dict[str, str], key: str) -> int | None:
    value = facts.get(key, "")
    return int(value) if value.isdigit() else None


def restart_safety(probe: str, engine: str) -> dict[str, Any]:
    """{'safe': bool, 'reason': str}: the reason says what would stop, for the warning when it is not safe."""
    if engine not in ENGINES:
        raise ValueError(f"restart_safety: engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if not isinstance(probe, str):
        raise ValueError(f"restart_safety expects the probe's text, not {type(probe).__name__}")
    facts = sd.show_properties(probe)  # systemctl show's lines and the probe's own
    if facts.get("ActiveState") not in ("active", "reloading", "activating"):
        return {"safe": True, "reason": ""}
    if engine == "docker":
        running = _count(facts, "ContainersRunning")
        if facts.get("LiveRestoreEnabled") == "true":
            return {"safe": True, "reason": ""}
        if running == 0:
            return {"safe": True, "reason": ""}
        what = f"{running} running containers" if running is not None else "its containers (docker info did not answer)"
        return {
            "safe": False,
            "reason": f"dockerd runs without live-restore, so a restart would stop {what}",
        }
    kill_mode = facts.get("KillMode", "control-group")
    if kill_mode in SPARING_KILL_MODES:
        return {"safe": True, "reason": ""}
    processes = _count(facts, "UnitProcesses")
    if processes is not None and processes <= 1:
        return {"safe": True, "reason": ""}
    others = f"{processes - 1} processes" if processes is not None else "the processes"
    return {
        "safe": False,
        "reason": (
            f"its unit has KillMode={kill_mode}, so a restart would kill {others} running beside the daemon in its "
            "unit (container shims, and with them the containers)"
        ),
    }
