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


# Several commands in one round trip (NodeAction.commands): each runs as its argv says (no shell in between, stdin
# empty), and its exit code, stdout and stderr come back under a marker line, the two outputs in base64 on one line
# each, so that no output (a terminal's \r\n, a line that looks like a marker) can be taken for another's.
COMMANDS_MARK = "@@kubegpu-command"
_COMMANDS_HEAD = (
    "d=$(mktemp -d) || exit 1\ntrap 'rm -rf \"$d\"' EXIT\n"
    'run() { n=$1; shift; "$@" >"$d/o" 2>"$d/e" </dev/null; rc=$?; printf \'%s %s %s\\n\' '
    f'{COMMANDS_MARK} "$n" "$rc"; '
    "base64 <\"$d/o\" | tr -d '\\n'; echo; base64 <\"$d/e\" | tr -d '\\n'; echo; }\n"
)


# Over SSH a command runs in a terminal (Ansible's ssh connection asks for one, `ssh -tt`, for every command that
# could become another user). systemd's tools then colour their output when the controller's TERM is a colour
# terminal, journalctl's JSON included, which the journal parsers then cannot read (seen: a failed restart quoted no
# error of the daemon when ansible-playbook ran in a terminal), and may start a pager. `env` works under every shell.
PLAIN_OUTPUT = ["env", "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=cat"]


def command_error(outcome: dict[str, Any]) -> str:
    """What a failed command said: its stderr, or its stdout where a terminal gave both as one (Ansible's ssh
    connection runs a command in a terminal, `ssh -tt`, and the node's stderr then arrives in stdout)."""
    return outcome["stderr"].strip() or outcome["stdout"].strip()


def commands_script(argvs: list[list[str]]) -> str:
    """The POSIX sh script that runs each argv in turn (NodeAction.commands)."""
    lines = [f"run {i} " + " ".join(shlex.quote(part) for part in argv) for i, argv in enumerate(argvs)]
    return _COMMANDS_HEAD + "\n".join(lines) + "\nexit 0\n"


def parse_commands(stdout: str, count: int) -> list[dict[str, Any]]:
    """commands_script's output: each command's {'rc', 'stdout', 'stderr'}, in order. Raises NodeError when an answer
    is missing (the script was cut off) or malformed."""
    lines = stdout.replace("\r\n", "\n").split("\n")
    found: dict[int, dict[str, Any]] = {}
    for i, line in enumerate(lines):
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != COMMANDS_MARK:
            continue
        if i + 2 >= len(lines) or not parts[1].isdigit() or not parts[2].isdigit():
            raise NodeError(f"the node's answer to {count} commands is cut off or malformed at {line!r}")
        try:
            out, err = (base64.b64decode(lines[i + k], validate=True) for k in (1, 2))
        except ValueError:
            raise NodeError(f"the node's answer to {count} commands is malformed after {line!r}") from None
        found[int(parts[1])] = {
            "rc": int(parts[2]),
            "stdout": to_text(out, errors="surrogate_or_replace"),
            "stderr": to_text(err, errors="surrogate_or_replace"),
        }
    missing = [i for i in range(count) if i not in found]
    if missing:
        raise NodeError(f"the node answered {count - len(missing)} of {count} commands (the read was cut off)")
    return [found[i] for i in range(count)]


class NodeAction(ActionBase):
    """ActionBase with the few node operations this collection's actions use, and their one run() frame.

    An action sets `argument_spec` and `failures` (the exceptions whose text is the task's failure message) and
    implements `_run(args)`, which returns the task's result. The frame validates the arguments, turns those
    exceptions into `failed` with their message (`failure_message`, which an action may word otherwise), and removes
    the task's temporary folder on the node in every case.
    """

    # No temporary folder on the node before one is needed (`put` makes it): with pipelining a module needs none, and
    # making and removing it costs two SSH round trips per task on a no-op run.
    TRANSFERS_FILES = False
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

        For reads and for systemctl; never for a change that check mode must prevent. An answer `prefetch` got for
        this argv is used (once) instead of running it again.
        """
        waiting = getattr(self, "_prefetched", {}).get(tuple(argv))
        if waiting:
            return waiting.pop(0)
        outcome = self._low_level_execute_command(" ".join(shlex.quote(part) for part in PLAIN_OUTPUT + argv))
        # Over SSH, Ansible runs the command in a terminal (ssh -tt), which ends every line "\r\n"; the parsers get
        # the command's own line ends back.
        return {
            "rc": outcome.get("rc"),
            "stdout": to_text(outcome.get("stdout", "")).replace("\r\n", "\n"),
            "stderr": to_text(outcome.get("stderr", "")).replace("\r\n", "\n"),
        }

    def commands(self, argvs: list[list[str]]) -> list[dict[str, Any]]:
        """Several commands in one round trip, each as `command` would run it: their answers, in order. For reads:
        each runs whatever the one before it did."""
        if not argvs:
            return []
        outcome = self.command(["sh", "-c", commands_script(argvs), "kubegpu-commands"])
        if outcome["rc"] != 0:
            raise NodeError(f"running {len(argvs)} reads failed (rc {outcome['rc']}): {command_error(outcome)}")
        return parse_commands(outcome["stdout"], len(argvs))

    def prefetch(self, argvs: list[list[str]]) -> None:
        """Run reads the action is about to make in one round trip; `command` then answers each of them (once each)
        from here. Only for reads made before the action changes anything on the node."""
        if not hasattr(self, "_prefetched"):
            self._prefetched: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for argv, outcome in zip(argvs, self.commands(argvs)):
            self._prefetched.setdefault(tuple(argv), []).append(outcome)

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
        """Write a scratch file into the task's temporary folder on the node (made now if the task has none yet) and
        return its path."""
        if self._connection._shell.tmpdir is None:
            self._make_tmp_path()
        tmpdir = self._connection._shell.tmpdir
        path = self._connection._shell.join_path(tmpdir, name)
        self._transfer_data(path, data)
        self._fixup_perms2((tmpdir, path))
        return path

    def cleanup(self) -> None:
        self._remove_tmp_path(self._connection._shell.tmpdir)
