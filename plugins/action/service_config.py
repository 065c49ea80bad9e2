# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.service_config: write a service's configuration files, restart it, check that it answers, and
# put every file back exactly when it does not. Documentation: plugins/modules/service_config.py.
#
# It runs on the controller and acts on the node only through builtin modules (stat, slurp, copy, file, systemd_service,
# uri) and plain commands (systemctl, journalctl), so the node needs nothing beyond what ansible-core itself needs.

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from typing import Any

from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError

ARGUMENT_SPEC: dict[str, Any] = {
    "service": {"type": "str"},
    "files": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "path": {"type": "path", "required": True},
            "content": {"type": "str"},
            "mode": {"type": "raw"},
            "owner": {"type": "str"},
            "group": {"type": "str"},
            "validate": {"type": "str"},
        },
    },
    "restart": {"type": "bool", "default": True},
    "daemon_reload": {"type": "bool", "default": False},
    "drained": {"type": "bool", "default": False},
    "verify": {
        "type": "dict",
        "options": {
            "command": {"type": "list", "elements": "str"},
            "url": {"type": "str"},
            "expect": {"type": "str"},
            "retries": {"type": "int", "default": 15},
            "delay": {"type": "float", "default": 2.0},
        },
        "mutually_exclusive": [["command", "url"]],
    },
    "reload": {"type": "bool", "default": False},
    "no_restart_reason": {"type": "str"},
    "backup_dir": {"type": "path", "default": "/var/lib/kubegpu/backup"},
    "pending_dir": {"type": "path", "default": "/var/lib/kubegpu/pending"},
    "error_pattern": {"type": "str", "default": sc.DEFAULT_ERROR_PATTERN},
}


