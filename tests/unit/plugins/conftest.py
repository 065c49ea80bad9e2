# Copyright: contributors to the kubegpu.node collection
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures shared by the plugin tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[2]


ROOT = TESTS.parent


def _build(tmp_path_factory, spec: str) -> tuple[Path, dict[str, str]]:
    out = tmp_path_factory.mktemp("aptrepo") / "root"
    said = subprocess.run(
        [sys.executable, "-m", "aptrepo", "build", str(TESTS / "aptrepo/specs" / spec), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TESTS)},
        check=False,
    )
    assert said.returncode == 0, said.stderr
    return out, json.loads(said.stdout)


@pytest.fixture(scope="session")
def cuda_repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The signed stand-in of NVIDIA's CUDA repository (tests/aptrepo/specs/cuda-driver.yml), built once: its root
    (good/, wrong-key/, good/later/, good.asc, wrong.asc) and keys.json."""
    return _build(tmp_path_factory, "cuda-driver.yml")


@pytest.fixture(scope="session")
def toolkit_repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The signed stand-in of NVIDIA's Container Toolkit repository (specs/nvidia-container-toolkit.yml), built once."""
    return _build(tmp_path_factory, "nvidia-container-toolkit.yml")


@pytest.fixture
def run_action(tmp_path):
    """Runs one task of an action with ansible-playbook against this machine (connection local, after a minimal fact
    gathering) and returns its result as the JSON callback reports it."""

    def run(action: str, args: dict, check: bool = False) -> dict:
        playbook = tmp_path / "action.yml"
        tasks = [{"ansible.builtin.setup": {"gather_subset": ["min"]}}, {action: args, "ignore_errors": True}]
        playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
        said = subprocess.run(
            [
                "ansible-playbook",
                "-c",
                "local",
                "-i",
                "localhost,",
                "-e",
                f"ansible_python_interpreter={sys.executable}",
            ]
            + (["--check"] if check else [])
            + [str(playbook)],
            capture_output=True,
            text=True,
            env={**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "ANSIBLE_LOCALHOST_WARNING": "false"},
            cwd=ROOT,
            check=False,
        )
        return json.loads(said.stdout)["plays"][0]["tasks"][1]["hosts"]["localhost"]

    return run
