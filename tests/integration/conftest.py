"""The integration harness: inventories, the environment and ansible-playbook runs, for every test in this folder.

A test asks for the `ansible` fixture (skipped where ansible-playbook is not on PATH), writes an inventory of hosts
reached with the local connection, and runs a playbook:

    def test_x(ansible):
        inventory = ansible.inventory({"gpu-a": {}}, kubegpu_kubeconfig=kubeconfig)
        run = ansible.playbook(ansible.site, "--tags", "labels", inventory=inventory)
        assert run.returncode == 0, run.output
        assert run.unchanged(["gpu-a"]) == []

The hosts are this machine: the role chain is turned off twice (the kubegpu_<step> switches here, and the chain's
tags skipped by `playbook(..., skip_chain=True)`, the default), so that no role ever configures the machine that runs
the tests. A test of the chain's own checks passes chain=True and skip_chain=False and must fail before any change.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_recap import parse_recap, problems

REPO = Path(__file__).resolve().parents[2]
SITE = REPO / "playbooks" / "site.yml"

# The role chain's steps: site.yml's switch for each, and the tag of each.
CHAIN_STEPS = ("nvidia_driver", "nvidia_container_toolkit", "container_runtime", "kubelet")
CHAIN_OFF = {f"kubegpu_{step}": False for step in CHAIN_STEPS}
CHAIN_TAGS = ",".join(CHAIN_STEPS)


@dataclass(frozen=True)
class PlaybookRun:
    """One ansible-playbook run: its exit status, its output and its recap."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        return parse_recap(self.stdout)

    def unchanged(self, hosts: Iterable[str] | None = None) -> list[str]:
        """Why the run was not a no-op, per host ([] when every host is in the recap, unchanged, not failed)."""
        return problems(self.recap, hosts)


class Ansible:
    """Inventories and runs in one test's folder."""

    repo = REPO
    site = SITE
    chain_tags = CHAIN_TAGS

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def inventory(
        self,
        hosts: Mapping[str, Mapping[str, Any]],
        *,
        group: str = "gpu_nodes",
        chain: bool = False,
        name: str = "inventory.yml",
        **variables: Any,
    ) -> Path:
        """An inventory of `hosts` in `group`, reached with the local connection, the role chain off unless chain."""
        common: dict[str, Any] = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            # The plays ask for become; these hosts are this machine, already root or not, without sudo.
            "ansible_become": False,
        }
        if not chain:
            common.update(CHAIN_OFF)
        common.update(variables)
        inventory = {"all": {"children": {group: {"hosts": {h: dict(v) for h, v in hosts.items()}}}, "vars": common}}
        path = self.workdir / name
        path.write_text(yaml.safe_dump(inventory, sort_keys=False))
        return path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a run: this checkout's collection first, plain output, TMPDIR in the test's folder.

        TMPDIR is `tmp` in the test's folder: what a run leaves in the temporary folder stays with the test's other
        files in pytest's folder (which keeps the last three runs'), not loose in /tmp: kubernetes.core's discovery
        cache (a file per API server, and each test starts its own), and the module payloads that a run killed by
        SIGKILL leaves.
        """
        tmpdir = self.workdir / "tmp"
        tmpdir.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update(
            TMPDIR=str(tmpdir),
            ANSIBLE_COLLECTIONS_PATH=os.environ.get("ANSIBLE_COLLECTIONS_PATH") or str(REPO / ".tmp" / "collections"),
            ANSIBLE_NOCOLOR="true",
            ANSIBLE_FORCE_COLOR="false",
            ANSIBLE_STDOUT_CALLBACK="default",
            ANSIBLE_LOCALHOST_WARNING="false",
            ANSIBLE_RETRY_FILES_ENABLED="false",
        )
        env.update(extra)
        return env

    def command(
        self,
        playbook: Path | str,
        *args: str,
        inventory: Path | None = None,
        env: Mapping[str, str] | None = None,
        skip_chain: bool = True,
    ) -> tuple[list[str], dict[str, str]]:
        """The ansible-playbook command line and environment; skip_chain adds `--skip-tags` for the chain's tags."""
        argv = ["ansible-playbook", str(playbook)]
        if inventory is not None:
            argv += ["-i", str(inventory)]
        if skip_chain:
            argv += ["--skip-tags", CHAIN_TAGS]
        return [*argv, *args], self.env(**(env or {}))

    def run(self, argv: list[str], env: Mapping[str, str], timeout: int = 300) -> PlaybookRun:
        """Run a command from command() in the test's folder and wait for it."""
        completed = subprocess.run(
            argv, capture_output=True, text=True, env=dict(env), timeout=timeout, check=False, cwd=self.workdir
        )
        return PlaybookRun(completed.returncode, completed.stdout, completed.stderr)

    def start(
        self, argv: list[str], env: Mapping[str, str], log: Path, *, own_session: bool = False
    ) -> subprocess.Popen:
        """Start a command from command() in the test's folder, its output to log (several runs at once, a cancel).

        own_session starts it in a session and process group of its own, so that a test can signal that group
        (os.killpg) the way AWX cancels a job.
        """
        with log.open("w") as stream:
            return subprocess.Popen(
                argv,
                stdout=stream,
                stderr=subprocess.STDOUT,
                text=True,
                env=dict(env),
                cwd=self.workdir,
                start_new_session=own_session,
            )

    def playbook(
        self,
        playbook: Path | str,
        *args: str,
        inventory: Path | None = None,
        env: Mapping[str, str] | None = None,
        skip_chain: bool = True,
        timeout: int = 300,
    ) -> PlaybookRun:
        """Run ansible-playbook in the test's folder and wait for it."""
        argv, environment = self.command(playbook, *args, inventory=inventory, env=env, skip_chain=skip_chain)
        return self.run(argv, environment, timeout=timeout)


@pytest.fixture
def ansible(tmp_path: Path) -> Ansible:
    if shutil.which("ansible-playbook") is None:
        pytest.skip("ansible-playbook is not on PATH")
    return Ansible(tmp_path)
