"""The actions' one run() frame (plugins/plugin_utils/_node_action.py), and every action of the collection on it.

Before the frame was shared, the actions written against the older base overrode run() and called super().run(),
which now is the frame: it validated their options against an empty spec, so gpu_mig, gpu_health, nvidia_driver_plan
and nvidia_container_toolkit_plan refused every option they have ("Unsupported parameters ... Supported parameters
include: .").
"""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import (
    NodeAction,
    NodeError,
    command_error,
    commands_script,
    parse_commands,
)

ACTIONS = sorted(p.stem for p in (Path(__file__).parents[4] / "plugins" / "action").glob("*.py"))


class Shell:
    tmpdir = None


def make(cls: type[NodeAction], args: dict[str, Any]) -> NodeAction:
    task = SimpleNamespace(args=args, async_val=0, check_mode=False, diff=False, action="test")
    connection = SimpleNamespace(_shell=Shell())
    play_context = SimpleNamespace(check_mode=False)
    action = cls(task, connection, play_context, loader=None, templar=None, shared_loader_obj=None)
    action.cleanups = 0

    def cleanup(force: bool = False) -> None:
        action.cleanups += 1

    action.cleanup = cleanup
    action._early_needs_tmp_path = lambda: False  # no node here: no temporary folder to make
    return action


class Refused(Exception):
    pass


class Planner(NodeAction):
    TRANSFERS_FILES = False
    argument_spec: ClassVar[dict[str, Any]] = {"name": {"type": "str", "required": True}, "n": {"type": "int"}}
    failures = (Refused, NodeError)

    def _run(self, args: dict[str, Any]) -> dict[str, Any]:
        if args["name"] == "refuse":
            raise Refused("the plan refuses")
        if args["name"] == "bug":
            raise KeyError("a bug is not a failure message")
        return {"changed": False, "args": args}


class HostPlanner(Planner):
    def failure_message(self, exc: Exception) -> str:
        return self.host_failure_message(exc)


def test_the_frame_validates_the_options_and_hands_them_over():
    action = make(Planner, {"name": "a", "n": "3"})
    assert action.run(task_vars={"inventory_hostname": "gpu-1"}) == {
        "changed": False,
        "args": {"name": "a", "n": 3},
    }
    assert action.cleanups == 1
    with pytest.raises(AnsibleActionFail, match="Unsupported parameters"):
        make(Planner, {"name": "a", "other": 1}).run(task_vars={})


def test_the_failures_become_the_message_and_the_folder_is_removed_in_every_case():
    action = make(Planner, {"name": "refuse"})
    assert action.run(task_vars={"inventory_hostname": "gpu-1"}) == {"failed": True, "msg": "the plan refuses"}
    named = make(HostPlanner, {"name": "refuse"}).run(task_vars={"inventory_hostname": "gpu-1"})
    assert named == {"failed": True, "msg": "gpu-1: the plan refuses"}
    bug = make(Planner, {"name": "bug"})
    with pytest.raises(KeyError):
        bug.run(task_vars={})
    assert bug.cleanups == 1


def _value(spec: dict[str, Any]) -> Any:
    if spec.get("choices"):
        return spec["choices"][0]
    return {"dict": {}, "list": [], "int": 1, "bool": True, "float": 1.0}.get(spec.get("type", "str"), "x")


@pytest.mark.parametrize("name", ACTIONS)
def test_every_action_runs_through_the_one_frame(name: str, monkeypatch):
    cls = importlib.import_module(f"ansible_collections.kubegpu.node.plugins.action.{name}").ActionModule
    assert issubclass(cls, NodeAction)
    assert "run" not in vars(cls), f"{name} overrides run(); set argument_spec and failures, implement _run"
    assert cls.argument_spec, f"{name} has no argument_spec: the frame would refuse every option"
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(cls, "_run", lambda self, args: seen.append(args) or {"changed": False})
    required = {key: _value(spec) for key, spec in cls.argument_spec.items() if spec.get("required")}
    # Every option the action documents is accepted (given its default, or a value of its type where required).
    result = make(cls, required).run(task_vars={"inventory_hostname": "gpu-1"})
    assert result == {"changed": False} and len(seen) == 1
    assert set(seen[0]) == set(cls.argument_spec)


def test_command_gives_the_parsers_the_commands_own_line_ends():
    """Over SSH with become, Ansible runs a command in a terminal (ssh -tt), which ends its lines "\\r\\n": the kubelet
    plan split such an answer on "\\n" and read every provisioner marker as present (the demo's node 2 was refused as a
    kops node), and _kubelet_embedded.units_in_use never found the blank line between two units."""

    class Read(NodeAction):
        pass

    action = make(Read, {})
    action._low_level_execute_command = lambda cmd: {"rc": 0, "stdout": "-\r\n1\r\n\r\nA=b\r\n", "stderr": "x\r\n"}
    assert action.command(["true"]) == {"rc": 0, "stdout": "-\n1\n\nA=b\n", "stderr": "x\n"}


def test_a_command_in_a_terminal_asks_systemds_tools_for_plain_output(monkeypatch):
    """Over SSH a command runs in a terminal (ssh -tt). With the controller's TERM a colour terminal, journalctl wrote
    its JSON with colour codes, the journal parser read no entry, and a failed CRI-O restart quoted none of CRI-O's
    own reason (molecule crio over SSH, 2026-11-29). The command's environment turns colour and the pager off."""
    action, sent = shell_action("\r\n")
    monkeypatch.setenv("SYSTEMD_COLORS", "1")
    monkeypatch.setenv("SYSTEMD_PAGER", "less")
    answer = action.command(["sh", "-c", 'echo "colors=$SYSTEMD_COLORS pager=$SYSTEMD_PAGER" "$1"', "-", "a b"])
    assert answer == {"rc": 0, "stdout": "colors=0 pager=cat a b\n", "stderr": ""}
    assert len(sent) == 1


