# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.service_config: write a service's configuration files, restart it, check that it answers, and
# put every file back exactly when it does not. Documentation: plugins/modules/service_config.py.
#
# It runs on the controller and acts on the node only through builtin modules (stat, slurp, copy, file, systemd_service,
# uri) and plain commands (systemctl, journalctl), so the node needs nothing beyond what ansible-core itself needs.
#
# The order of a change (each boundary is a named step, sc.STEP_*): backups; the note (pending/<unit>.json, with the
# way back) before the first file; the files in the order given; the restart or reload; the verification; the note
# removed only then (or after the rollback). A run cut anywhere leaves a note whenever some file may differ from what
# the service runs with, and the next run finishes the change (restart, verify, roll back) or finds it moot.

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ansible.module_utils.common.text.converters import to_text
from ansible_collections.kubegpu.node.plugins.plugin_utils import _service_config as sc
from ansible_collections.kubegpu.node.plugins.plugin_utils import _systemd_syntax as sd
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError, command_error

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

# How many of the unit's journal entries since the restart are read to find its error (the newest are kept).
JOURNAL_LINES = 2000
# journald copies a unit's output into the journal as it reads the unit's stream, on its own time: on a busy node the
# last words of a process that has already exited can reach the journal after `systemctl restart` has returned the
# failure. A journal that holds no error yet is read again, after `journalctl --sync`, this many times in all, a second
# apart (on the failure path only: a restart that works never reads the journal).
JOURNAL_READS = 5
JOURNAL_DELAY = 1.0


@dataclass
class Plan:
    """What this run does, decided before anything on the node changes (also in check mode)."""

    service: str | None
    note_file: str
    changes: list[sc.FileChange]
    # A note of an earlier change that the service may not run with yet: its way back is kept with this run's.
    note: dict[str, Any] | None = None
    # The noted files the service runs with as they will be after this run (the note is moot): no restart for them.
    moot_paths: set[str] = field(default_factory=set)
    remove_note: bool = False  # the note has served: removed in this run (outside check mode)
    restart_needed: bool = False
    restart: bool = False
    guard: sc.ReloadDecision | None = None

    @property
    def changed_files(self) -> list[sc.FileChange]:
        return [change for change in self.changes if change.changed]


