"""tools/contract/booleans.py: every boolean is read as a boolean wherever it is used."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

from contract import booleans

FLAGS = {"demo_reload", "demo_default"}


def _wrong(text: str, bare: bool = False, bool_option: bool = False) -> list[str]:
    tree = booleans.parse(text, bare)
    assert tree is not None
    return list(booleans.wrong_uses(tree, FLAGS, bool_option))


@pytest.mark.parametrize(
    ("text", "bare", "bool_option"),
    [
        ("demo_reload | bool", True, False),
        ("not demo_reload | bool", True, False),
        ("demo_reload | default(true) | bool and other", True, False),
        ("demo_default is none", True, False),
        ("demo_default is not defined or demo_default | bool", True, False),
        ("{{ demo_reload }}", False, True),
        ("{{ demo_reload | default(false) }}", False, True),
        ("{{ demo_default if demo_default is not none else omit }}", False, True),
        ("{% if demo_default | bool %}x{% endif %}", False, False),
        ("{{ other_reload }}", False, False),
    ],
)
def test_reads_as_a_boolean_pass(text, bare, bool_option):
    assert _wrong(text, bare, bool_option) == []


@pytest.mark.parametrize(
    ("text", "bare", "bool_option"),
    [
        # The two: `-e container_runtime_docker_reload=false` and `_nvidia_default=false` read as true.
        ("{{ demo_reload and reloadable }}", False, False),
        ("{{ content | kubegpu.node.docker_daemon_config(nvidia_default=demo_default) }}", False, False),
        ("demo_reload", True, False),  # ansible-core 2.19 refuses the string "false" as a condition
        ("not demo_reload", True, False),
        ("{% if demo_default %}default_runtime{% endif %}", False, False),
        ("{{ demo_reload }}", False, False),  # passed on (set_fact, another role's vars) without | bool
        ("{{ demo_reload | ternary('a', 'b') }}", False, False),
        ("{{ demo_reload and x }}", False, True),  # a bool option converts the whole value, not a part of it
        ("{{ demo_reload | default(true) }} and more", False, True),
    ],
)
def test_other_reads_are_refused(text, bare, bool_option):
    assert _wrong(text, bare, bool_option), text


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (tmp_path / "playbooks").mkdir(exist_ok=True)
    return tmp_path


def _types(module: str, option: str) -> str | None:
    return {("ansible.builtin.systemd_service", "enabled"): "bool"}.get((module, option))


def test_tasks_templates_and_vars_are_all_read(tmp_path):
    root = _tree(
        tmp_path,
        {
            "roles/demo/tasks/main.yml": """
                - name: Enable it
                  ansible.builtin.systemd_service:
                    name: demo
                    enabled: "{{ demo_reload }}"
                - name: Condition
                  ansible.builtin.debug:
                    msg: hi
                  when: demo_reload
                - name: Assert
                  ansible.builtin.assert:
                    that:
                      - demo_default | bool
                      - demo_default
                - name: Pass it on
                  ansible.builtin.include_role:
                    name: other
                  vars:
                    other_flag: "{{ demo_default }}"
            """,
            "roles/demo/templates/x.j2": "{% if demo_default %}on{% endif %}\n",
            "roles/demo/vars/main.yml": '__demo_x: "{{ demo_reload and 1 }}"\n',
        },
    )
    problems = booleans.check(root, FLAGS, _types)
    assert len(problems) == 5, problems
    where = [p.split(": ", 2)[:2] for p in problems]
    assert ["roles/demo/tasks/main.yml", "Condition"] in where
    assert ["roles/demo/tasks/main.yml", "Assert"] in where
    assert ["roles/demo/tasks/main.yml", "Pass it on"] in where
    assert any(p.startswith("roles/demo/templates/x.j2: demo_default") for p in problems)
    assert any(p.startswith("roles/demo/vars/main.yml: __demo_x: demo_reload") for p in problems)
    assert not any("Enable it" in p for p in problems)


def test_the_module_documentation_gives_the_option_type():
    options = booleans.ModuleOptions(None)
    assert options("ansible.builtin.systemd_service", "enabled") == "bool"
    assert options("ansible.builtin.systemd_service", "name") == "str"
    assert options("ansible.builtin.set_fact", "anything") is None
