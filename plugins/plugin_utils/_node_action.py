# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private base of this collection's action plugins, not a public API: it can change at any time.
# The actions plan on the controller and reach the node only through ansible-core's builtin modules and plain
# commands, so a node needs no more Python than ansible-core itself asks for (3.8 or later).

from __future__ import annotations

import base64
import os
import shlex
import signal
from typing import Any, ClassVar

from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

# Test hook (kubegpu.node.service_config documents it): when the controller's environment names a step here, the
# controller dies at that step as a SIGKILL leaves it, with no cleanup and no rescue, so that a test can check what
# the next run makes of a change cut at exactly that point. Never set outside tests.
KILL_AT_ENV = "KUBEGPU_NODE_TEST_KILL_AT"


class NodeError(Exception):
    """A module or command on the node failed; the text is its own message."""


class NodeAction(ActionBase):
    """ActionBase with the few node operations this collection's actions use, and their one run() frame.

    An action sets `argument_spec` and `failures` (the exceptions whose text is the task's failure message) and
    implements `_run(args)`, which returns the task's result. The frame validates the arguments, turns those
    exceptions into `failed` with their message (`failure_message`, which an action may word otherwise), and removes
    the task's temporary folder on the node in every case.
    """

    TRANSFERS_FILES = True
    _requires_connection = True
    _vars: dict[str, Any]
    argument_spec: ClassVar[dict[str, Any]] = {}
    failures: ClassVar[tuple[type[Exception], ...]] = (NodeError,)

    def run(self, tmp: str | None = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp
        self._vars = task_vars or {}
        _validation, args = self.validate_argument_spec(self.argument_spec)
        try:
            result.update(self._run(args))
        except self.failures as exc:
            result.update(failed=True, msg=self.failure_message(exc))
        finally:
            self.cleanup()
        return result

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def failure_message(self, exc: Exception) -> str:
        return str(exc)

    def host_failure_message(self, exc: Exception) -> str:
        """The failure message after the host's name, for the actions whose refusals read as sentences about it."""
        return f"{self._vars.get('inventory_hostname', 'the node')}: {exc}"

    @staticmethod
    def step(name: str) -> None:
        """A step boundary of a change (see KILL_AT_ENV): the controller is killed here when a test asks for it."""
        if os.environ.get(KILL_AT_ENV) == name:
            # The worker and the ansible-playbook process that forked it, as a SIGKILL of the controller leaves them.
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    def module_outcome(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run a module on the node (in check mode when the task is) and return what it returned, failed or not."""
        return self._execute_module(module_name=name, module_args=args, task_vars=self._vars)

    def module(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run a module on the node (in check mode when the task is); raise NodeError with its message if it fails."""
        outcome = self.module_outcome(name, args)
        if outcome.get("failed"):
            details = [to_text(outcome.get("msg", "")).strip()]
            details += [to_text(outcome.get(key, "")).strip() for key in ("stderr", "stdout") if outcome.get(key)]
            raise NodeError(": ".join(d for d in details if d) or f"{name} failed")
        return outcome

    def command(self, argv: list[str]) -> dict[str, Any]:
        """Run a command through the connection's shell (also in check mode): {'rc', 'stdout', 'stderr'}.

        For reads and for systemctl; never for a change that check mode must prevent.
        """
        outcome = self._low_level_execute_command(" ".join(shlex.quote(part) for part in argv))
        # Over SSH with become, Ansible runs the command in a terminal (ssh -tt), which ends every line "\r\n"; the
        # parsers get the command's own line ends back.
        return {
            "rc": outcome.get("rc"),
            "stdout": to_text(outcome.get("stdout", "")).replace("\r\n", "\n"),
            "stderr": to_text(outcome.get("stderr", "")).replace("\r\n", "\n"),
        }

    def stat(self, path: str, checksum: bool = False) -> dict[str, Any]:
        """The stat of `path` itself (a link is not followed)."""
        args = {"path": path, "follow": False, "get_checksum": checksum, "get_mime": False}
        if checksum:
            args["checksum_algorithm"] = "sha1"
        return self.module("ansible.legacy.stat", args)["stat"]

    def read_bytes(self, path: str) -> bytes | None:
        """A file's bytes; None when it does not exist."""
        outcome = self.module_outcome("ansible.legacy.slurp", {"src": path})
        if outcome.get("failed"):
            if "file not found" in to_text(outcome.get("msg", "")).lower():
                return None
            raise NodeError(f"cannot read {path}: {to_text(outcome.get('msg', ''))}")
        return base64.b64decode(outcome["content"])

    def put(self, name: str, data: str | bytes) -> str:
        """Write a scratch file into the task's temporary folder on the node and return its path."""
        tmpdir = self._connection._shell.tmpdir
        path = self._connection._shell.join_path(tmpdir, name)
        self._transfer_data(path, data)
        self._fixup_perms2((tmpdir, path))
        return path

    def cleanup(self) -> None:
        self._remove_tmp_path(self._connection._shell.tmpdir)
