# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

# The decisions of the container_runtime role's checks; the node's script runs here in this machine's sh, against
# stand-in binaries in a temporary PATH. tests/integration/test_container_runtime_handover.py runs the role.

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from ansible_collections.kubegpu.node.plugins.plugin_utils import _container_runtime_checks as rc

BINARIES = {"docker": "dockerd", "containerd": "containerd", "cri-o": "crio"}
# Docker CE's containerd.io: /etc/containerd/config.toml disables the CRI plugin, `config dump` prints it back
# (containerd 1.6 names it "cri", 1.7 the plugin's full ID).
DOCKER_CE_DUMP = 'version = 2\nroot = "/var/lib/containerd"\ndisabled_plugins = ["cri"]\n[grpc]\n  address = "x"\n'


def _standin(folder: Path, name: str, output: str = "") -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n[ \"$1 $2\" = 'config dump' ] && printf '%s' {shlex.quote(output)}\nexit 0\n")
    path.chmod(0o755)


def _node(folder: Path, argv: list[str]) -> str:
    """The script as NodeAction.command sends it (each word quoted), in sh with only the stand-ins on the PATH."""
    done = subprocess.run(
        ["sh", "-c", shlex.join(argv)],
        capture_output=True,
        text=True,
        env={"PATH": f"{folder}{os.pathsep}/usr/bin:/bin"},
        check=True,
    )
    return done.stdout


@pytest.fixture
def node(tmp_path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    return folder


def test_the_script_finds_each_binary_and_reads_docker_ce_containerd_disabled_cri(node):
    _standin(node, "dockerd")
    _standin(node, "containerd", DOCKER_CE_DUMP)
    read = rc.parse_node(_node(node, rc.node_argv(BINARIES, "containerd", "")), BINARIES)
    assert read == rc.NodeRead(("docker", "containerd"), ('disabled_plugins = ["cri"]',), None)
    assert rc.cri_disabled(read.disabled_plugins)
    assert rc.engines_to_configure([], read.installed, True) == ["docker"]


def test_the_dump_is_not_read_when_engines_are_given(node):
    _standin(node, "containerd", DOCKER_CE_DUMP)
    read = rc.parse_node(_node(node, rc.node_argv(BINARIES, "", "")), BINARIES)
    assert read == rc.NodeRead(("containerd",), (), None)


def test_nothing_installed(node):
    read = rc.parse_node(_node(node, rc.node_argv(BINARIES, "containerd", "")), BINARIES)
    assert read == rc.NodeRead((), (), None)


def test_installed_follows_the_binaries_table_not_the_search_order(node):
    _standin(node, "crio")
    _standin(node, "dockerd")
    read = rc.parse_node(_node(node, rc.node_argv(BINARIES, "", "")), BINARIES)
    assert read.installed == ("docker", "cri-o")


@pytest.mark.parametrize(
    ("make", "ok"),
    [
        ("executable", True),
        ("not executable", False),
        ("missing", False),
        ("link to executable", True),
        ("dangling link", False),
    ],
)
def test_nvidia_container_runtime_must_exist_and_be_executable(tmp_path, node, make, ok):
    path = tmp_path / "nvidia-container-runtime"
    target = tmp_path / "real"
    if make in ("executable", "not executable"):
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755 if make == "executable" else 0o644)
    elif make == "dangling link":
        path.symlink_to(target)
    elif make == "link to executable":
        target.write_text("#!/bin/sh\n")
        target.chmod(0o755)
        path.symlink_to(target)
    read = rc.parse_node(_node(node, rc.nvidia_argv(str(path))), {})
    assert read == rc.NodeRead((), (), ok)


def test_a_path_with_spaces_and_quotes_reaches_the_node_as_one_word(tmp_path, node):
    path = tmp_path / "it's a runtime"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    assert rc.parse_node(_node(node, rc.nvidia_argv(str(path))), {}).nvidia_runtime_ok is True


def test_a_terminal_s_line_ends_are_read():
    said = "found 1\r\ndisabled_plugins = []\r\nnvidia missing\r\ndone\r\n"
    assert rc.parse_node(said, BINARIES) == rc.NodeRead(("containerd",), ("disabled_plugins = []",), False)


@pytest.mark.parametrize(
    "said",
    ["", "found 0\n", "found 0\nnvidia executable\n", "Welcome to the node\nfound 0\ndone\n", "found 7\ndone\n"],
    ids=["nothing", "cut off", "cut before done", "a banner", "an unknown runtime"],
)
def test_an_answer_that_is_not_the_script_s_is_an_error(said):
    with pytest.raises(rc.NodeAnswerError):
        rc.parse_node(said, BINARIES)


