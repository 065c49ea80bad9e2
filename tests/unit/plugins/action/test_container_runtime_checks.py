# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The action kubegpu.node.container_runtime_checks over a stand-in connection: each command it would send over SSH
# runs in this machine's sh, with stand-in runtime binaries on the PATH, and is recorded (a command is a round trip).
# tests/integration/test_container_runtime_handover.py runs it inside the role.

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible_collections.kubegpu.node.plugins.action.container_runtime_checks import ActionModule

BINARIES = {"docker": "kubegpu-t-dockerd", "containerd": "kubegpu-t-containerd", "cri-o": "kubegpu-t-crio"}


class _Shell:
    tmpdir = None

    @staticmethod
    def env_prefix(**env: str) -> str:
        return " ".join(f"{name}={shlex.quote(str(value))}" for name, value in env.items())


class Node:
    """This machine as the node: the folder `bin` holds the stand-in binaries, `nvidia` is the runtime's path."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.nvidia = root / "nvidia-container-runtime"
        self.commands: list[str] = []

    def install(self, name: str, dump: str = "") -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'config dump' ] && printf '%s' {shlex.quote(dump)}\nexit 0\n")
        path.chmod(0o755)

    def install_nvidia(self) -> None:
        self.nvidia.write_text("#!/bin/sh\n")
        self.nvidia.chmod(0o755)

    def action(self, args: dict, check_mode: bool = False, environment: list | None = None) -> ActionModule:
        task = SimpleNamespace(
            args={"nvidia_runtime_path": str(self.nvidia), "binaries": BINARIES, **args},
            async_val=0,
            check_mode=check_mode,
            diff=False,
            action="kubegpu.node.container_runtime_checks",
            environment=environment,
        )
        connection = SimpleNamespace(_shell=_Shell())
        templar = Templar(loader=DataLoader())
        action = ActionModule(task, connection, SimpleNamespace(check_mode=check_mode), None, templar, None)
        path = f"{self.bin}{os.pathsep}/usr/bin:/bin"

        def execute(cmd: str, sudoable: bool = True, in_data=None) -> dict:
            self.commands.append(cmd)
            done = subprocess.run(cmd, shell=True, capture_output=True, text=True, env={"PATH": path}, check=False)
            # As over SSH with become: a terminal's line ends.
            return {"rc": done.returncode, "stdout": done.stdout.replace("\n", "\r\n"), "stderr": done.stderr}

        def refused(*args, **kwargs):
            raise AssertionError("no temporary folder, transfer or module is needed")

        action._low_level_execute_command = execute  # type: ignore[method-assign]
        action._make_tmp_path = refused  # type: ignore[method-assign]
        action._transfer_data = refused  # type: ignore[method-assign]
        action._execute_module = refused  # type: ignore[method-assign]
        return action

    def run(self, check_mode: bool = False, environment: list | None = None, **args) -> dict:
        return self.action(args, check_mode, environment).run(task_vars={"inventory_hostname": "node-a"})


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path)


def test_the_preflight_searches_decides_and_offers_its_findings_in_one_command(node):
    node.install(BINARIES["docker"])
    node.install(BINARIES["containerd"], 'disabled_plugins = ["cri"]\n')
    node.install_nvidia()
    found = node.run(state="present", hand_over=True)
    assert not found.get("failed"), found
    assert found["changed"] is False
    assert (found["installed"], found["engines"], found["searched"]) == (["docker", "containerd"], ["docker"], True)
    assert found["handover"] == {"engines": [], "state": "present"}
    assert len(node.commands) == 1


def test_the_next_run_takes_the_findings_over_once_and_looks_for_nvidia_container_runtime_again(node):
    node.install(BINARIES["containerd"])
    preflight = node.run(state="present", hand_over=True, require_nvidia_runtime=False)
    assert not preflight.get("failed"), preflight
    # The toolkit step has not installed it: the batch run refuses, without searching again.
    node.commands.clear()
    node.install(BINARIES["docker"])  # installed since: a search would find it
    refused = node.run(state="present", found=preflight)
    assert refused["failed"] is True
    assert refused["msg"].startswith(f"{node.nvidia} does not exist or is not executable on node-a. Install the NVIDIA")
    assert len(node.commands) == 1 and BINARIES["docker"] not in node.commands[0]

    node.install_nvidia()
    batch = node.run(state="present", found=preflight)
    assert not batch.get("failed"), batch
    assert (batch["installed"], batch["engines"], batch["searched"]) == (["containerd"], ["containerd"], False)
    assert batch["start"] == preflight["start"]
    assert batch["handover"] == {}

    # Spent: the run after it (a drain window's) searches again and finds docker.
    again = node.run(state="present", found=batch)
    assert (again["installed"], again["searched"]) == (["docker", "containerd"], True)
    assert again["start"] != preflight["start"]


def test_a_run_that_takes_over_and_needs_no_nvidia_check_sends_no_command(node):
    node.install(BINARIES["containerd"])
    preflight = node.run(state="absent", hand_over=True)
    node.commands.clear()
    batch = node.run(state="absent", found=preflight)
    assert not batch.get("failed"), batch
    assert batch["engines"] == ["containerd"] and node.commands == []


def test_findings_made_from_other_inputs_are_not_taken_over(node):
    node.install(BINARIES["containerd"])
    preflight = node.run(state="absent", hand_over=True)
    refused = node.run(state="absent", engines=["docker"], found=preflight)
    assert refused["failed"] is True
    assert refused["msg"] == (
        "container_runtime_engines names docker, which is not installed on node-a (installed: containerd). Install it "
        "first, or leave it out of container_runtime_engines."
    )


def test_every_problem_is_named_in_one_message(node):
    refused = node.run(state="present", hand_over=True)
    assert refused["failed"] is True
    assert refused["msg"].startswith("No container runtime (dockerd, containerd, crio) was found on node-a. ")
    assert f" {node.nvidia} does not exist or is not executable on node-a." in refused["msg"]


def test_a_boolean_given_as_a_string_is_read_as_one(node):
    node.install(BINARIES["containerd"])
    found = node.run(state="present", hand_over=True, require_nvidia_runtime="false")
    assert not found.get("failed"), found
    assert found["engines"] == ["containerd"]


def test_check_mode_reads_the_same(node):
    node.install(BINARIES["containerd"])
    node.install_nvidia()
    found = node.run(check_mode=True, state="present", hand_over=True)
    assert not found.get("failed"), found
    assert (found["changed"], found["engines"]) == (False, ["containerd"])
    assert len(node.commands) == 1


def test_the_task_environment_reaches_the_search(node, tmp_path):
    # A binary only on a PATH the task's `environment` sets, as a module run by the task would see it.
    elsewhere = tmp_path / "opt"
    elsewhere.mkdir()
    binary = elsewhere / BINARIES["cri-o"]
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    path = f"{elsewhere}{os.pathsep}/usr/bin:/bin"
    found = node.run(state="absent", hand_over=True, environment=[{"PATH": path}])
    assert found["installed"] == ["cri-o"], found
    assert node.run(state="absent", hand_over=True)["installed"] == []


def test_an_answer_cut_off_fails_with_what_the_node_said(node):
    action = node.action({"state": "absent", "hand_over": True})
    action._low_level_execute_command = lambda cmd, sudoable=True, in_data=None: {  # type: ignore[method-assign]
        "rc": 0,
        "stdout": "found 0\r\n",
        "stderr": "",
    }
    failed = action.run(task_vars={"inventory_hostname": "node-a"})
    assert failed["failed"] is True and "cut off" in failed["msg"]