class ActionModule(NodeAction):
    argument_spec = ARGUMENT_SPEC
    failures = (sc.PlanError, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        plan = self._decide(args)
        out = self._report(plan, args)
        if self._task.check_mode:
            return out
        if plan.changed_files or plan.restart:
            entries = self._apply(plan, args, out)
            if plan.restart:
                self._restart_verify_or_roll_back(plan, args, entries)
                out["restarted"] = True
                out["changed"] = True
        elif plan.remove_note or plan.moot_paths:
            self._remove_note(plan)
        return out

    # -----------------------------------------------------------------------------------------------------------------
    # Deciding (reads only)
    # -----------------------------------------------------------------------------------------------------------------

    def _decide(self, args: dict[str, Any]) -> Plan:
        service = args.get("service")
        if service and "." not in service:
            service += ".service"
        plan = Plan(
            service=service,
            note_file=f"{args['pending_dir']}/{service}.json" if service else "",
            changes=self._plan(args["files"]),
        )
        if service:
            self._read_note(plan, args)
        unread = [change for change in plan.changed_files if change.state.real_path not in plan.moot_paths]
        plan.restart_needed = plan.restart_needed or bool(service and unread)
        plan.restart = plan.restart_needed and args["restart"]
        # Read before any change, also in check mode: a reload that would take GPUs away holds the restart back.
        if plan.restart and args["daemon_reload"]:
            plan.guard = self._reload_guard(args["drained"])
            plan.restart = plan.guard.allowed
        return plan

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
            state = self._state(spec["path"])
            if state.real_path in seen:
                raise sc.PlanError(f"{spec['path']} and {seen[state.real_path]} are the same file; name it once")
            seen[state.real_path] = spec["path"]
            changes.append(sc.plan_change(spec, state))
        return changes

    def _state(self, path: str) -> sc.FileState:
        link = self.stat(path, checksum=True)
        target = self.stat(link["lnk_source"], checksum=True) if link.get("exists") and link.get("islnk") else None
        return sc.file_state(path, link, target)

    def _read_note(self, plan: Plan, args: dict[str, Any]) -> None:
        """What an earlier change that the service may not run with yet asks of this run.

        Not active yet (the service has not started since the note): the restart is still due, unless every noted
        file is back as it was before that change once this run is done (the note is moot). Active (the service started
        since, or the node rebooted): it has read the files, but nobody saw it answer; it is asked now, and restarted
        (with the way back) when it does not answer.
        """
        service = plan.service or ""
        note = sc.parse_marker((self.read_bytes(plan.note_file) or b"").decode("utf-8", errors="replace"))
        if note is None:
            return
        boot_id, _now, started = self._clock(service)
        if sc.pending_is_current(note, boot_id, started):
            plan.note = note
            if sc.back_as_before(note["restore"], self._after(plan.changes, note["restore"])):
                plan.moot_paths = {entry["real_path"] for entry in note["restore"]}
            else:
                plan.restart_needed = True
            return
        answers, _message = self._answers(args.get("verify"), service, expect=False)
        if answers:
            plan.remove_note = True
            return
        plan.note = note
        plan.restart_needed = True

    def _after(self, changes: list[sc.FileChange], entries: list[dict[str, Any]]) -> dict[str, sc.Planned]:
        """Each file of a note as this run leaves it."""
        after = {change.state.real_path: sc.planned_state(change) for change in changes}
        for entry in entries:
            path = entry["real_path"]
            if path not in after:
                try:
                    after[path] = sc.current_as_planned(self._state(path))
                except sc.PlanError:
                    continue
        return after

    def _reload_guard(self, drained: bool) -> sc.ReloadDecision:
        """Whether `systemctl daemon-reload` may run now (NVIDIA/nvidia-docker#1730); the node is read only when it
        is not drained."""
        if drained:
            return sc.daemon_reload_decision(None, drained=True)
        probe = self.command(["sh", "-c", sc.GPU_PROBE_SCRIPT])
        if probe["rc"] != 0:
            raise NodeError(
                "could not find out whether a systemctl daemon-reload would take GPUs away from running containers "
                f"(reading /dev/nvidia* and /proc/*/fd failed: {command_error(probe)}); "
                "nothing was changed"
            )
        return sc.daemon_reload_decision(sc.parse_gpu_probe(probe["stdout"]), drained=False)

    def _report(self, plan: Plan, args: dict[str, Any]) -> dict[str, Any]:
        """The task's result as decided; `restarted` and `changed` say what a check run would do."""
        would_restart = bool(plan.restart and self._task.check_mode)
        out: dict[str, Any] = {
            "changed": bool(plan.changed_files) or would_restart,
            "files": [
                {"path": c.state.path, "real_path": c.state.real_path, "changed": c.changed, "existed": c.state.exists}
                for c in plan.changes
            ],
            "restarted": would_restart,
            "restart_pending": plan.restart_needed and not plan.restart,
            # A note of an earlier change (pending/<unit>.json) that this run acts on: finishes, or removes as moot.
            "note": plan.note is not None or plan.remove_note,
        }
        if plan.guard is not None:
            out["gpu_guard"] = plan.guard.as_result()
        if out["restart_pending"] and plan.guard is not None and not plan.guard.allowed:
            out["warnings"] = [sc.daemon_reload_warning(plan.service or "", plan.guard)]
        elif out["restart_pending"]:
            reason = f" ({args['no_restart_reason']})" if args.get("no_restart_reason") else ""
            out["warnings"] = [
                f"{plan.service} was not restarted{reason}: it still runs with its previous configuration. "
                f"Restart it when that is safe (drain the node first), or run again with restarts allowed."
            ]
        if self._task.diff and plan.changed_files:
            out["diff"] = [self._diff(c) for c in plan.changed_files]
        return out

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
    # Writing: backups, the note, the files
    # -----------------------------------------------------------------------------------------------------------------

    def _apply(self, plan: Plan, args: dict[str, Any], out: dict[str, Any]) -> list[dict[str, Any]]:
        """Back up, note, write; returns the way back to what the service runs with. The note stays when the service
        is to be restarted (removed after it answers) or still runs with the previous files (restart held back)."""
        applied = self._back_up(plan, args["backup_dir"], out)
        self.step(sc.STEP_BACKED_UP)
        entries = sc.merge_restore_entries(plan.note["restore"] if plan.note else [], applied)
        if plan.service and applied:
            self._write_note(plan, entries)
        self.step(sc.STEP_NOTED)
        self._write_files(plan, applied)
        if plan.service and not plan.restart_needed:
            # Every file is back as the service runs it (a note found moot), or nothing needs the service.
            self._remove_note(plan)
        return entries

    def _back_up(self, plan: Plan, backup_dir: str, out: dict[str, Any]) -> list[dict[str, Any]]:
        """Copy each file about to change; the way back to each (what it was, its copy, the folders to create)."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        entries = []
        if any(change.state.exists for change in plan.changed_files):
            self.module("ansible.legacy.file", {"path": backup_dir, "state": "directory", "mode": "0700"})
        for change in plan.changed_files:
            backup = None
            if change.state.exists:
                backup = f"{backup_dir}/{sc.backup_name(change.state.real_path, stamp)}"
                self.module(
                    "ansible.legacy.copy",
                    {
                        "src": change.state.real_path,
                        "dest": backup,
                        "remote_src": True,
                        "mode": "0600",
                        "follow": False,
                    },
                )
            created = self._missing_dirs(change.state.real_path) if change.wanted and not change.state.exists else []
            entries.append(sc.restore_entry(change, backup, created))
            out["files"][plan.changes.index(change)]["backup"] = backup
        return entries

    def _missing_dirs(self, path: str) -> list[str]:
        """The folders above `path` that do not exist yet, the highest first."""
        missing: list[str] = []
        parent = path.rsplit("/", 1)[0] or "/"
        while parent != "/" and not self.stat(parent).get("exists"):
            missing.insert(0, parent)
            parent = parent.rsplit("/", 1)[0] or "/"
        return missing

    def _write_note(self, plan: Plan, entries: list[dict[str, Any]]) -> None:
        """The note, before the first file changes: when it was written (this boot's clock) and the way back."""
        self.module(
            "ansible.legacy.file", {"path": plan.note_file.rsplit("/", 1)[0], "state": "directory", "mode": "0700"}
        )
        boot_id, now, _started = self._clock(plan.service or "")
        record = {"boot_id": boot_id, "written_us": now, "service": plan.service, "restore": entries}
        source = self.put(".note", json.dumps(record, indent=2, sort_keys=True) + "\n")
        self.module("ansible.legacy.copy", {"src": source, "dest": plan.note_file, "mode": "0600", "force": True})

    def _remove_note(self, plan: Plan) -> None:
        self.module("ansible.legacy.file", {"path": plan.note_file, "state": "absent"})

    def _write_files(self, plan: Plan, applied: list[dict[str, Any]]) -> None:
        """The files in the order given; when one cannot be written, those of this run are put back and the note is
        as before (the service runs with what it ran with)."""
        change = None
        try:
            for index, change in enumerate(plan.changed_files, start=1):
                for folder in applied[index - 1]["created_dirs"]:
                    self.module("ansible.legacy.file", {"path": folder, "state": "directory", "mode": "0755"})
                if change.wanted:
                    self._write(change, index)
                else:
                    self.module("ansible.legacy.file", {"path": change.state.real_path, "state": "absent"})
                self.step(sc.STEP_WROTE.format(index))
        except NodeError as exc:
            problems = self._restore(applied)
            if not problems and plan.service and plan.note is None and applied:
                self._remove_note(plan)
            restored = "Every file was put back as it was" if not problems else "Not every file could be put back"
            raise NodeError(
                f"{change.state.path if change else 'a file'} was not written: {exc}. {restored}"
                + (f" ({'; '.join(problems)})" if problems else "")
                + (f", and {plan.service} was not restarted." if plan.service else ".")
            ) from None

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

    def _restore(self, entries: list[dict[str, Any]], steps: bool = False) -> list[str]:
        """Put files back as they were (see sc.restore_entry), the last first; returns what could not be restored."""
        problems: list[str] = []
        for index, entry in enumerate(reversed(entries), start=1):
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
            if steps:
                self.step(sc.STEP_RESTORED.format(index))
        return problems

    # -----------------------------------------------------------------------------------------------------------------
    # The service: restart, verify, roll back
    # -----------------------------------------------------------------------------------------------------------------

    def _restart_verify_or_roll_back(self, plan: Plan, args: dict[str, Any], entries: list[dict[str, Any]]) -> None:
        service = plan.service or ""
        mark, after, ok, step_message = self._restart(service, args)
        if ok:
            self.step(sc.STEP_VERIFIED)
            self._remove_note(plan)
            return
        result, error = self._why(service, mark, after, args)
        problems = self._restore(entries, steps=True)
        restored_running = False
        if not problems:
            _mark, _after, restored_running, _message = self._restart(service, args, expect=False, steps=False)
            self.step(sc.STEP_ROLLED_BACK)
            self._remove_note(plan)
        message = sc.restart_failure_message(
            service, result, error, step_message, rolled_back=not problems, restored_running=restored_running
        )
        if problems:
            message += f" Not put back: {'; '.join(problems)}."
        raise NodeError(message)

    def _restart(
        self, service: str, args: dict[str, Any], expect: bool = True, steps: bool = True
    ) -> tuple[sc.RestartMark, str, bool, str]:
        """Restart (or reload) the service and wait until it answers: where the journal stood before, the unit's
        invocation ID right after, whether it answers, and why not. `steps`: the restart of a change (not of a
        rollback) passes the named steps."""
        # systemd's start limit and failed state are cleared first: a unit that failed or restarted often in the last
        # minutes must not be refused by its start limit and mistaken for refusing its new configuration.
        mark = sc.parse_restart_mark(self.command(["sh", "-c", sc.BEFORE_RESTART_SCRIPT, "-", service])["stdout"])
        failure = ""
        try:
            if args["daemon_reload"]:
                self.module("ansible.legacy.systemd_service", {"daemon_reload": True})
                if steps:
                    self.step(sc.STEP_DAEMON_RELOADED)
            state = "reloaded" if args["reload"] else "restarted"
            self.module("ansible.legacy.systemd_service", {"name": service, "state": state})
        except NodeError as exc:
            failure = str(exc)
        after = self._invocation(service)
        if steps:
            self.step(sc.STEP_RESTARTED)
        if failure:
            return mark, after, False, failure
        ok, message = self._answers(args.get("verify"), service, expect)
        return mark, after, ok, message

    def _invocation(self, service: str) -> str:
        shown = self.command(["systemctl", "show", service, "--property=InvocationID", "--value"])
        return shown["stdout"].strip() if shown["rc"] == 0 else ""

    def _answers(self, verify: dict[str, Any] | None, service: str, expect: bool = True) -> tuple[bool, str]:
        """Whether the service answers after a restart, asked the way the caller said (else: systemd's word).

        `expect` false (after a rollback, or about a change an earlier run made): the command's answer need not show
        this run's configuration.
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
                said = command_error(outcome)
                last = f"`{' '.join(verify['command'])}` exited {outcome['rc']}: {said}"
            elif verify.get("url"):
                outcome = self.module_outcome(
                    "ansible.legacy.uri",
                    {"url": verify["url"], "status_code": [200], "timeout": 5, "return_content": False},
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

    def _why(
        self, service: str, mark: sc.RestartMark, after: str, args: dict[str, Any]
    ) -> tuple[str | None, str | None]:
        """systemd's result for the unit, and the last error the processes this restart started logged."""
        # Result, and the main process's PID (kept after it exited): its lines count even where the journal could not
        # place them in an invocation (a process that exited before journald read its stream).
        shown = self.command(["systemctl", "show", service, "--property=Result,ExecMainPID"])
        properties = sd.show_properties(shown["stdout"]) if shown["rc"] == 0 else {}
        argv = ["journalctl", f"--unit={service}", "--output=json", f"--output-fields={sc.JOURNAL_FIELDS}"]
        argv += [f"--lines={JOURNAL_LINES}", "--no-pager"]
        if mark.cursor:
            argv.append(f"--after-cursor={mark.cursor}")
        result = properties.get("Result") or None
        main_pid = properties.get("ExecMainPID") or None
        error = None
        for attempt in range(JOURNAL_READS):
            if attempt:
                time.sleep(JOURNAL_DELAY)
                self.command(["journalctl", "--sync"])  # best effort: an older journald, or no right to ask
            journal = self.command(argv)
            if journal["rc"] != 0:
                return result, None
            error = sc.new_process_error(
                journal["stdout"],
                service,
                mark,
                after,
                reloaded=args["reload"],
                pattern=args["error_pattern"],
                main_pid=main_pid,
            )
            if error:
                break
        return result, error

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