@pytest.mark.parametrize(
    ("lines", "disabled"),
    [
        (['disabled_plugins = ["cri"]'], True),
        (['disabled_plugins = ["io.containerd.grpc.v1.cri"]'], True),
        (['disabled_plugins = ["io.containerd.internal.v1.restart", "cri"]'], True),
        (["disabled_plugins = []"], False),
        (['disabled_plugins = ["io.containerd.snapshotter.v1.aufs"]'], False),
        (['disabled_plugins = ["cri-something"]'], False),
        # containerd 2.x's config dump writes TOML strings in single quotes (go-toml v2)
        (["disabled_plugins = ['io.containerd.grpc.v1.cri']"], True),
        (["disabled_plugins = ['io.containerd.internal.v1.restart', 'io.containerd.grpc.v1.cri']"], True),
        (["disabled_plugins = ['io.containerd.snapshotter.v1.aufs']"], False),
        (["disabled_plugins = ['cri\"]"], False),
        ([], False),
    ],
)
def test_the_cri_plugin_disabled(lines, disabled):
    assert rc.cri_disabled(lines) is disabled


def test_engines_given_are_configured_as_given_even_docker_ce_containerd():
    assert rc.engines_to_configure(["containerd"], ["docker", "containerd"], True) == ["containerd"]
    assert rc.engines_to_configure([], ["docker", "containerd"], False) == ["docker", "containerd"]


HOST = "node-a"
NVIDIA = "/usr/bin/nvidia-container-runtime"
NOT_INSTALLED = (
    "container_runtime_engines names docker, cri-o, which is not installed on node-a (installed: containerd). Install "
    "it first, or leave it out of container_runtime_engines."
)
NO_RUNTIME = (
    "No container runtime (dockerd, containerd, crio) was found on node-a. Install one first, or set "
    "container_runtime_engines."
)
NO_NVIDIA = (
    "/usr/bin/nvidia-container-runtime does not exist or is not executable on node-a. Install the NVIDIA Container "
    "Toolkit first (role kubegpu.node.nvidia_container_toolkit), point container_runtime_nvidia_runtime_path at the "
    "binary, or set container_runtime_require_nvidia_runtime to false."
)


def test_each_refusal_has_its_message_and_they_come_in_order():
    # Each runtime missing named once, in the order given.
    asked = ["docker", "containerd", "cri-o", "docker"]
    assert rc.problems(HOST, "present", asked, ["containerd"], True, NVIDIA, False) == [NOT_INSTALLED, NO_NVIDIA]
    assert rc.problems(HOST, "present", [], [], True, NVIDIA, False) == [NO_RUNTIME, NO_NVIDIA]
    none_installed = rc.problems(HOST, "present", ["docker"], [], False, NVIDIA, None)
    expected = NOT_INSTALLED.replace("docker, cri-o", "docker").replace("(installed: containerd)", "(installed: none)")
    assert none_installed == [expected]


@pytest.mark.parametrize(
    ("state", "require", "nvidia_ok", "refused"),
    [
        ("present", True, True, False),
        ("present", True, False, True),
        ("present", False, None, False),
        ("absent", True, None, False),
    ],
)
def test_nvidia_container_runtime_is_checked_only_when_present_and_required(state, require, nvidia_ok, refused):
    assert rc.nvidia_required(state, require) is (state == "present" and require)
    assert bool(rc.problems(HOST, state, ["containerd"], ["containerd"], require, NVIDIA, nvidia_ok)) is refused


def test_state_absent_with_no_runtime_is_no_problem():
    assert rc.problems(HOST, "absent", [], [], True, NVIDIA, None) == []


def test_a_hand_over_is_taken_only_for_the_same_inputs_and_only_once():
    offered = {"installed": ["containerd"], "engines": ["containerd"], "handover": rc.hand_over([], "present")}
    assert rc.takes_over(offered, [], "present")
    assert not rc.takes_over(offered, ["containerd"], "present")
    assert not rc.takes_over(offered, [], "absent")
    assert not rc.takes_over({**offered, "handover": {}}, [], "present")  # spent: the batch run's own result
    assert not rc.takes_over({}, [], "present")  # the role's first run
    assert not rc.takes_over({"failed": True, "msg": "refused"}, [], "present")  # a refused preflight offers nothing