class ActionModule(NodeAction):
    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        self._vars = task_vars or {}
        _validation, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            result.update(self._run(args))
        except (sc.PlanError, NodeError) as exc:
            result.update(failed=True, msg=str(exc))
        finally:
            self.cleanup()
        return result

    # -----------------------------------------------------------------------------------------------------------------
    # Planning
    # -----------------------------------------------------------------------------------------------------------------

    def _plan(self, files: list[dict[str, Any]]) -> list[sc.FileChange]:
        changes: list[sc.FileChange] = []
        seen: dict[str, str] = {}
        for spec in files:
            content = spec.get("content")
            if content is not None:
                try:
                    content.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise sc.PlanError(
                        f"the content planned for {spec['path']} is not valid text ({exc.reason} at character "
                        f"{exc.start}); nothing was changed"
                    ) from None
            link = self.stat(spec["path"], checksum=True)
            target = self.stat(link["lnk_source"], checksum=True) if link.get("exists") and link.get("islnk") else None
            state = sc.file_state(spec["path"], link, target)
            if state.real_path in seen:
                raise sc.PlanError(f"{spec['path']} and {seen[state.real_path]} are the same file; name it once")
            seen[state.real_path] = spec["path"]
            changes.append(sc.plan_change(spec, state))
        return changes

    def _diff(self, change: sc.FileChange) -> dict[str, Any]:
        state, spec = change.state, change.spec
        header = state.path if not state.is_link else f"{state.path} -> {state.real_path}"
        before = None
        if state.exists and change.content_differs:
            before = (self.read_bytes(state.real_path) or b"").decode("utf-8", errors="replace")
        after = spec.get("content")
        if not change.content_differs:
            before = after = ""
        want = sc.normal_mode(spec.get("mode"), spec["path"]) if state.exists else None
        return {
            "before_header": f"{header} (mode {state.mode})" if want and want != state.mode else header,
            "after_header": f"{header} (mode {want})" if want and want != state.mode else header,
            "before": "" if before is None else before,
            "after": "" if after is None else after,
        }

    # -----------------------------------------------------------------------------------------------------------------
    # Writing and restoring
    # -----------------------------------------------------------------------------------------------------------------

    def _missing_dirs(self, path: str) -> list[str]:
        """The folders above `path` that do not exist yet, the highest first."""
        missing: list[str] = []
        parent = path.rsplit("/", 1)[0] or "/"
        while parent != "/" and not self.stat(parent).get("exists"):
            missing.insert(0, parent)
            parent = parent.rsplit("/", 1)[0] or "/"
        return missing

    def _backup(self, change: sc.FileChange, backup_dir: str, stamp: str) -> str:
        self.module("ansible.legacy.file", {"path": backup_dir, "state": "directory", "mode": "0700"})
        backup = f"{backup_dir}/{sc.backup_name(change.state.real_path, stamp)}"
        self.module(
            "ansible.legacy.copy",
            {"src": change.state.real_path, "dest": backup, "remote_src": True, "mode": "0600", "follow": False},
        )
        return backup

    def _write(self, change: sc.FileChange, index: int) -> None:
        state, spec = change.state, change.spec
        source = self.put(f".source-{index}", spec["content"])
        args: dict[str, Any] = {
            "src": source,
            "dest": state.real_path,
            "_original_basename": state.real_path.rsplit("/", 1)[-1],
            "follow": False,
            "force": True,
            "checksum": sc.sha1(spec["content"]),
            **sc.write_attributes(change),
        }
        if spec.get("validate"):
            args["validate"] = spec["validate"]
        self.module("ansible.legacy.copy", args)

    def _restore(self, entries: list[dict[str, Any]]) -> list[str]:
        """Put files back as they were (see sc.restore_entry), the last first; returns what could not be restored."""
        problems: list[str] = []
        for entry in reversed(entries):
            try:
                if entry["backup"] is not None:
                    args = {"src": entry["backup"], "dest": entry["real_path"], "remote_src": True, "follow": False}
                    self.module("ansible.legacy.copy", {**args, "force": True, **entry["attributes"]})
                else:
                    self.module("ansible.legacy.file", {"path": entry["real_path"], "state": "absent"})
                for folder in reversed(entry["created_dirs"]):
                    self.command(["rmdir", folder])
            except NodeError as exc:
                problems.append(f"{entry['path']}: {exc}")
        return problems

    # -----------------------------------------------------------------------------------------------------------------
    # The service
    # -----------------------------------------------------------------------------------------------------------------

    def _answers(self, verify: dict[str, Any] | None, service: str, expect: bool = True) -> tuple[bool, str]:
        """Whether the service answers after a restart, asked the way the caller said (else: systemd's word).

        `expect` false (after a rollback): the command's answer need not show the new configuration.
        """
        verify = verify or {}
        retries = max(int(verify.get("retries", 15)), 1)
        delay = max(float(verify.get("delay", 2.0)), 0.0)
        last = ""
        for attempt in range(retries):
            if attempt:
                time.sleep(delay)
            if verify.get("command"):
                outcome = self.command(verify["command"])
                expected = verify.get("expect") if expect else None
                if outcome["rc"] == 0 and (not expected or re.search(expected, outcome["stdout"])):
                    return True, ""
                if outcome["rc"] == 0:
                    said = outcome["stdout"].strip()
                    last = f"`{' '.join(verify['command'])}` said {said!r}, not what was expected ({expected})"
                    continue
                said = (outcome["stderr"] or outcome["stdout"]).strip()
                last = f"`{' '.join(verify['command'])}` exited {outcome['rc']}: {said}"
            elif verify.get("url"):
                outcome = self._execute_module(
                    module_name="ansible.legacy.uri",
                    module_args={"url": verify["url"], "status_code": [200], "timeout": 5, "return_content": False},
                    task_vars=self._vars,
                )
                if not outcome.get("failed"):
                    return True, ""
                last = f"{verify['url']} did not answer 200: {to_text(outcome.get('msg', '')).strip()}"
            else:
                if attempt == 0:
                    time.sleep(delay)
                outcome = self.command(["systemctl", "is-active", service])
                if outcome["rc"] == 0:
                    return True, ""
                last = f"systemctl is-active {service}: {outcome['stdout'].strip()}"
        return False, last

    def _restart(self, service: str, args: dict[str, Any], expect: bool = True) -> tuple[bool, str]:
        # A unit that failed or was restarted often in the last minutes may be held back by systemd's start limit;
        # that must not be mistaken for the service refusing its new configuration.
        self.command(["systemctl", "reset-failed", service])
        try:
            if args["daemon_reload"]:
                self.module("ansible.legacy.systemd_service", {"daemon_reload": True})
            state = "reloaded" if args["reload"] else "restarted"
            self.module("ansible.legacy.systemd_service", {"name": service, "state": state})
        except NodeError as exc:
            return False, str(exc)
        return self._answers(args.get("verify"), service, expect)

    def _reload_guard(self, drained: bool) -> sc.ReloadDecision:
        """Whether `systemctl daemon-reload` may run now (NVIDIA/nvidia-docker#1730); the node is read only when it
        is not drained."""
        if drained:
            return sc.daemon_reload_decision(None, drained=True)
        probe = self.command(["sh", "-c", sc.GPU_PROBE_SCRIPT])
        if probe["rc"] != 0:
            raise NodeError(
                "could not find out whether a systemctl daemon-reload would take GPUs away from running containers "
                f"(reading /dev/nvidia* and /proc/*/fd failed: {(probe['stderr'] or probe['stdout']).strip()}); "
                "nothing was changed"
            )
        return sc.daemon_reload_decision(sc.parse_gpu_probe(probe["stdout"]), drained=False)

    def _why(self, service: str, since: str, pattern: str) -> tuple[str | None, str | None]:
        """systemd's result for the unit, and the daemon's own last error since the restart."""
        shown = self.command(["systemctl", "show", service, "--property=Result", "--value"])
        journal = self.command(
            ["journalctl", f"_SYSTEMD_UNIT={service}", f"--since=@{since}", "--output=cat", "--no-pager", "--lines=200"]
        )
        result = shown["stdout"].strip() or None if shown["rc"] == 0 else None
        return result, sc.daemon_error(journal["stdout"], pattern) if journal["rc"] == 0 else None

    # -----------------------------------------------------------------------------------------------------------------

    def _clock(self, service: str) -> tuple[str, int, int | None]:
        """This boot's id, microseconds since boot, and when the unit's main process started (same clock).

        /proc/uptime counts from boot as systemd's monotonic timestamps do on machines that do not suspend (servers).
        """
        shown = self.command(
            [
                "sh",
                "-c",
                'cat /proc/sys/kernel/random/boot_id /proc/uptime; systemctl show "$1" '
                "--property=ExecMainStartTimestampMonotonic --value",
                "-",
                service,
            ]
        )
        lines = shown["stdout"].split("\n")
        boot_id, now = lines[0].strip(), sc.uptime_us(lines[1]) if len(lines) > 1 else 0
        started = int(lines[2]) if len(lines) > 2 and lines[2].strip().isdigit() else None
        return boot_id, now, started

    def _pending(self, service: str, pending_file: str) -> dict[str, Any] | None:
        """The held-back change of `service`, when it is still not active (the unit has not restarted since)."""
        marker = sc.parse_marker((self.read_bytes(pending_file) or b"").decode("utf-8", errors="replace"))
        if marker is None:
            return None
        boot_id, _now, started = self._clock(service)
        if sc.pending_is_current(marker, boot_id, started):
            return marker
        # The unit restarted (or the node rebooted) since: the change is active and the note has served.
        if not self._task.check_mode:
            self.module("ansible.legacy.file", {"path": pending_file, "state": "absent"})
        return None

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        service = args.get("service")
        if service and "." not in service:
            service += ".service"
        changes = self._plan(args["files"])
        changed = [c for c in changes if c.changed]
        pending_file = f"{args['pending_dir']}/{service}.json" if service else ""
        marker = self._pending(service, pending_file) if service else None
        restart_needed = bool(service and (changed or marker))
        restart = restart_needed and args["restart"]
        # Read before any change, also in check mode: a reload that would take GPUs away holds the restart back.
        guard = self._reload_guard(args["drained"]) if restart and args["daemon_reload"] else None
        if guard is not None and not guard.allowed:
            restart = False
        out: dict[str, Any] = {
            "changed": bool(changed),
            "files": [
                {"path": c.state.path, "real_path": c.state.real_path, "changed": c.changed, "existed": c.state.exists}
                for c in changes
            ],
            "restarted": False,
            "restart_pending": restart_needed and not restart,
        }
        if guard is not None:
            out["gpu_guard"] = guard.as_result()
        if out["restart_pending"] and guard is not None and not guard.allowed:
            out["warnings"] = [sc.daemon_reload_warning(service, guard)]
        elif out["restart_pending"]:
            reason = f" ({args['no_restart_reason']})" if args.get("no_restart_reason") else ""
            out["warnings"] = [
                f"{service} was not restarted{reason}: it still runs with its previous configuration. "
                f"Restart it when that is safe (drain the node first), or run again with restarts allowed."
            ]
        if self._task.diff and changed:
            out["diff"] = [self._diff(c) for c in changed]
        if self._task.check_mode or (not changed and not restart):
            out["restarted"] = bool(restart and self._task.check_mode)
            return out

        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        applied: list[dict[str, Any]] = []
        change = None
        try:
            for index, change in enumerate(changed):
                backup = self._backup(change, args["backup_dir"], stamp) if change.state.exists else None
                created = (
                    self._missing_dirs(change.state.real_path) if change.wanted and not change.state.exists else []
                )
                for folder in created:
                    self.module("ansible.legacy.file", {"path": folder, "state": "directory", "mode": "0755"})
                applied.append(sc.restore_entry(change, backup, created))
                out["files"][changes.index(change)]["backup"] = backup
                if change.wanted:
                    self._write(change, index)
                else:
                    self.module("ansible.legacy.file", {"path": change.state.real_path, "state": "absent"})
        except NodeError as exc:
            problems = self._restore(applied)
            restored = "Every file was put back as it was" if not problems else "Not every file could be put back"
            raise NodeError(
                f"{change.state.path if change else 'a file'} was not written: {exc}. {restored}"
                + (f" ({'; '.join(problems)})" if problems else "")
                + (f", and {service} was not restarted." if service else ".")
            ) from None

        # What the service runs with: the files before the first change it has not read yet.
        entries = sc.merge_restore_entries(marker["restore"] if marker else [], applied)
        if not service:
            return out
        if not restart:
            self.module("ansible.legacy.file", {"path": args["pending_dir"], "state": "directory", "mode": "0700"})
            boot_id, now, _started = self._clock(service)
            record = {"boot_id": boot_id, "written_us": now, "service": service, "restore": entries}
            self._write_text(pending_file, json.dumps(record, indent=2, sort_keys=True) + "\n")
            return out

        since = self.command(["date", "+%s"])["stdout"].strip() or "0"
        ok, step_message = self._restart(service, args)
        if ok:
            out["restarted"] = True
            if marker:
                self.module("ansible.legacy.file", {"path": pending_file, "state": "absent"})
            return out

        result, error = self._why(service, since, args["error_pattern"])
        problems = self._restore(entries)
        restored_running = False
        if not problems:
            restored_running, _message = self._restart(service, args, expect=False)
            if marker:
                self.module("ansible.legacy.file", {"path": pending_file, "state": "absent"})
        message = sc.restart_failure_message(
            service, result, error, step_message, rolled_back=not problems, restored_running=restored_running
        )
        if problems:
            message += f" Not put back: {'; '.join(problems)}."
        raise NodeError(message)

    def _write_text(self, path: str, text: str) -> None:
        source = self.put(".marker", text)
        self.module("ansible.legacy.copy", {"src": source, "dest": path, "mode": "0600", "force": True})
