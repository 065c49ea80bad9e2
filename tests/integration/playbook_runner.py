"""Run a playbook of the collection against hosts reached with the local connection, as the site.yml tests do.

The inventory puts the hosts in `gpu_nodes` and turns the role chain off twice over (its variables here, and the
callers skip its tags where they can): the chain must never run on this machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE_CHAIN_OFF = {
    "kubegpu_nvidia_driver": False,
    "kubegpu_nvidia_container_toolkit": False,
    "kubegpu_container_runtime": False,
    "kubegpu_kubelet": False,
}


def playbook_command(
    playbook: Path, tmp_path: Path, hosts: dict, variables: dict[str, Any], *args: str
) -> tuple[list[str], dict[str, str]]:
    """The ansible-playbook command line and environment; the inventory is written to tmp_path/inventory.yml."""
    inventory = {
        "all": {
            "children": {"gpu_nodes": {"hosts": hosts}},
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                **ROLE_CHAIN_OFF,
                **variables,
            },
        }
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=os.environ.get("ANSIBLE_COLLECTIONS_PATH") or str(REPO / ".tmp" / "collections"),
        ANSIBLE_NOCOLOR="true",
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    return ["ansible-playbook", str(playbook), "-i", str(tmp_path / "inventory.yml"), *args], env


def run_playbook(
    playbook: Path, tmp_path: Path, hosts: dict, variables: dict[str, Any], *args: str
) -> subprocess.CompletedProcess:
    command, env = playbook_command(playbook, tmp_path, hosts, variables, *args)
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path)
