"""The actions' one run() frame (plugins/plugin_utils/_node_action.py), and every action of the collection on it.

Before the frame was shared, the actions written against the older base overrode run() and called super().run(),
which now is the frame: it validated their options against an empty spec, so gpu_mig, gpu_health, nvidia_driver_plan
and nvidia_container_toolkit_plan refused every option they have ("Unsupported parameters ... Supported parameters
include: .").
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from ansible.errors import AnsibleActionFail
from ansible_collections.kubegpu.node.plugins.plugin_utils._node_action import NodeAction, NodeError

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
