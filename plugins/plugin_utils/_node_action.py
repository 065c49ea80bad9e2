# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# Private base of this collection's action plugins, not a public API: it can change at any time.
# The actions plan on the controller and reach the node only through ansible-core's builtin modules and plain
# commands, so a node needs no more Python than ansible-core itself asks for (3.8 or later).

from __future__ import annotations

import base64
import shlex
from typing import Any

from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase


class NodeError(Exception):
    """A module or command on the node failed; the text is its own message."""


class NodeAction(ActionBase):
    """ActionBase with the few node operations this collection's actions use."""

    TRANSFERS_FILES = True
    _requires_connection = True
    _vars: dict[str, Any]

    def module(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Run a module on the node (in check mode when the task is); raise NodeError with its message if it fails."""
        outcome = self._execute_module(module_name=name, module_args=args, task_vars=self._vars)
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
        return {
            "rc": outcome.get("rc"),
            "stdout": to_text(outcome.get("stdout", "")),
            "stderr": to_text(outcome.get("stderr", "")),
        }

    def stat(self, path: str, checksum: bool = False) -> dict[str, Any]:
        """The stat of `path` itself (a link is not followed)."""
        args = {"path": path, "follow": False, "get_checksum": checksum, "get_mime": False}
        if checksum:
            args["checksum_algorithm"] = "sha1"
        return self.module("ansible.legacy.stat", args)["stat"]

    def read_bytes(self, path: str) -> bytes | None:
        """A file's bytes; None when it does not exist."""
        outcome = self._execute_module(
            module_name="ansible.legacy.slurp", module_args={"src": path}, task_vars=self._vars
        )
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
