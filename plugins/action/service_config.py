# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.service_config: write a service's configuration files, restart it, check that it answers, and
# put every file back exactly when it does not. Documentation: plugins/modules/service_config.py.
#
# It runs on the controller and acts on the node only through builtin modules (stat, slurp, copy, file, systemd_service,
# uri) and plain commands (systemctl, journalctl), so the node needs nothing beyond what ansible-core itself needs.

from __future__ import annotations

import base64
import shlex
import time
from datetime import datetime, timezone
from typing import Any

from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc

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
    "verify": {
        "type": "dict",
        "options": {
            "command": {"type": "list", "elements": "str"},
            "url": {"type": "str"},
            "retries": {"type": "int", "default": 15},
            "delay": {"type": "float", "default": 2.0},
        },
        "mutually_exclusive": [["command", "url"]],
    },
    "backup_dir": {"type": "path", "default": "/var/lib/kubegpu/backup"},
    "error_pattern": {"type": "str", "default": sc.DEFAULT_ERROR_PATTERN},
}


class StepFailed(Exception):
    """A module or command on the node failed; the text is its own message."""


class ActionModule(ActionBase):
    TRANSFERS_FILES = True
    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        self._vars = task_vars or {}
        _validation, args = self.validate_argument_spec(ARGUMENT_SPEC)
        try:
            result.update(self._run(args))
        except (sc.PlanError, StepFailed) as exc:
            result.update(failed=True, msg=str(exc))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    # -----------------------------------------------------------------------------------------------------------------
    # Talking to the node
    # -----------------------------------------------------------------------------------------------------------------

    def _module(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        outcome = self._execute_module(module_name=name, module_args=args, task_vars=self._vars)
        if outcome.get("failed"):
            details = [to_text(outcome.get("msg", "")).strip()]
            details += [to_text(outcome.get(key, "")).strip() for key in ("stderr", "stdout") if outcome.get(key)]
            raise StepFailed(": ".join(d for d in details if d) or f"{name} failed")
        return outcome

    def _command(self, argv: list[str]) -> dict[str, Any]:
        """A read-only or systemctl command; run the same in check mode (it changes no file the task manages)."""
        outcome = self._low_level_execute_command(" ".join(shlex.quote(part) for part in argv))
        outcome["stdout"] = to_text(outcome.get("stdout", ""))
        outcome["stderr"] = to_text(outcome.get("stderr", ""))
        return outcome

    def _stat(self, path: str) -> dict[str, Any]:
        args = {"path": path, "follow": False, "get_checksum": True, "checksum_algorithm": "sha1", "get_mime": False}
        return self._module("ansible.legacy.stat", args)["stat"]

    def _read(self, path: str) -> str:
        data = base64.b64decode(self._module("ansible.legacy.slurp", {"src": path})["content"])
        return data.decode("utf-8", errors="replace")

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
            link = self._stat(spec["path"])
            target = self._stat(link["lnk_source"]) if link.get("exists") and link.get("islnk") else None
            state = sc.file_state(spec["path"], link, target)
            if state.real_path in seen:
                raise sc.PlanError(f"{spec['path']} and {seen[state.real_path]} are the same file; name it once")
            seen[state.real_path] = spec["path"]
            changes.append(sc.plan_change(spec, state))
        return changes

    def _diff(self, change: sc.FileChange) -> dict[str, Any]:
        state, spec = change.state, change.spec
        header = state.path if not state.is_link else f"{state.path} -> {state.real_path}"
        before = self._read(state.real_path) if state.exists and change.content_differs else None
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
        while parent != "/" and not self._stat(parent).get("exists"):
            missing.insert(0, parent)
            parent = parent.rsplit("/", 1)[0] or "/"
        return missing

    def _backup(self, change: sc.FileChange, backup_dir: str, stamp: str) -> str:
        self._module("ansible.legacy.file", {"path": backup_dir, "state": "directory", "mode": "0700"})
        backup = f"{backup_dir}/{sc.backup_name(change.state.real_path, stamp)}"
        self._module(
            "ansible.legacy.copy",
            {"src": change.state.real_path, "dest": backup, "remote_src": True, "mode": "0600", "follow": False},
        )
        return backup

    def _write(self, change: sc.FileChange, index: int) -> None:
        state, spec = change.state, change.spec
        tmpdir = self._connection._shell.tmpdir
        source = self._connection._shell.join_path(tmpdir, f".source-{index}")
        self._transfer_data(source, spec["content"])
        self._fixup_perms2((tmpdir, source))
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
        self._module("ansible.legacy.copy", args)

    def _restore(self, applied: list[tuple[sc.FileChange, str | None, list[str]]]) -> list[str]:
        """Put every applied file back as it was, the last first; returns what could not be restored."""
        problems: list[str] = []
        for change, backup, created in reversed(applied):
            state = change.state
            try:
                if backup is not None:
                    self._module(
                        "ansible.legacy.copy",
                        {
                            "src": backup,
                            "dest": state.real_path,
                            "remote_src": True,
                            "follow": False,
                            "force": True,
                            **sc.restore_attributes(state),
                        },
                    )
                else:
                    self._module("ansible.legacy.file", {"path": state.real_path, "state": "absent"})
                for folder in reversed(created):
                    self._command(["rmdir", folder])
            except StepFailed as exc:
                problems.append(f"{state.path}: {exc}")
        return problems

    # -----------------------------------------------------------------------------------------------------------------
    # The service
    # -----------------------------------------------------------------------------------------------------------------

    def _answers(self, verify: dict[str, Any] | None, service: str) -> tuple[bool, str]:
        """Whether the service answers after a restart, asked the way the caller said (else: systemd's word)."""
        verify = verify or {}
        retries = max(int(verify.get("retries", 15)), 1)
        delay = max(float(verify.get("delay", 2.0)), 0.0)
        last = ""
        for attempt in range(retries):
            if attempt:
                time.sleep(delay)
            if verify.get("command"):
                outcome = self._command(verify["command"])
                if outcome["rc"] == 0:
                    return True, ""
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
                outcome = self._command(["systemctl", "is-active", service])
                if outcome["rc"] == 0:
                    return True, ""
                last = f"systemctl is-active {service}: {outcome['stdout'].strip()}"
        return False, last

    def _restart(self, service: str, daemon_reload: bool, verify: dict[str, Any] | None) -> tuple[bool, str]:
        # A unit that failed or was restarted often in the last minutes may be held back by systemd's start limit;
        # that must not be mistaken for the service refusing its new configuration.
        self._command(["systemctl", "reset-failed", service])
        try:
            if daemon_reload:
                self._module("ansible.legacy.systemd_service", {"daemon_reload": True})
            self._module("ansible.legacy.systemd_service", {"name": service, "state": "restarted"})
        except StepFailed as exc:
            return False, str(exc)
        return self._answers(verify, service)

    def _why(self, service: str, since: str, pattern: str) -> tuple[str | None, str | None]:
        """systemd's result for the unit, and the daemon's own last error since the restart."""
        shown = self._command(["systemctl", "show", service, "--property=Result", "--value"])
        journal = self._command(
            ["journalctl", f"_SYSTEMD_UNIT={service}", f"--since=@{since}", "--output=cat", "--no-pager", "--lines=200"]
        )
        result = shown["stdout"].strip() or None if shown["rc"] == 0 else None
        return result, sc.daemon_error(journal["stdout"], pattern) if journal["rc"] == 0 else None

    # -----------------------------------------------------------------------------------------------------------------

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        service = args.get("service")
        if service and "." not in service:
            service += ".service"
        changes = self._plan(args["files"])
        changed = [c for c in changes if c.changed]
        restart_needed = bool(service and changed)
        restart = restart_needed and args["restart"]
        out: dict[str, Any] = {
            "changed": bool(changed),
            "files": [
                {"path": c.state.path, "real_path": c.state.real_path, "changed": c.changed, "existed": c.state.exists}
                for c in changes
            ],
            "restarted": False,
            "restart_pending": restart_needed and not restart,
        }
        if self._task.diff and changed:
            out["diff"] = [self._diff(c) for c in changed]
        if self._task.check_mode or not changed:
            out["restarted"] = bool(restart and self._task.check_mode)
            return out

        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        applied: list[tuple[sc.FileChange, str | None, list[str]]] = []
        try:
            for index, change in enumerate(changed):
                backup = self._backup(change, args["backup_dir"], stamp) if change.state.exists else None
                created = (
                    self._missing_dirs(change.state.real_path) if change.wanted and not change.state.exists else []
                )
                for folder in created:
                    self._module("ansible.legacy.file", {"path": folder, "state": "directory", "mode": "0755"})
                applied.append((change, backup, created))
                out["files"][changes.index(change)]["backup"] = backup
                if change.wanted:
                    self._write(change, index)
                else:
                    self._module("ansible.legacy.file", {"path": change.state.real_path, "state": "absent"})
        except StepFailed as exc:
            problems = self._restore(applied)
            restored = "Every file was put back as it was" if not problems else "Not every file could be put back"
            raise StepFailed(
                f"{change.state.path} was not written: {exc}. {restored}"
                + (f" ({'; '.join(problems)})" if problems else "")
                + (f", and {service} was not restarted." if service else ".")
            ) from None

        if not restart:
            return out
        since = self._command(["date", "+%s"])["stdout"].strip() or "0"
        ok, step_message = self._restart(service, args["daemon_reload"], args.get("verify"))
        if ok:
            out["restarted"] = True
            return out

        result, error = self._why(service, since, args["error_pattern"])
        problems = self._restore(applied)
        restored_running = False
        if not problems:
            restored_running, _message = self._restart(service, args["daemon_reload"], args.get("verify"))
        message = sc.restart_failure_message(
            service, result, error, step_message, rolled_back=not problems, restored_running=restored_running
        )
        if problems:
            message += f" Not put back: {'; '.join(problems)}."
        raise StepFailed(message)