# ----- several reads in one round trip ------------------------------------------------------------------------------


def shell_action(line_end: str = "\n") -> tuple[NodeAction, list[str]]:
    """A NodeAction whose connection is the local shell; its commands are recorded."""
    action = make(Planner, {"name": "x"})
    sent: list[str] = []

    def execute(cmd: str) -> dict[str, Any]:
        sent.append(cmd)
        done = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=False)
        return {"rc": done.returncode, "stdout": done.stdout.replace("\n", line_end), "stderr": done.stderr}

    action._low_level_execute_command = execute  # type: ignore[method-assign]
    return action, sent


@pytest.mark.parametrize("line_end", ["\n", "\r\n"], ids=["pipe", "terminal"])
def test_commands_answer_each_argv_as_command_would_in_one_round_trip(line_end):
    action, sent = shell_action(line_end)
    argvs = [
        ["printf", "%s\\n", "two words", "it's"],
        ["sh", "-c", "echo oops >&2; exit 3"],
        ["kubegpu-no-such-command"],
        # An output that looks like the script's own marker is still this command's output.
        ["printf", "%s\\n", "@@kubegpu-command 0 0"],
        ["sh", "-c", 'read line; echo "stdin: [$line]"'],
    ]
    answers = action.commands(argvs)
    assert len(sent) == 1
    assert answers[0] == {"rc": 0, "stdout": "two words\nit's\n", "stderr": ""}
    assert answers[1] == {"rc": 3, "stdout": "", "stderr": "oops\n"}
    assert answers[2]["rc"] == 127 and "kubegpu-no-such-command" in answers[2]["stderr"]
    assert answers[3]["stdout"] == "@@kubegpu-command 0 0\n"
    assert answers[4]["stdout"] == "stdin: []\n"
    assert [action.command(argv) for argv in argvs[:2]] == answers[:2]


def test_an_answer_cut_off_is_an_error_not_fewer_answers():
    script = commands_script([["echo", "a"], ["echo", "b"]])
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    assert len(parse_commands(done.stdout, 2)) == 2
    cut = done.stdout[: done.stdout.index("@@kubegpu-command 1")]
    with pytest.raises(NodeError, match="answered 1 of 2"):
        parse_commands(cut, 2)
    with pytest.raises(NodeError, match="cut off or malformed"):
        parse_commands(cut + "@@kubegpu-command 1 0\n", 2)
    with pytest.raises(NodeError, match="malformed"):
        parse_commands(cut + "@@kubegpu-command 1 0\nnot base64!\n\n", 2)


def test_a_failure_quotes_what_the_node_said_where_a_terminal_merged_stderr_into_stdout():
    """Under `ssh -tt` the node's stderr arrives in stdout and stderr is empty: a failure quoted nothing."""
    action, _sent = shell_action("\r\n")
    action._low_level_execute_command = lambda cmd: {"rc": 2, "stdout": "sh: 1: base64: not found\r\n", "stderr": ""}
    with pytest.raises(NodeError, match=r"reads failed \(rc 2\): sh: 1: base64: not found$"):
        action.commands([["true"]])
    assert command_error({"rc": 1, "stdout": "out\n", "stderr": " err \n"}) == "err"
    assert command_error({"rc": 1, "stdout": " out \n", "stderr": ""}) == "out"


def test_prefetched_answers_are_used_once_then_the_node_is_asked_again():
    action, sent = shell_action()
    action.prefetch([["date", "+%N"], ["echo", "x"]])
    first = action.command(["date", "+%N"])
    assert len(sent) == 1 and action.command(["echo", "x"])["stdout"] == "x\n" and len(sent) == 1
    again = action.command(["date", "+%N"])
    assert len(sent) == 2 and again["rc"] == 0 and first["rc"] == 0


# ----- the temporary folder on the node -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIONS)
def test_no_action_makes_a_temporary_folder_before_it_needs_one(name):
    # issue 18: Ansible makes and removes a temporary folder around every task of an action that says it transfers
    # files: two SSH round trips a task, on every no-op run. NodeAction.put makes it when a file is written.
    module = importlib.import_module(f"ansible_collections.kubegpu.node.plugins.action.{name}")
    assert module.ActionModule.TRANSFERS_FILES is False


def test_put_makes_the_temporary_folder_once_when_the_first_file_is_written():
    action = make(Planner, {"name": "x"})
    shell = SimpleNamespace(tmpdir=None, join_path=lambda *parts: "/".join(parts))
    action._connection = SimpleNamespace(_shell=shell)
    made: list[str] = []
    written: list[tuple[str, str]] = []

    def make_tmp() -> str:
        made.append("tmp")
        shell.tmpdir = "/root/.ansible/tmp/ansible-tmp-1"
        return shell.tmpdir

    action._make_tmp_path = make_tmp  # type: ignore[method-assign]
    action._transfer_data = lambda path, data: written.append((path, data))  # type: ignore[method-assign]
    action._fixup_perms2 = lambda paths: None  # type: ignore[method-assign]
    first = action.put(".note", "{}")
    second = action.put(".source-0", "text")
    assert made == ["tmp"]
    assert (first, second) == ("/root/.ansible/tmp/ansible-tmp-1/.note", "/root/.ansible/tmp/ansible-tmp-1/.source-0")
    assert written == [(first, "{}"), (second, "text")]
