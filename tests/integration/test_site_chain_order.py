"""site.yml's batch runs the steps of the role chain that kubegpu.node.chain_plan picked, in chain order on every host
(playbooks/tasks/chain.yml), whatever the other hosts of the batch run.

A looped include_role over each host's list ran them out of order: Ansible merges the included roles of one looped
task across the hosts and runs them in the order it first met them, so a host that needed the whole chain beside one
that needed only its last steps ran those first (the toolkit's CDI check before its driver, the runtime's check for
nvidia-container-runtime before the toolkit). Here a throwaway collection `kubegpu.node` holds stand-in roles of the
four names, each noting its name for the host, and the real playbooks/tasks/chain.yml includes them.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

CHAIN = ["nvidia_driver", "nvidia_container_toolkit", "container_runtime", "kubelet"]

STEP = """\
---
- name: Note the step
  ansible.builtin.shell:
    cmd: echo {role} >>{out}/{{{{ inventory_hostname }}}}
  changed_when: false
"""


def _collection(root: Path, out: Path) -> Path:
    node = root / "ansible_collections" / "kubegpu" / "node"
    (node / "roles").mkdir(parents=True)
    (node / "galaxy.yml").write_text(
        "namespace: kubegpu\nname: node\nversion: 0.0.1\nreadme: README.md\nauthors: [t]\n"
    )
    for role in CHAIN:
        (node / "roles" / role / "tasks").mkdir(parents=True)
        (node / "roles" / role / "tasks" / "main.yml").write_text(STEP.format(role=role, out=out))
    return root


@pytest.mark.parametrize(
    "lists",
    [
        # The host that needs the whole chain comes after one that needs only its end, and the other way round.
        {"needs-end": CHAIN[2:], "needs-all": CHAIN},
        {"needs-all": CHAIN, "needs-end": CHAIN[1:], "needs-one": ["kubelet"], "needs-none": []},
    ],
)
def test_each_host_runs_its_steps_in_chain_order_beside_hosts_with_other_steps(ansible, lists):
    out = ansible.workdir / "order"
    out.mkdir()
    collections = _collection(ansible.workdir / "collections", out)
    playbook = ansible.workdir / "batch.yml"
    chain = ansible.repo / "playbooks" / "tasks" / "chain.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "gpu_nodes",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Run the steps of the role chain that have anything to do",
                            "ansible.builtin.include_tasks": {"file": str(chain)},
                            "when": "__kubegpu_chain.include | default([]) | length > 0",
                        }
                    ],
                }
            ]
        )
    )
    hosts = {host: {"__kubegpu_chain": {"include": steps}} for host, steps in lists.items()}
    inventory = ansible.inventory(hosts, __kubegpu_require_nvidia_runtime=True)
    run = ansible.playbook(
        playbook,
        "--forks",
        str(len(hosts)),
        inventory=inventory,
        env={"ANSIBLE_COLLECTIONS_PATH": str(collections)},
        skip_chain=False,
    )
    assert run.returncode == 0, run.output
    for host, steps in lists.items():
        noted = out / host
        ran = noted.read_text().split() if noted.exists() else []
        assert ran == steps, textwrap.shorten(f"{host}: {ran} {run.output}", 2000)
